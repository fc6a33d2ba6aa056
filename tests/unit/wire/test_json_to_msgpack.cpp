// One-pass JSON -> msgpack transcoder (common/wire/json_to_msgpack.*): exact bytes for every
// header-width boundary, JSON grammar errors with their byte offsets, the top-level member
// index, and minimality checked against msgpack-c.

#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_codec.hpp"
#include "tests/unit/wire/hex.hpp"

using namespace vllmd::wire;
using vllmd::test::from_hex;
using vllmd::test::msgpack_c_pack_plain;
using vllmd::test::msgpack_c_repack;
using vllmd::test::to_hex;

namespace {

std::string transcode(std::string_view json, const TranscodeLimits& limits = {}) {
  auto result = json_to_msgpack(json, limits);
  REQUIRE_MESSAGE(result.has_value(), (result ? std::string() : result.error().describe()));
  return result->msgpack.str();
}

std::string transcode_hex(std::string_view json, const TranscodeLimits& limits = {}) {
  return to_hex(transcode(json, limits));
}

JsonError transcode_error(std::string_view json, const TranscodeLimits& limits = {}) {
  auto result = json_to_msgpack(json, limits);
  REQUIRE_MESSAGE(!result.has_value(), "expected an error, got " << to_hex(result->msgpack.view()));
  return result.error();
}

std::string float_hex(double value) {
  char bytes[8];
  std::uint64_t bits = std::bit_cast<std::uint64_t>(value);
  for (int i = 7; i >= 0; --i) {
    bytes[i] = static_cast<char>(bits & 0xff);
    bits >>= 8;
  }
  return "cb" + to_hex(std::string_view(bytes, 8));
}

bool contains_float(const msgpack::object& object) {
  switch (object.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return true;
    case msgpack::type::ARRAY:
      for (std::uint32_t i = 0; i < object.via.array.size; ++i) {
        if (contains_float(object.via.array.ptr[i])) return true;
      }
      return false;
    case msgpack::type::MAP:
      for (std::uint32_t i = 0; i < object.via.map.size; ++i) {
        if (contains_float(object.via.map.ptr[i].val)) return true;
      }
      return false;
    default: return false;
  }
}

std::string msgpack_str_of(std::string_view text) {
  StringBuffer expected;
  Packer packer(expected);
  pack_str(packer, text);
  return expected.bytes();
}

std::string json_array_of_zeros(std::size_t count) {
  std::string json = "[";
  for (std::size_t i = 0; i < count; ++i) json += i == 0 ? "0" : ",0";
  return json + "]";
}

}  // namespace

// ====================================================================================== scalars

TEST_CASE("literals") {
  CHECK(transcode_hex("null") == "c0");
  CHECK(transcode_hex("true") == "c3");
  CHECK(transcode_hex("false") == "c2");
  CHECK(json_to_msgpack("null")->root == JsonKind::kNull);
  CHECK(json_to_msgpack("true")->root == JsonKind::kBool);
  CHECK(json_to_msgpack("1")->root == JsonKind::kInteger);
  CHECK(json_to_msgpack("1.5")->root == JsonKind::kFloat);
  CHECK(json_to_msgpack("\"\"")->root == JsonKind::kString);
  CHECK(json_to_msgpack("[]")->root == JsonKind::kArray);
  CHECK(json_to_msgpack("{}")->root == JsonKind::kObject);
  CHECK(json_to_msgpack("[]")->members.empty());
  CHECK(json_to_msgpack("1")->members.empty());
}

TEST_CASE("kind names") {
  CHECK(kind_name(JsonKind::kNull) == "null");
  CHECK(kind_name(JsonKind::kBool) == "boolean");
  CHECK(kind_name(JsonKind::kInteger) == "integer");
  CHECK(kind_name(JsonKind::kFloat) == "number");
  CHECK(kind_name(JsonKind::kString) == "string");
  CHECK(kind_name(JsonKind::kArray) == "array");
  CHECK(kind_name(JsonKind::kObject) == "object");
}

TEST_CASE("integers at every width boundary") {
  struct Case {
    std::string_view json;
    std::string_view hex;
  };
  const std::vector<Case> cases = {
      {"0", "00"},
      {"1", "01"},
      {"127", "7f"},
      {"128", "cc80"},
      {"255", "ccff"},
      {"256", "cd0100"},
      {"65535", "cdffff"},
      {"65536", "ce00010000"},
      {"4294967295", "ceffffffff"},
      {"4294967296", "cf0000000100000000"},
      {"9223372036854775807", "cf7fffffffffffffff"},
      {"9223372036854775808", "cf8000000000000000"},
      {"18446744073709551615", "cfffffffffffffffff"},
      {"-0", "00"},
      {"-1", "ff"},
      {"-32", "e0"},
      {"-33", "d0df"},
      {"-128", "d080"},
      {"-129", "d1ff7f"},
      {"-32768", "d18000"},
      {"-32769", "d2ffff7fff"},
      {"-2147483648", "d280000000"},
      {"-2147483649", "d3ffffffff7fffffff"},
      {"-9223372036854775808", "d38000000000000000"},
      {"29500", "cd733c"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.json);
    CHECK(transcode_hex(c.json) == c.hex);
    CHECK(msgpack_c_repack(from_hex(c.hex)) == from_hex(c.hex));
  }
}

TEST_CASE("integers beyond 64 bits are rejected") {
  for (std::string_view json :
       {"18446744073709551616", "-9223372036854775809", "99999999999999999999",
        "123456789012345678901234567890", "-18446744073709551615", "-18446744073709551616"}) {
    CAPTURE(json);
    const JsonError error = transcode_error(json);
    CHECK(error.message == "Integer out of 64-bit range");
    CHECK(error.offset == 0);
  }
  const JsonError nested = transcode_error(R"({"a": [1, 18446744073709551616]})");
  CHECK(nested.message == "Integer out of 64-bit range");
  CHECK(nested.offset == 10);
  CHECK(nested.describe() == "Integer out of 64-bit range at byte 10");
}

TEST_CASE("floats become float64 with the exact bits") {
  CHECK(transcode_hex("1.5") == "cb3ff8000000000000");
  CHECK(transcode_hex("-0.0") == "cb8000000000000000");
  CHECK(transcode_hex("0.0") == "cb0000000000000000");
  CHECK(transcode_hex("1e300") == "cb7e37e43c8800759c");
  CHECK(transcode_hex("1E-5") == "cb3ee4f8b588e368f1");
  CHECK(transcode_hex("1e-5") == "cb3ee4f8b588e368f1");
  CHECK(transcode_hex("0.1") == "cb3fb999999999999a");
  CHECK(transcode_hex("1234.5") == "cb40934a0000000000");
  CHECK(transcode_hex("1.0") == "cb3ff0000000000000");  // stays a float
  CHECK(transcode_hex("10") == "0a");                   // stays an integer
  CHECK(transcode_hex("1e2") == "cb4059000000000000");  // exponent -> float
  CHECK(transcode_hex("1E+2") == "cb4059000000000000");
  CHECK(transcode_hex("-1.5e-3") == float_hex(-1.5e-3));
  CHECK(transcode_hex("5e-324") == float_hex(5e-324));  // smallest subnormal
  CHECK(transcode_hex("1.7976931348623157e308") == float_hex(1.7976931348623157e308));
  CHECK(transcode_hex("3.141592653589793") == float_hex(3.141592653589793));
  CHECK(transcode_hex("0.30000000000000004") == float_hex(0.30000000000000004));
  CHECK(transcode_hex("18446744073709551616.0") == float_hex(18446744073709551616.0));
  CHECK(transcode_hex("123456789012345678901234567890e0") ==
        float_hex(123456789012345678901234567890e0));
  CHECK(transcode_hex("-0e0") == "cb8000000000000000");

  for (std::string_view json : {"1e400", "-1e400", "1.8e308"}) {
    CAPTURE(json);
    const JsonError error = transcode_error(json);
    CHECK(error.message == "Number out of float64 range");
    CHECK(error.offset == 0);
  }
  CHECK(transcode_error("[0, 1e999]").offset == 4);
  // Underflow rounds to zero, keeping the sign, as Python's json.loads does.
  CHECK(transcode_hex("1e-400") == "cb0000000000000000");
  CHECK(transcode_hex("-1e-400") == "cb8000000000000000");
}

// ====================================================================================== strings

TEST_CASE("string header widths") {
  CHECK(transcode_hex(R"("")") == "a0");
  CHECK(transcode_hex(R"("a")") == "a161");
  struct Case {
    std::size_t length;
    std::string_view header;
  };
  for (const Case& c : std::vector<Case>{{1, "a1"},
                                         {15, "af"},
                                         {16, "b0"},
                                         {17, "b1"},
                                         {31, "bf"},
                                         {32, "d920"},
                                         {33, "d921"},
                                         {255, "d9ff"},
                                         {256, "da0100"},
                                         {65535, "daffff"},
                                         {65536, "db00010000"},
                                         {100000, "db000186a0"}}) {
    CAPTURE(c.length);
    std::string body;
    for (std::size_t i = 0; i < c.length; ++i) body.push_back(static_cast<char>('a' + i % 26));
    const std::string bytes = transcode("\"" + body + "\"");
    CHECK(to_hex(bytes.substr(0, c.header.size() / 2)) == c.header);
    CHECK(bytes.substr(c.header.size() / 2) == body);
    CHECK(msgpack_c_repack(bytes) == bytes);
  }
}

// Strings are scanned 16 or 32 bytes at a time (SSE2, or AVX2 when the CPU has it), then
// byte by byte near the end of the input: every special byte at every position around those
// block boundaries, in strings that end right at the end of the input or well before it.
TEST_CASE("special bytes at every position around scan block boundaries") {
  struct Special {
    std::string_view json;     // as written inside the JSON string
    std::string_view decoded;  // empty: the string is invalid
    std::string_view error;
  };
  const std::vector<Special> specials = {
      {"\\n", "\n", ""},
      {"\\u00e9", "\xc3\xa9", ""},
      {"\xc3\xa9", "\xc3\xa9", ""},
      {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80", ""},
      {"\x1f", "", "Invalid control character in string"},
      {"\xff", "", "Invalid UTF-8 in string"},
      {"\xc3", "", "Invalid UTF-8 in string"},  // truncated by the closing quote
  };
  for (std::size_t length :
       {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{17},
        std::size_t{31}, std::size_t{32}, std::size_t{33}, std::size_t{47}, std::size_t{63},
        std::size_t{64}, std::size_t{65}, std::size_t{95}, std::size_t{130}, std::size_t{300}}) {
    for (std::size_t pos = 0; pos <= length; ++pos) {
      for (const Special& special : specials) {
        for (const std::string_view tail : {"", "   ", "                                    "}) {
          CAPTURE(length);
          CAPTURE(pos);
          CAPTURE(to_hex(special.json));
          CAPTURE(tail.size());
          const std::string before(pos, 'a');
          const std::string after(length - pos, 'b');
          const std::string json =
              "\"" + before + std::string(special.json) + after + "\"" + std::string(tail);
          if (special.decoded.empty()) {
            const JsonError error = transcode_error(json);
            CHECK(error.message == special.error);
            CHECK(error.offset == 1 + pos);
          } else {
            CHECK(transcode(json) == msgpack_str_of(before + std::string(special.decoded) + after));
          }
        }
      }
      // Unterminated: the scan runs into the end of the input at every length.
      const JsonError error = transcode_error("\"" + std::string(pos, 'c'));
      CHECK(error.message == "Unterminated string starting");
      CHECK(error.offset == 0);
    }
  }
}

TEST_CASE("many short strings and very long strings") {
  std::string json = "[";
  StringBuffer expected;
  Packer packer(expected);
  packer.pack_array(5000);
  for (int i = 0; i < 5000; ++i) {
    const std::string text(static_cast<std::size_t>(i % 40), static_cast<char>('a' + i % 26));
    json += (i ? ",\"" : "\"") + text + "\"";
    pack_str(packer, text);
  }
  CHECK(transcode(json + "]") == expected.bytes());
  // A long string with one escape near its end, and one with a non-ASCII character every 1000.
  std::string text(3'000'000, 'z');
  CHECK(transcode("\"" + text + "\\t\"") == msgpack_str_of(text + "\t"));
  for (std::size_t i = 999; i < text.size(); i += 1000) text.replace(i - 1, 2, "\xc3\xa9");
  CHECK(transcode("\"" + text + "\"") == msgpack_str_of(text));
}

TEST_CASE("string escapes") {
  CHECK(transcode_hex(R"("\"\\\/\b\f\n\r\t")") == "a8225c2f080c0a0d09");
  CHECK(transcode_hex(R"("\u00e9")") == "a2c3a9");
  CHECK(transcode_hex(R"("\u00E9")") == "a2c3a9");
  CHECK(transcode_hex(R"("\u0041")") == "a141");
  CHECK(transcode_hex(R"("\u0000")") == "a100");
  CHECK(transcode_hex(R"("\u001f")") == "a11f");
  CHECK(transcode_hex(R"("\u007f")") == "a17f");
  CHECK(transcode_hex(R"("\u0080")") == "a2c280");
  CHECK(transcode_hex(R"("\u07ff")") == "a2dfbf");
  CHECK(transcode_hex(R"("\u0800")") == "a3e0a080");
  CHECK(transcode_hex(R"("\u20ac")") == "a3e282ac");
  CHECK(transcode_hex(R"("\uffff")") == "a3efbfbf");
  CHECK(transcode_hex(R"("\ud83d\ude00")") == "a4f09f9880");
  CHECK(transcode_hex(R"("\uD83D\uDE00")") == "a4f09f9880");
  CHECK(transcode_hex(R"("\ud800\udc00")") == "a4f0908080");  // U+10000
  CHECK(transcode_hex(R"("\udbff\udfff")") == "a4f48fbfbf");  // U+10FFFF
  CHECK(transcode_hex(R"("a\nb")") == "a3610a62");
  CHECK(transcode_hex(R"("\\n")") == "a25c6e");  // an escaped backslash then 'n'
  CHECK(transcode_hex(R"("x\"")") == "a27822");
  // Long strings with escapes take the vectorised scan path.
  const std::string long_escaped = std::string(20, 'a') + "\\\"" + std::string(20, 'b') + "\\u00e9";
  CHECK(transcode("\"" + long_escaped + "\"") ==
        from_hex("d92b") + std::string(20, 'a') + "\"" + std::string(20, 'b') + "\xc3\xa9");
}

TEST_CASE("lone surrogates and bad escapes are rejected") {
  struct Case {
    std::string_view json;
    std::size_t offset;
    std::string_view message;
  };
  const std::vector<Case> cases = {
      {R"("\ud83d")", 1, "Lone surrogate in \\u escape"},
      {R"("\ude00")", 1, "Lone surrogate in \\u escape"},
      {R"("ab\ude00\ud83d")", 3, "Lone surrogate in \\u escape"},
      {R"("\ud83dx")", 1, "Lone surrogate in \\u escape"},
      {R"("\ud83d\n")", 1, "Lone surrogate in \\u escape"},
      {R"("\ud83d\u0041")", 1, "Lone surrogate in \\u escape"},
      {R"("\ud83d\ud83d")", 1, "Lone surrogate in \\u escape"},
      {R"("x\udbff")", 2, "Lone surrogate in \\u escape"},
      {R"("\x")", 1, "Invalid \\escape"},
      {R"("\a")", 1, "Invalid \\escape"},
      {R"("\U00e9")", 1, "Invalid \\escape"},
      {R"("\u12")", 3, "Invalid \\uXXXX escape"},
      {R"("\u12g4")", 3, "Invalid \\uXXXX escape"},
      {R"("\u")", 3, "Invalid \\uXXXX escape"},
      {R"("\ud83d\u12")", 1, "Lone surrogate in \\u escape"},  // too short for a pair
      {R"("\ud83d\u12zz")", 9, "Invalid \\uXXXX escape"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.json);
    const JsonError error = transcode_error(c.json);
    CHECK(error.message == c.message);
    CHECK(error.offset == c.offset);
  }
}

TEST_CASE("raw UTF-8 is kept and validated") {
  CHECK(transcode("\"\xc3\xa9\"") == "\xa2\xc3\xa9");                  // 2 bytes
  CHECK(transcode("\"\xe2\x82\xac\"") == "\xa3\xe2\x82\xac");          // 3 bytes
  CHECK(transcode("\"\xf0\x9f\x98\x80\"") == "\xa4\xf0\x9f\x98\x80");  // 4 bytes
  CHECK(transcode("\"\xef\xbf\xbf\"") == "\xa3\xef\xbf\xbf");          // U+FFFF
  CHECK(transcode("\"\xf4\x8f\xbf\xbf\"") == "\xa4\xf4\x8f\xbf\xbf");  // U+10FFFF
  CHECK(transcode("\"\xed\x9f\xbf\"") == "\xa3\xed\x9f\xbf");          // U+D7FF
  CHECK(transcode("\"\x7f\"") == "\xa1\x7f");                          // DEL is no control
  const std::string long_utf8 = std::string(40, 'x') + "\xc3\xa9\xe2\x82\xac" + std::string(3, 'y');
  CHECK(transcode("\"" + long_utf8 + "\"") == from_hex("d930") + long_utf8);

  struct Case {
    std::string json;
    std::size_t offset;
  };
  const std::vector<Case> invalid = {
      {"\"\xc3\x28\"", 1},      // bad continuation
      {"\"\xed\xa0\x80\"", 1},  // UTF-16 surrogate encoded in UTF-8
      {"\"\xed\xbf\xbf\"", 1},
      {"\"\xf5\x80\x80\x80\"", 1},  // beyond U+10FFFF
      {"\"\xf4\x90\x80\x80\"", 1},
      {"\"\xff\"", 1},
      {"\"\xfe\"", 1},
      {"\"\xc0\x80\"", 1},  // overlong NUL
      {"\"\xc1\xbf\"", 1},
      {"\"\xe0\x80\x80\"", 1},  // overlong
      {"\"\xf0\x80\x80\x80\"", 1},
      {"\"\x80\"", 1},  // lone continuation
      {"\"ab\xbf\"", 3},
      {"\"\xc3\"", 1},  // truncated before the quote
      {"\"\xe2\x82\"", 1},
      {"\"\xf0\x9f\x98\"", 1},
      {"\"\xe2\x82", 1},                                 // truncated at end of input
      {"\"" + std::string(40, 'a') + "\xc3\x28\"", 41},  // found by the vectorised scan
      {"[\"ok\", \"" + std::string(20, 'z') + "\xed\xa0\x80\"]", 28},
  };
  for (const Case& c : invalid) {
    CAPTURE(to_hex(c.json));
    const JsonError error = transcode_error(c.json);
    CHECK(error.message == "Invalid UTF-8 in string");
    CHECK(error.offset == c.offset);
  }
}

TEST_CASE("control characters inside strings are rejected") {
  for (int control = 0; control < 0x20; ++control) {
    CAPTURE(control);
    std::string json = "\"ab";
    json.push_back(static_cast<char>(control));
    json += "cd\"";
    const JsonError error = transcode_error(json);
    CHECK(error.message == "Invalid control character in string");
    CHECK(error.offset == 3);
  }
  const JsonError in_long = transcode_error("\"" + std::string(33, 'q') + "\n\"");
  CHECK(in_long.message == "Invalid control character in string");
  CHECK(in_long.offset == 34);
  // A key, too.
  CHECK(transcode_error("{\"a\tb\":1}").offset == 3);
}

TEST_CASE("escaped strings get the header of their decoded length") {
  auto repeat = [](std::string_view text, std::size_t times) {
    std::string out;
    for (std::size_t i = 0; i < times; ++i) out += text;
    return out;
  };
  struct Case {
    std::string json_body;  // between the quotes
    std::string decoded;
    std::string_view header;
  };
  const std::vector<Case> cases = {
      {repeat("\\n", 20), std::string(20, '\n'), "b4"},                   // 40 raw bytes -> 20
      {std::string(30, 'a') + "\\n", std::string(30, 'a') + "\n", "bf"},  // 32 raw -> 31
      {repeat("\\t", 31), std::string(31, '\t'), "bf"},  // str8 reserved, fixstr written
      {repeat("\\t", 32), std::string(32, '\t'), "d920"},
      {repeat("\\/", 255), std::string(255, '/'), "d9ff"},  // str16 reserved -> str8
      {repeat("\\/", 256), std::string(256, '/'), "da0100"},
      {repeat("\\u00e9", 128), repeat("\xc3\xa9", 128), "da0100"},  // 768 raw -> 256
      {repeat("\\u00e9", 127) + "x", repeat("\xc3\xa9", 127) + "x", "d9ff"},
      {repeat("\\ud83d\\ude00", 8), repeat("\xf0\x9f\x98\x80", 8), "d920"},  // 96 raw -> 32
      {repeat("\\ud83d\\ude00", 7) + "abc", repeat("\xf0\x9f\x98\x80", 7) + "abc", "bf"},
      {repeat("\\\"", 65535), std::string(65535, '"'), "daffff"},  // str32 reserved -> str16
      {repeat("\\\"", 65536), std::string(65536, '"'), "db00010000"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.header);
    CAPTURE(c.json_body.size());
    const std::string bytes = transcode("\"" + c.json_body + "\"");
    CHECK(to_hex(bytes.substr(0, c.header.size() / 2)) == c.header);
    CHECK(bytes.substr(c.header.size() / 2) == c.decoded);
    CHECK(msgpack_c_repack(bytes) == bytes);
  }
  // Several shrunken strings in one document keep the bytes between them intact.
  const std::string doc = "[\"" + repeat("\\n", 20) + "\",1,\"" + repeat("\\/", 255) + "\",{\"" +
                          repeat("\\t", 16) + "\":true}]";
  const std::string bytes = transcode(doc);
  CHECK(bytes == from_hex("94b4") + std::string(20, '\n') + from_hex("01d9ff") +
                     std::string(255, '/') + from_hex("81b0") + std::string(16, '\t') +
                     from_hex("c3"));
}

// =================================================================================== containers

TEST_CASE("empty and small containers") {
  CHECK(transcode_hex("{}") == "80");
  CHECK(transcode_hex("[]") == "90");
  CHECK(transcode_hex("[[]]") == "9190");
  CHECK(transcode_hex("[{}]") == "9180");
  CHECK(transcode_hex(R"({"a":{}})") == "81a16180");
  CHECK(transcode_hex(R"({"a":[1,{"b":null}],"c":true})") ==
        "82a1619201"
        "81a162c0"
        "a163c3");
  CHECK(transcode_hex(R"([1,"a",null,true,false,1.5,[],{}])") ==
        "9801a161c0c3c2cb3ff80000000000009080");
}

TEST_CASE("container header widths") {
  struct Case {
    std::size_t count;
    std::string_view array_header;
    std::string_view map_header;
  };
  for (const Case& c : std::vector<Case>{{0, "90", "80"},
                                         {1, "91", "81"},
                                         {15, "9f", "8f"},
                                         {16, "dc0010", "de0010"},
                                         {17, "dc0011", "de0011"},
                                         {65535, "dcffff", "deffff"},
                                         {65536, "dd00010000", "df00010000"},
                                         {70000, "dd00011170", "df00011170"}}) {
    CAPTURE(c.count);
    const std::string array = transcode(json_array_of_zeros(c.count));
    CHECK(array == from_hex(c.array_header) + std::string(c.count, '\0'));

    std::string json = "{";
    StringBuffer expected;
    Packer packer(expected);
    packer.pack_map(static_cast<std::uint32_t>(c.count));
    for (std::size_t i = 0; i < c.count; ++i) {
      const std::string key = "k" + std::to_string(i);
      json += (i == 0 ? "\"" : ",\"") + key + "\":" + std::to_string(i % 300);
      pack_str(packer, key);
      packer.pack(static_cast<int>(i % 300));
    }
    json += "}";
    const std::string map = transcode(json);
    CHECK(to_hex(map.substr(0, c.map_header.size() / 2)) == c.map_header);
    CHECK(map == expected.bytes());
  }
}

TEST_CASE("nested containers of mixed widths") {
  // Every container closes after its children: the final sweep must move each body over the
  // unused bytes of all earlier headers.
  std::string json = "{\"outer\":[";
  for (int i = 0; i < 20; ++i) {
    if (i) json += ",";
    json += "{\"i\":" + std::to_string(i) + ",\"list\":" + json_array_of_zeros(i) + "}";
  }
  json += "],\"big\":" + json_array_of_zeros(70000) + ",\"tail\":\"end\"}";
  const std::string bytes = transcode(json);
  CHECK(msgpack_c_repack(bytes) == bytes);
  auto handle = decode(bytes);
  REQUIRE(handle.has_value());
  const msgpack::object* outer = find_key(handle->get(), "outer");
  REQUIRE(outer != nullptr);
  REQUIRE(outer->via.array.size == 20);
  CHECK(find_key(outer->via.array.ptr[19], "list")->via.array.size == 19);
  CHECK(find_key(handle->get(), "big")->via.array.size == 70000);
  CHECK(as_str(*find_key(handle->get(), "tail")) == "end");
}

TEST_CASE("headers widened after large first elements") {
  // Headers are placed 1 byte wide and widened at the 16th and 65536th element by moving the
  // body so far; past a budget of moved bytes (an eighth of the input) the rest are inserted by
  // one final sweep. Large first elements cross the budget at different depths.
  const std::string big = "\"" + std::string(200000, 'x') + "\"";
  auto array_after = [](std::string_view first, std::size_t more) {
    std::string json = "[" + std::string(first);
    for (std::size_t i = 0; i < more; ++i) json += "," + std::to_string(i % 200);
    return json + "]";
  };
  std::vector<std::string> documents = {
      array_after(big, 15),                        // 16: widened by the sweep
      array_after(big, 14),                        // 15: never widened
      array_after(big, 70000),                     // 65536+: from 1 byte to 5
      array_after(array_after(big, 20), 20),       // nested, both deferred
      array_after(array_after("1", 20), 15) + "",  // small: moved
      "[" + array_after("1", 20) + "," + array_after(big, 20) + "," + array_after("2", 17) + "," +
          array_after(big, 3) + "]",             // moved, then deferred, then not
      array_after(array_after("0", 70000), 20),  // 65536 moved, outer deferred
  };
  std::string object = "{";
  for (int i = 0; i < 40; ++i) {
    object += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":";
    object += i % 7 == 3 ? array_after(big, 16 + i) : array_after("[]", i);
  }
  documents.push_back(object + "}");
  for (const std::string& document : documents) {
    CAPTURE(document.size());
    auto result = json_to_msgpack(document);
    REQUIRE(result.has_value());
    const std::string bytes = result->msgpack.str();
    CHECK(msgpack_c_repack(bytes) == bytes);
    auto handle = decode(bytes);
    REQUIRE(handle.has_value());
  }
  // Top-level members keep their value bytes when headers before them are widened either way.
  auto result = json_to_msgpack(object + "}");
  REQUIRE(result.has_value());
  REQUIRE(result->members.size() == 40);
  for (int i = 0; i < 40; ++i) {
    CAPTURE(i);
    const TopLevelMember& member = result->members[i];
    CHECK(member.key == "k" + std::to_string(i));
    const std::string value = i % 7 == 3 ? array_after(big, 16 + i) : array_after("[]", i);
    CHECK(result->value_bytes(member) == transcode(value));
  }
}

TEST_CASE("random nesting: msgpack-c agrees and members are exact") {
  vllmd::test::SplitMix64 random(7);
  // A value of random shape: containers of 0..40 elements (sometimes 16 exactly), strings up to
  // 40 kB, so some bodies exceed the move budget and some do not.
  std::function<std::string(int)> value = [&](int depth) -> std::string {
    const auto pick = random.below(depth > 4 ? 3 : 6);
    if (pick == 0) return std::to_string(random.below(100000));
    if (pick == 1)
      return "\"" + std::string(random.chance(10) ? random.below(40000) : 3, 's') + "\"";
    if (pick == 2) return "null";
    // Wide near the top, narrow deeper down: documents stay below a few MB.
    const std::size_t count = random.chance(30) ? 16 : random.below(depth > 2 ? 5 : 41);
    const bool object = pick == 3;
    std::string json = object ? "{" : "[";
    for (std::size_t i = 0; i < count; ++i) {
      if (i) json += ",";
      if (object) json += "\"" + std::to_string(i) + "\":";
      json += value(depth + 1);
    }
    return json + (object ? "}" : "]");
  };
  for (int round = 0; round < 30; ++round) {
    CAPTURE(round);
    std::vector<std::string> values;
    std::string json = "{";
    const std::size_t members = random.below(20);
    for (std::size_t i = 0; i < members; ++i) {
      values.push_back(value(1));
      json += (i ? ",\"m" : "\"m") + std::to_string(i) + "\":" + values.back();
    }
    json += "}";
    auto result = json_to_msgpack(json);
    REQUIRE(result.has_value());
    const std::string bytes = result->msgpack.str();
    CHECK(msgpack_c_repack(bytes) == bytes);
    REQUIRE(result->members.size() == members);
    for (std::size_t i = 0; i < members; ++i) {
      CHECK(result->value_bytes(result->members[i]) == transcode(values[i]));
    }
  }
}

TEST_CASE("nesting depth limit") {
  auto nested = [](std::size_t depth, bool objects = false) {
    std::string json;
    for (std::size_t i = 0; i < depth; ++i) json += objects ? "{\"a\":" : "[";
    json += "1";
    for (std::size_t i = 0; i < depth; ++i) json += objects ? "}" : "]";
    return json;
  };
  TranscodeLimits limits;
  limits.max_depth = 4;
  CHECK(transcode_hex(nested(4), limits) == "9191919101");
  const JsonError too_deep = transcode_error(nested(5), limits);
  CHECK(too_deep.message == "Nesting too deep");
  CHECK(too_deep.offset == 4);
  CHECK(transcode_error(nested(5, true), limits).offset == 20);
  CHECK(json_to_msgpack(nested(4, true), limits).has_value());
  // Scalars do not count as a level.
  limits.max_depth = 1;
  CHECK(transcode_hex(R"([1,"a",null])", limits) == "9301a161c0");
  CHECK_FALSE(json_to_msgpack("[[]]", limits).has_value());
  limits.max_depth = 0;
  CHECK(transcode_hex("7", limits) == "07");
  CHECK_FALSE(json_to_msgpack("[]", limits).has_value());

  // The default allows 256 levels and refuses the 257th.
  const std::string deepest = transcode(nested(256));
  CHECK(deepest == std::string(256, '\x91') + '\x01');
  CHECK(transcode_error(nested(257)).offset == 256);
  // Far deeper input stops at the limit instead of exhausting the stack.
  const JsonError huge = transcode_error(std::string(200000, '['));
  CHECK(huge.message == "Nesting too deep");
  CHECK(huge.offset == 256);
}

TEST_CASE("whitespace is allowed between all tokens") {
  const std::string compact = transcode(R"({"a":[1,2,{"b":null}],"c":"d","e":-1.5,"f":true})");
  const std::string spaced = transcode(
      " \t\r\n{ \"a\" :\t[ 1 ,\n2 ,\r{ \"b\"\n:\nnull } ] , \"c\" : \"d\" ,\"e\":  -1.5 ,"
      " \"f\" : true\n}\r\n\t ");
  CHECK(to_hex(spaced) == to_hex(compact));
  CHECK(transcode_hex(" [ ] ") == "90");
  CHECK(transcode_hex("\n{\n}\n") == "80");
  CHECK(transcode_hex(" 1 ") == "01");
  CHECK(transcode_hex("\t\"x\"\t") == "a178");
}

TEST_CASE("invalid JSON reports the byte offset") {
  struct Case {
    std::string json;
    std::size_t offset;
    std::string_view message;
  };
  const std::vector<Case> cases = {
      {R"({"a":1,})", 7, "Expecting property name enclosed in double quotes"},
      {"[1 2]", 3, "Expecting ',' delimiter or ']'"},
      {R"({"a" 1})", 5, "Expecting ':' delimiter"},
      {"tru", 0, "Expecting value"},
      {"nul", 0, "Expecting value"},
      {"fals", 0, "Expecting value"},
      {"True", 0, "Expecting value"},
      {"01", 0, "Invalid number: leading zero"},
      {"-01", 0, "Invalid number: leading zero"},
      {"00", 0, "Invalid number: leading zero"},
      {"1.", 0, "Invalid number: no digit after '.'"},
      {"1.e5", 0, "Invalid number: no digit after '.'"},
      {"[0, 1.]", 4, "Invalid number: no digit after '.'"},
      {"1e", 0, "Invalid number: no digit in exponent"},
      {"1e+", 0, "Invalid number: no digit in exponent"},
      {"1E-x", 0, "Invalid number: no digit in exponent"},
      {"-", 0, "Invalid number"},
      {"-a", 0, "Invalid number"},
      {"-Infinity", 0, "Invalid number"},
      {"+1", 0, "Expecting value"},
      {".5", 0, "Expecting value"},
      {"NaN", 0, "Expecting value"},
      {"Infinity", 0, "Expecting value"},
      {"\"abc", 0, "Unterminated string starting"},
      {"[\"abc", 1, "Unterminated string starting"},
      {"\"\\", 0, "Unterminated string starting"},
      {"\"abc\\\"", 0, "Unterminated string starting"},
      {"\"" + std::string(40, 'a'), 0, "Unterminated string starting"},
      {"{} x", 3, "Extra data after the JSON value"},
      {"1 2", 2, "Extra data after the JSON value"},
      {"[1]]", 3, "Extra data after the JSON value"},
      {"truex", 4, "Extra data after the JSON value"},
      {std::string("[1,2]\0", 6), 5, "Extra data after the JSON value"},
      {"", 0, "Expecting value: empty body"},
      {"  \n", 3, "Expecting value: empty body"},
      {"[", 1, "Expecting value"},
      {"[1,]", 3, "Expecting value"},
      {"[,1]", 1, "Expecting value"},
      {R"({"a":})", 5, "Expecting value"},
      {R"({"a":)", 5, "Expecting value"},
      {"[1,2", 4, "Expecting ',' delimiter or ']'"},
      {"[1,2 ", 5, "Expecting ',' delimiter or ']'"},
      {R"({"a":1)", 6, "Expecting ',' delimiter or '}'"},
      {R"({"a":1 "b":2})", 7, "Expecting ',' delimiter or '}'"},
      {R"({"a":1])", 6, "Expecting ',' delimiter or '}'"},
      {"[1}", 2, "Expecting ',' delimiter or ']'"},
      {"{1:2}", 1, "Expecting property name enclosed in double quotes"},
      {"{,}", 1, "Expecting property name enclosed in double quotes"},
      {"{", 1, "Expecting property name enclosed in double quotes"},
      {"{'a':1}", 1, "Expecting property name enclosed in double quotes"},
      {R"({"a",1})", 4, "Expecting ':' delimiter"},
      {R"({"a")", 4, "Expecting ':' delimiter"},
      {"\xc2\xa0"
       "1",
       0, "Expecting value"},  // NBSP is no JSON whitespace
      {"\f1", 0, "Expecting value"},
      {"/* */ 1", 0, "Expecting value"},
  };
  for (const Case& c : cases) {
    CAPTURE(to_hex(c.json));
    CAPTURE(c.json);
    const JsonError error = transcode_error(c.json);
    CHECK(error.message == c.message);
    CHECK(error.offset == c.offset);
    CHECK(error.describe() == std::string(c.message) + " at byte " + std::to_string(c.offset));
    CHECK(error.describe().find("at byte " + std::to_string(c.offset)) != std::string::npos);
  }
}

TEST_CASE("every proper prefix of a valid document is an error, never a crash") {
  const std::string document =
      R"({"a":[1,-2,3.5e-3,"x\u00e9\ud83d\ude00\n",true,false,null],"b":{"c":[]},"d":"long string )"
      R"(with more than sixteen bytes"})";
  REQUIRE(json_to_msgpack(document).has_value());
  for (std::size_t length = 0; length < document.size(); ++length) {
    CAPTURE(length);
    const std::string_view prefix(document.data(), length);
    auto result = json_to_msgpack(prefix);
    // A prefix can be a complete number ("1" of "12"), but here every prefix ends inside the
    // object.
    CHECK_FALSE(result.has_value());
    if (!result) CHECK(result.error().offset <= length);
  }
}

// ======================================================================== top-level member index

TEST_CASE("top-level members: keys, kinds and value bytes") {
  const std::string json =
      R"({"null":null,"bool":false,"int":-129,"float":2.5,"str":"text","arr":[{},{}],)"
      R"("obj":{"x":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]},"big":)" +
      json_array_of_zeros(70000) + R"(,"k\u00e9y":"v","long":")" + std::string(300, 'L') +
      R"(","last":[1,[{}]]})";
  auto result = json_to_msgpack(json);
  REQUIRE(result.has_value());
  CHECK(result->root == JsonKind::kObject);
  struct Expected {
    std::string_view key;
    JsonKind kind;
    std::string value_json;
    bool all_objects;
  };
  const std::vector<Expected> expected = {
      {"null", JsonKind::kNull, "null", false},
      {"bool", JsonKind::kBool, "false", false},
      {"int", JsonKind::kInteger, "-129", false},
      {"float", JsonKind::kFloat, "2.5", false},
      {"str", JsonKind::kString, "\"text\"", false},
      {"arr", JsonKind::kArray, "[{},{}]", true},
      {"obj", JsonKind::kObject, R"({"x":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]})", false},
      {"big", JsonKind::kArray, json_array_of_zeros(70000), false},
      {"k\xc3\xa9y", JsonKind::kString, "\"v\"", false},
      {"long", JsonKind::kString, "\"" + std::string(300, 'L') + "\"", false},
      {"last", JsonKind::kArray, "[1,[{}]]", false},
  };
  REQUIRE(result->members.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const TopLevelMember& member = result->members[i];
    CAPTURE(expected[i].key);
    CHECK(member.key == expected[i].key);
    CHECK(member.kind == expected[i].kind);
    CHECK(member.all_elements_objects == expected[i].all_objects);
    CHECK(to_hex(result->value_bytes(member)) == to_hex(transcode(expected[i].value_json)));
    CHECK(result->find(expected[i].key) == &member);
  }
  CHECK(result->find("missing") == nullptr);
  CHECK(result->find("") == nullptr);
  // The whole document is still what msgpack-c would write.
  CHECK(msgpack_c_repack(result->msgpack.view()) == result->msgpack.str());
}

TEST_CASE("all_elements_objects") {
  auto member_of = [](std::string_view value_json) {
    auto result = json_to_msgpack("{\"x\":" + std::string(value_json) + "}");
    REQUIRE(result.has_value());
    REQUIRE(result->members.size() == 1);
    return result->members[0];
  };
  CHECK(member_of("[{},{}]").all_elements_objects);
  CHECK(member_of("[{}]").all_elements_objects);
  CHECK(member_of("[]").all_elements_objects);
  CHECK(member_of(R"([{"a":[1]},{"b":[[]]}])").all_elements_objects);
  CHECK(member_of(R"([{"a":[{}]}, {}])").all_elements_objects);
  CHECK_FALSE(member_of("[{},1]").all_elements_objects);
  CHECK_FALSE(member_of("[1,{}]").all_elements_objects);
  CHECK_FALSE(member_of("[{},[]]").all_elements_objects);
  CHECK_FALSE(member_of("[[{}]]").all_elements_objects);
  CHECK_FALSE(member_of("[null]").all_elements_objects);
  CHECK_FALSE(member_of("{}").all_elements_objects);
  CHECK_FALSE(member_of(R"({"a":[{}]})").all_elements_objects);
  CHECK_FALSE(member_of("1").all_elements_objects);
  CHECK_FALSE(member_of("\"[{}]\"").all_elements_objects);
  // 16+ objects: a wide header.
  std::string many = "[";
  for (int i = 0; i < 40; ++i) many += i ? ",{}" : "{}";
  CHECK(member_of(many + "]").all_elements_objects);
  CHECK_FALSE(member_of(many + ",0]").all_elements_objects);
}

TEST_CASE("duplicate keys: find() returns the last") {
  auto result = json_to_msgpack(R"({"a":1,"b":[],"a":{"z":2},"a":[3]})");
  REQUIRE(result.has_value());
  CHECK(result->members.size() == 4);
  const TopLevelMember* a = result->find("a");
  REQUIRE(a != nullptr);
  CHECK(a == &result->members[3]);
  CHECK(a->kind == JsonKind::kArray);
  CHECK(to_hex(result->value_bytes(*a)) == "9103");
  CHECK(to_hex(result->value_bytes(result->members[0])) == "01");
  CHECK(to_hex(result->value_bytes(result->members[2])) == "81a17a02");
  // The msgpack map keeps all four pairs, as Python's msgpack would.
  CHECK(to_hex(result->msgpack.view()) == "84a16101a16290a16181a17a02a1619103");
}

TEST_CASE("members only for a top-level object") {
  auto nested = json_to_msgpack(R"([{"a":1},{"b":2}])");
  REQUIRE(nested.has_value());
  CHECK(nested->members.empty());
  auto inner = json_to_msgpack(R"({"a":{"b":{"c":1}}})");
  REQUIRE(inner.has_value());
  REQUIRE(inner->members.size() == 1);
  CHECK(inner->members[0].key == "a");
  CHECK(inner->find("b") == nullptr);
  auto empty = json_to_msgpack("{}");
  REQUIRE(empty.has_value());
  CHECK(empty->members.empty());
}

// ===================================================================== minimality vs msgpack-c

TEST_CASE("msgpack-c re-packs our output to identical bytes") {
  std::vector<std::string> documents = {
      "null",
      "0",
      "-9223372036854775808",
      "18446744073709551615",
      // NOLINTNEXTLINE(bugprone-suspicious-missing-comma): one document over two lines
      "[0,127,128,255,256,65535,65536,4294967295,4294967296,-1,-32,-33,-128,-129,-32768,-32769,"
      "-2147483648,-2147483649]",
      "[1.5,-0.0,1e300,1E-5,0.1,5e-324]",
      R"({"init_info":{"master_address":"10.0.0.1","master_port":29500,"rank_offset":1,"world_size":2}})",
      R"({"update_info":{"names":["model.layers.0.weight","lm_head.weight"],"dtype_names":["bfloat16","bfloat16"],"shapes":[[4096,4096],[32000,4096]]}})",
      R"({"":"","\u0000":"\u0000","é":"\ud83d\ude00","\"":"\\"})",
      R"([[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]])",
      R"([{},[],"",0,false,null,{"a":[{"b":[{"c":{}}]}]}])",
      json_array_of_zeros(16),
      json_array_of_zeros(65536),
      "\"" + std::string(65536, 's') + "\"",
      "[\"" + std::string(31, 'a') + "\",\"" + std::string(32, 'b') + "\",\"" +
          std::string(255, 'c') + "\",\"" + std::string(256, 'd') + "\"]",
  };
  // A wide object whose values are wide arrays of wide strings.
  std::string wide = "{";
  for (int i = 0; i < 300; ++i) {
    if (i) wide += ",";
    wide += "\"key" + std::to_string(i) + "\":[";
    for (int j = 0; j < i % 20; ++j) wide += (j ? ",\"" : "\"") + std::string(i % 40, 'v') + "\"";
    wide += "]";
  }
  documents.push_back(wide + "}");
  for (const std::string& document : documents) {
    CAPTURE(document.substr(0, 80));
    const std::string bytes = transcode(document);
    CHECK(msgpack_c_repack(bytes) == bytes);
    // Without floats, plain msgpack::pack (no float special case) writes the same bytes.
    auto handle = decode(bytes);
    REQUIRE(handle.has_value());
    if (!contains_float(handle->get())) CHECK(msgpack_c_pack_plain(bytes) == bytes);
  }
}
