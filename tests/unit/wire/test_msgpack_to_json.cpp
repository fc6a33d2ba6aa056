// msgpack -> JSON (common/wire/msgpack_to_json.*), and a round-trip property test over
// pseudo-random JSON documents: json_to_msgpack -> msgpack_to_json gives back the canonical
// compact form of each document.

#include <doctest/doctest.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_codec.hpp"
#include "common/wire/msgpack_to_json.hpp"
#include "tests/unit/wire/hex.hpp"

using namespace vllmd::wire;
using vllmd::test::from_hex;
using vllmd::test::msgpack_c_repack;
using vllmd::test::SplitMix64;
using vllmd::test::to_hex;

namespace {

std::string to_json(std::string_view hex, const DecodeLimits& limits = {}) {
  auto json = msgpack_to_json(from_hex(hex), limits);
  REQUIRE_MESSAGE(json.has_value(), (json ? std::string() : json.error()));
  return *json;
}

}  // namespace

// ==================================================================================== scalars

TEST_CASE("msgpack_to_json scalars") {
  CHECK(to_json("c0") == "null");
  CHECK(to_json("c3") == "true");
  CHECK(to_json("c2") == "false");
  CHECK(to_json("00") == "0");
  CHECK(to_json("7f") == "127");
  CHECK(to_json("cc80") == "128");
  CHECK(to_json("cd733c") == "29500");
  CHECK(to_json("ff") == "-1");
  CHECK(to_json("e0") == "-32");
  CHECK(to_json("d080") == "-128");
  CHECK(to_json("cfffffffffffffffff") == "18446744073709551615");
  CHECK(to_json("cf8000000000000000") == "9223372036854775808");
  CHECK(to_json("d38000000000000000") == "-9223372036854775808");
  CHECK(to_json("d3ffffffffffffffff") == "-1");
  CHECK(to_json("d30000000000000005") == "5");  // non-minimal, still an integer
}

TEST_CASE("msgpack_to_json floats stay floats") {
  CHECK(to_json("cb3ff0000000000000") == "1.0");
  CHECK(to_json("cb3ff8000000000000") == "1.5");
  CHECK(to_json("cb0000000000000000") == "0.0");
  CHECK(to_json("cb8000000000000000") == "-0.0");
  CHECK(to_json("cb40934a0000000000") == "1234.5");
  CHECK(to_json("cb3fb999999999999a") == "0.1");
  CHECK(to_json("cb7e37e43c8800759c") == "1e+300");
  CHECK(to_json("cb3ee4f8b588e368f1") == "1e-05");
  CHECK(to_json("cb4059000000000000") == "100.0");
  CHECK(to_json("cb0000000000000001") == "5e-324");
  CHECK(to_json("cb7fefffffffffffff") == "1.7976931348623157e+308");
  CHECK(to_json("ca3fc00000") == "1.5");                  // float32
  CHECK(to_json("ca3dcccccd") == "0.10000000149011612");  // float32 0.1, widened exactly
  CHECK(to_json("ca4b000000") == "8388608.0");
  // JSON has no NaN or infinities.
  CHECK(to_json("cb7ff8000000000000") == "null");
  CHECK(to_json("cb7ff0000000000000") == "null");
  CHECK(to_json("cbfff0000000000000") == "null");
  CHECK(to_json("ca7fc00000") == "null");
  // Read back, every float text is a float again.
  for (std::string_view hex : {"cb3ff0000000000000", "cb8000000000000000", "cb4059000000000000",
                               "cb7e37e43c8800759c", "cb0000000000000001"}) {
    CAPTURE(hex);
    auto again = json_to_msgpack(to_json(hex));
    REQUIRE(again.has_value());
    CHECK(again->root == JsonKind::kFloat);
    CHECK(to_hex(again->msgpack.view()) == hex);
  }
}

TEST_CASE("msgpack_to_json strings") {
  CHECK(to_json("a0") == R"("")");
  CHECK(to_json("a3616263") == R"("abc")");
  CHECK(to_json("a3225c2f") == R"("\"\\/")");  // '/' is not escaped
  CHECK(to_json("a7080c0a0d09011f") == R"("\b\f\n\r\t\u0001\u001f")");
  CHECK(to_json("a100") == R"("\u0000")");
  CHECK(to_json("a11b") == R"("\u001b")");
  CHECK(to_json("a17f") == "\"\x7f\"");
  CHECK(to_json("a2c3a9") == "\"\xc3\xa9\"");
  CHECK(to_json("a4f09f9880") == "\"\xf0\x9f\x98\x80\"");
  CHECK(to_json("d920" + to_hex(std::string(32, 'x'))) == "\"" + std::string(32, 'x') + "\"");
  CHECK(to_json("c403616263") == R"("abc")");  // bin renders as its bytes
  CHECK(to_json("c4020a22") == R"("\n\"")");
}

TEST_CASE("msgpack_to_json containers") {
  CHECK(to_json("90") == "[]");
  CHECK(to_json("80") == "{}");
  CHECK(to_json("9301a161c0") == R"([1,"a",null])");
  CHECK(to_json("82a1619201"
                "81a162c0"
                "a163c3") == R"({"a":[1,{"b":null}],"c":true})");
  CHECK(to_json("dc0010" + std::string(32, '0')) == "[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]");
  CHECK(to_json("9191919190") == "[[[[[]]]]]");
  // The section 7 INIT map.
  CHECK(
      to_json("82a961646472657373657385a6696e7075747391b47463703a2f2f3132372e302e302e313a3535"
              "3535a76f7574707574739"
              "1b47463703a2f2f3132372e302e302e313a35353536b1636f6f726469"
              "6e61746f725f696e707574c0b2636f6f7264696e61746f725f6f7574707574c0be66726f6e74656e"
              "645f73746174735f7075626c6973685f61646472657373c0af706172616c6c656c5f636f6e666967"
              "80") ==
      R"({"addresses":{"inputs":["tcp://127.0.0.1:5555"],"outputs":["tcp://127.0.0.1:5556"],)"
      R"("coordinator_input":null,"coordinator_output":null,"frontend_stats_publish_address":null},)"
      R"("parallel_config":{}})");
  // Duplicate keys are all written, in order.
  CHECK(to_json("82a16101a16102") == R"({"a":1,"a":2})");
}

TEST_CASE("msgpack_to_json non-string map keys become strings") {
  CHECK(to_json("8101a161") == R"({"1":"a"})");
  CHECK(to_json("81ff01") == R"({"-1":1})");
  CHECK(to_json("81cfffffffffffffffff01") == R"({"18446744073709551615":1})");
  CHECK(to_json("81c001") == R"({"null":1})");
  CHECK(to_json("81c301") == R"({"true":1})");
  CHECK(to_json("81cb3ff800000000000001") == R"({"1.5":1})");
  CHECK(to_json("819201a16101") == R"({"[1,\"a\"]":1})");
  CHECK(to_json("818001") == R"({"{}":1})");
  // A bin key is rendered like any other non-string key: its JSON text, quoted. Still valid JSON.
  const std::string bin_key = to_json("81c4026b7901");
  CHECK(bin_key.find("ky") != std::string::npos);
  CHECK(json_to_msgpack(bin_key).has_value());
  CHECK(to_json("81a1220a") == R"({"\"":10})");  // string keys are escaped normally
}

TEST_CASE("msgpack_to_json ext and errors") {
  CHECK(to_json("d40100") == "null");      // fixext 1
  CHECK(to_json("c70201abcd") == "null");  // ext 8
  CHECK(to_json("92d40100c3") == "[null,true]");

  for (std::string_view hex : {"", "91", "92c0", "a3616263c0", "c0c0", "c1", "dbffffffff",
                               "ddffffffff", "d9", "cb3ff0", "8281a16102a3"}) {
    CAPTURE(hex);
    CHECK_FALSE(msgpack_to_json(from_hex(hex)).has_value());
  }
  // Deeply nested input is refused by the decode limits rather than recursed into.
  const std::string deep = std::string(10000, '\x91') + '\xc0';
  CHECK_FALSE(msgpack_to_json(deep).has_value());
  CHECK(msgpack_to_json(std::string(60, '\x91') + '\xc0').has_value());
  DecodeLimits limits;
  limits.depth = 2;
  CHECK(to_json("9191c0", limits) == "[[null]]");
  CHECK_FALSE(msgpack_to_json(from_hex("919191c0"), limits).has_value());
  limits = DecodeLimits{};
  limits.array = 2;
  CHECK_FALSE(msgpack_to_json(from_hex("93010203"), limits).has_value());
  limits = DecodeLimits{};
  limits.str = 2;
  CHECK_FALSE(msgpack_to_json(from_hex("a3616263"), limits).has_value());
}

TEST_CASE("append_json appends to what is there") {
  const std::string bytes = from_hex("92a178cb3ff0000000000000");  // must outlive the handle
  auto handle = decode(bytes);
  REQUIRE(handle.has_value());
  std::string out = "value=";
  append_json(out, handle->get());
  CHECK(out == R"(value=["x",1.0])");
}

// ========================================================================= round-trip property

namespace {

// Emits random JSON twice: `input` with arbitrary (valid) spellings, whitespace and escapes, and
// `canonical`, the compact form msgpack_to_json must produce for the same value.
class JsonGenerator {
 public:
  explicit JsonGenerator(std::uint64_t seed) : random_(seed) {}

  struct Member {
    std::string key;              // decoded UTF-8
    std::string canonical_value;  // compact JSON of the value
  };
  struct Document {
    std::string input;
    std::string canonical;
    std::vector<Member> members;  // when the root is an object
    bool object_root = false;
  };

  Document document() {
    Document doc;
    whitespace(doc.input);
    const std::uint64_t pick = random_.below(10);
    if (pick < 4) {
      doc.object_root = true;
      object(0, doc.input, doc.canonical, &doc.members);
    } else {
      value(0, doc.input, doc.canonical);
    }
    whitespace(doc.input);
    return doc;
  }

 private:
  static constexpr int kMaxDepth = 5;

  void whitespace(std::string& input) {
    if (!random_.chance(25)) return;
    static constexpr char kSpace[] = {' ', '\t', '\n', '\r'};
    const std::uint64_t count = 1 + random_.below(3);
    for (std::uint64_t i = 0; i < count; ++i) input.push_back(kSpace[random_.below(4)]);
  }

  void value(int depth, std::string& input, std::string& canonical) {
    const std::uint64_t pick = random_.below(depth < kMaxDepth ? 10 : 7);
    switch (pick) {
      case 0: literal(input, canonical); break;
      case 1:
      case 2: integer(input, canonical); break;
      case 3: floating(input, canonical); break;
      case 4:
      case 5:
      case 6: string(input, canonical, 40); break;
      case 7:
      case 8: array(depth + 1, input, canonical); break;
      default: object(depth + 1, input, canonical, nullptr); break;
    }
  }

  void literal(std::string& input, std::string& canonical) {
    static constexpr std::string_view kLiterals[] = {"null", "true", "false"};
    const std::string_view word = kLiterals[random_.below(3)];
    input += word;
    canonical += word;
  }

  void integer(std::string& input, std::string& canonical) {
    static constexpr std::int64_t kSigned[] = {0,
                                               1,
                                               -1,
                                               31,
                                               32,
                                               -32,
                                               -33,
                                               127,
                                               128,
                                               -128,
                                               -129,
                                               255,
                                               256,
                                               -32768,
                                               -32769,
                                               65535,
                                               65536,
                                               2147483647,
                                               -2147483648LL,
                                               -2147483649LL,
                                               4294967295LL,
                                               4294967296LL,
                                               std::numeric_limits<std::int64_t>::max(),
                                               std::numeric_limits<std::int64_t>::min()};
    std::string text;
    switch (random_.below(8)) {
      case 0: text = std::to_string(kSigned[random_.below(std::size(kSigned))]); break;
      case 1: text = std::to_string(random_.below(128)); break;
      case 2: text = std::to_string(-static_cast<std::int64_t>(random_.below(33))); break;
      case 3: text = std::to_string(random_.below(1ULL << (8 * (1 + random_.below(4))))); break;
      case 4: text = std::to_string(random_.next()); break;  // full uint64 range
      case 5: text = std::to_string(static_cast<std::int64_t>(random_.next())); break;
      case 6:
        text = std::to_string(-static_cast<std::int64_t>(
            random_.below(1ULL << (8 * (1 + random_.below(4)) - 1)) + 1));
        break;
      default: text = std::to_string(std::numeric_limits<std::uint64_t>::max() - random_.below(3));
    }
    canonical += text;
    if (text == "0" && random_.chance(20)) {
      input += "-0";  // an integer zero still
    } else {
      input += text;
    }
  }

  double random_double() {
    static constexpr double kSpecial[] = {0.0,
                                          -0.0,
                                          1.0,
                                          -1.0,
                                          0.1,
                                          0.5,
                                          1e300,
                                          1e-300,
                                          5e-324,
                                          2.2250738585072014e-308,
                                          1.7976931348623157e308,
                                          1e16,
                                          1e15,
                                          123456.0,
                                          9007199254740993.0,
                                          1234.5};
    switch (random_.below(4)) {
      case 0: return kSpecial[random_.below(std::size(kSpecial))];
      case 1: {
        double value = 0;
        do {
          const std::uint64_t bits = random_.next();
          std::memcpy(&value, &bits, sizeof value);
        } while (!std::isfinite(value));
        return value;
      }
      case 2:
        return static_cast<double>(static_cast<std::int64_t>(random_.below(2000001)) - 1000000) /
               static_cast<double>(1ULL << random_.below(20));
      default:
        return static_cast<double>(static_cast<std::int64_t>(random_.next() >> 11)) *
               std::pow(10.0, static_cast<double>(static_cast<int>(random_.below(61)) - 30));
    }
  }

  void floating(std::string& input, std::string& canonical) {
    const double value = random_double();
    char digits[64];
    auto [end, error] = std::to_chars(digits, digits + sizeof digits, value);
    REQUIRE(error == std::errc());
    std::string shortest(digits, end);
    if (shortest.find_first_of(".e") == std::string::npos) shortest += ".0";
    canonical += shortest;
    switch (random_.below(3)) {
      case 0: input += shortest; break;
      case 1: {
        auto [sci_end, sci_error] =
            std::to_chars(digits, digits + sizeof digits, value, std::chars_format::scientific);
        REQUIRE(sci_error == std::errc());
        std::string scientific(digits, sci_end);
        if (random_.chance(50)) scientific[scientific.find('e')] = 'E';
        input += scientific;
        break;
      }
      default: {
        // Full 17 significant digits: a different spelling of the same double.
        auto [exact_end, exact_error] =
            std::to_chars(digits, digits + sizeof digits, value, std::chars_format::scientific, 16);
        REQUIRE(exact_error == std::errc());
        input.append(digits, exact_end);
      }
    }
  }

  std::uint32_t code_point() {
    switch (random_.below(10)) {
      case 0: return static_cast<std::uint32_t>(random_.below(0x20));  // controls
      case 1: {
        static constexpr char kSpecial[] = {'"', '\\', '/', 0x7f, '\n', '\t'};
        return static_cast<unsigned char>(kSpecial[random_.below(std::size(kSpecial))]);
      }
      case 2: return 0x80 + static_cast<std::uint32_t>(random_.below(0x800 - 0x80));
      case 3: {
        std::uint32_t code = 0;
        do code = 0x800 + static_cast<std::uint32_t>(random_.below(0x10000 - 0x800));
        while (code >= 0xd800 && code <= 0xdfff);
        return code;
      }
      case 4: return 0x10000 + static_cast<std::uint32_t>(random_.below(0x110000 - 0x10000));
      default: return 0x20 + static_cast<std::uint32_t>(random_.below(0x7f - 0x20));  // ASCII
    }
  }

  static void put_utf8(std::string& out, std::uint32_t code) {
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
    } else if (code < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (code >> 18)));
      out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
    }
  }

  void unicode_escape(std::string& input, std::uint32_t unit) {
    static constexpr char kLower[] = "0123456789abcdef";
    static constexpr char kUpper[] = "0123456789ABCDEF";
    const char* digits = random_.chance(50) ? kLower : kUpper;
    input += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) input.push_back(digits[(unit >> shift) & 0xf]);
  }

  // The canonical escape, exactly as append_json_string writes it.
  static void canonical_char(std::string& canonical, std::uint32_t code) {
    static constexpr char kHex[] = "0123456789abcdef";
    switch (code) {
      case '"': canonical += "\\\""; return;
      case '\\': canonical += "\\\\"; return;
      case '\n': canonical += "\\n"; return;
      case '\r': canonical += "\\r"; return;
      case '\t': canonical += "\\t"; return;
      case '\b': canonical += "\\b"; return;
      case '\f': canonical += "\\f"; return;
      default:
        if (code < 0x20) {
          canonical += "\\u00";
          canonical.push_back(kHex[code >> 4]);
          canonical.push_back(kHex[code & 0xf]);
        } else {
          put_utf8(canonical, code);
        }
    }
  }

  void input_char(std::string& input, std::uint32_t code) {
    const std::uint64_t style = random_.below(4);
    const char* short_escape = nullptr;
    switch (code) {
      case '"': short_escape = "\\\""; break;
      case '\\': short_escape = "\\\\"; break;
      case '/': short_escape = "\\/"; break;
      case '\b': short_escape = "\\b"; break;
      case '\f': short_escape = "\\f"; break;
      case '\n': short_escape = "\\n"; break;
      case '\r': short_escape = "\\r"; break;
      case '\t': short_escape = "\\t"; break;
      default: break;
    }
    const bool raw_allowed = code >= 0x20 && code != '"' && code != '\\';
    if (style == 0 && short_escape != nullptr) {
      input += short_escape;
    } else if (style == 1 || !raw_allowed) {
      if (code >= 0x10000) {
        const std::uint32_t v = code - 0x10000;
        unicode_escape(input, 0xd800 + (v >> 10));
        unicode_escape(input, 0xdc00 + (v & 0x3ff));
      } else {
        unicode_escape(input, code);
      }
    } else {
      put_utf8(input, code);
    }
  }

  void string(std::string& input, std::string& canonical, std::uint64_t max_length,
              std::string* decoded = nullptr) {
    std::uint64_t length = random_.below(max_length + 1);
    if (random_.chance(3)) length = 28 + random_.below(300);  // cross the header widths
    input.push_back('"');
    canonical.push_back('"');
    for (std::uint64_t i = 0; i < length; ++i) {
      const std::uint32_t code = code_point();
      input_char(input, code);
      canonical_char(canonical, code);
      if (decoded != nullptr) put_utf8(*decoded, code);
    }
    input.push_back('"');
    canonical.push_back('"');
  }

  std::uint64_t container_size() {
    if (random_.chance(5)) return 14 + random_.below(6);  // around the fixarray boundary
    return random_.below(5);
  }

  // `open`, items written by `item` with commas and whitespace between them, then `close`.
  template <typename Item>
  void container(char open, char close, std::string& input, std::string& canonical, Item&& item) {
    input.push_back(open);
    canonical.push_back(open);
    whitespace(input);
    const std::uint64_t size = container_size();
    for (std::uint64_t i = 0; i < size; ++i) {
      if (i != 0) {
        input.push_back(',');
        canonical.push_back(',');
        whitespace(input);
      }
      item();
      whitespace(input);
    }
    input.push_back(close);
    canonical.push_back(close);
  }

  void array(int depth, std::string& input, std::string& canonical) {
    container('[', ']', input, canonical, [&] { value(depth, input, canonical); });
  }

  void object(int depth, std::string& input, std::string& canonical, std::vector<Member>* members) {
    container('{', '}', input, canonical, [&] {
      std::string key;
      string(input, canonical, 8, &key);
      whitespace(input);
      input.push_back(':');
      canonical.push_back(':');
      whitespace(input);
      const std::size_t value_begin = canonical.size();
      value(depth, input, canonical);
      if (members != nullptr) {
        members->push_back({std::move(key), canonical.substr(value_begin)});
      }
    });
  }

  SplitMix64 random_;
};

}  // namespace

TEST_CASE("round trip: random JSON -> msgpack -> JSON gives the canonical form") {
  JsonGenerator generator(20240601);
  constexpr int kDocuments = 3000;
  int object_roots = 0;
  std::size_t total_members = 0;
  for (int n = 0; n < kDocuments; ++n) {
    const JsonGenerator::Document doc = generator.document();
    CAPTURE(n);
    CAPTURE(doc.input);
    auto transcoded = json_to_msgpack(doc.input);
    REQUIRE_MESSAGE(transcoded.has_value(),
                    (transcoded ? std::string() : transcoded.error().describe()));
    const std::string bytes = transcoded->msgpack.str();

    // Back to JSON: exactly the canonical text.
    auto json = msgpack_to_json(bytes);
    REQUIRE(json.has_value());
    CHECK(*json == doc.canonical);

    // The canonical spelling transcodes to the same bytes, and msgpack-c agrees they are minimal.
    auto canonical = json_to_msgpack(doc.canonical);
    REQUIRE(canonical.has_value());
    CHECK(canonical->msgpack.str() == bytes);
    CHECK(msgpack_c_repack(bytes) == bytes);

    // The member index points at each value's own encoding.
    if (doc.object_root) {
      ++object_roots;
      CHECK(transcoded->root == JsonKind::kObject);
      REQUIRE(transcoded->members.size() == doc.members.size());
      for (std::size_t i = 0; i < doc.members.size(); ++i) {
        const TopLevelMember& member = transcoded->members[i];
        CHECK(member.key == doc.members[i].key);
        auto alone = json_to_msgpack(doc.members[i].canonical_value);
        REQUIRE(alone.has_value());
        CHECK(transcoded->value_bytes(member) == alone->msgpack.view());
        CHECK(member.kind == alone->root);
      }
      total_members += doc.members.size();
    } else if (transcoded->root != JsonKind::kObject) {
      CHECK(transcoded->members.empty());
    }
  }
  // The generator really produced a mix.
  CHECK(object_roots > kDocuments / 5);
  CHECK(total_members > static_cast<std::size_t>(kDocuments) / 2);
}
