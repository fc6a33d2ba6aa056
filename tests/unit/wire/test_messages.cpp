// Engine-core wire messages (common/wire/messages.*): the byte-level test vectors of
// docs/engine-protocol.md §7 in both directions, then the decoder's tolerance and robustness.

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/messages.hpp"
#include "common/wire/msgpack_codec.hpp"
#include "tests/unit/wire/hex.hpp"

using namespace vllmd::wire;
using vllmd::test::from_hex;
using vllmd::test::SplitMix64;
using vllmd::test::text_hex;
using vllmd::test::to_hex;

namespace {

// ---- section 7 vectors, verbatim ----

constexpr std::string_view kStartRequest =
    "940001ae636f6c6c6563746976655f72706394b373746172745f7765696768745f757064617465c09080";
constexpr std::string_view kInitRequest =
    "940001ae636f6c6c6563746976655f72706394bb696e69745f7765696768745f7472616e736665725f656e67696e"
    "65c09081a9696e69745f696e666f84ae6d61737465725f61646472657373a831302e302e302e31ab6d61737465725f"
    "706f7274cd733cab72616e6b5f6f666673657401aa776f726c645f73697a6502";
constexpr std::string_view kSetVersionRequest =
    "940002b27365745f7765696768745f76657273696f6e91a7737465702d3432";
constexpr std::string_view kGetVersionRequest = "940003b26765745f7765696768745f76657273696f6e90";

constexpr std::string_view kInitArgsJson =
    R"(["init_weight_transfer_engine",null,[],{"init_info":{"master_address":"10.0.0.1","master_port":29500,"rank_offset":1,"world_size":2}}])";
constexpr std::string_view kStartArgsJson = R"(["start_weight_update",null,[],{}])";

constexpr double kTimestamp = 1234.5;
constexpr std::string_view kTimestampHex = "cb40934a0000000000";

constexpr std::string_view kReplyTp1Fields8 = "980090c0cb40934a00000000009301c092c091c0c0c0c0";
constexpr std::string_view kReplyTp1Fields5 = "950090c0cb40934a00000000009301c092c091c0";
constexpr std::string_view kReplyTp2 = "980090c0cb40934a00000000009304c092c092c0c0c0c0c0";
constexpr std::string_view kReplySetVersion = "980090c0cb40934a00000000009302c092c0c0c0c0c0";
constexpr std::string_view kReplyGetVersion =
    "980090c0cb40934a00000000009303c092c0a764656661756c74c0c0c0";
constexpr std::string_view kFailureMessage = "Call to collective_rpc method failed: boom";
const std::string kReplyFailure =
    "980090c0cb40934a00000000009301d92a" + text_hex(kFailureMessage) + "c0c0c0c0";

constexpr std::string_view kHello =
    "83a6737461747573a548454c4c4fa56c6f63616cc2a8686561646c657373c3";
constexpr std::string_view kReady =
    "83a6737461747573a55245414459a56c6f63616cc2a8686561646c657373c3";
constexpr std::string_view kInit =
    "82a961646472657373657385a6696e7075747391b47463703a2f2f3132372e302e302e313a35353535a76f757470"
    "75747391b47463703a2f2f3132372e302e302e313a35353536b1636f6f7264696e61746f725f696e707574c0b263"
    "6f6f7264696e61746f725f6f7574707574c0be66726f6e74656e645f73746174735f7075626c6973685f61646472"
    "657373c0af706172616c6c656c5f636f6e66696780";

std::string transcode(std::string_view json) {
  auto result = json_to_msgpack(json);
  REQUIRE_MESSAGE(result.has_value(), (result ? std::string() : result.error().describe()));
  return result->msgpack.str();
}

CallId id(std::uint64_t value) { return CallId{value, false}; }
CallId negative_id(std::int64_t value) { return CallId{static_cast<std::uint64_t>(value), true}; }

UtilityOutput ok_output(CallId call_id, std::string value_msgpack) {
  UtilityOutput output;
  output.call_id = call_id;
  output.value_msgpack = std::move(value_msgpack);
  return output;
}

UtilityOutput failed_output(CallId call_id, std::string message) {
  UtilityOutput output;
  output.call_id = call_id;
  output.failure_message = std::move(message);
  return output;
}

// Writes an EngineCoreOutputs array by hand: the given utility_output bytes at index 4 and
// arbitrary (non-nil) junk in every extra field, to prove the decoder ignores what it skips.
std::string outputs_frame(std::size_t fields, std::string_view utility_hex,
                          std::string_view engine_index_hex = "00") {
  StringBuffer buffer;
  Packer packer(buffer);
  packer.pack_array(static_cast<std::uint32_t>(fields));
  std::string bytes = buffer.take();
  if (fields > 0) bytes += from_hex(engine_index_hex);
  if (fields > 1) bytes += from_hex("90");
  if (fields > 2) bytes += from_hex("c0");
  if (fields > 3) bytes += from_hex(kTimestampHex);
  if (fields > 4) bytes += from_hex(utility_hex);
  for (std::size_t i = 5; i < fields; ++i) {
    switch (i % 4) {
      case 0: bytes += from_hex("92a3616263c3"); break;        // ["abc", true]
      case 1: bytes += from_hex("81a16101"); break;            // {"a": 1}
      case 2: bytes += from_hex("cb3ff8000000000000"); break;  // 1.5
      default: bytes += from_hex("ce00010000"); break;         // 65536
    }
  }
  return bytes;
}

EngineCoreOutputs decode_ok(std::string_view frame, const DecodeLimits& limits = {}) {
  auto decoded = decode_engine_core_outputs(frame, limits);
  REQUIRE_MESSAGE(decoded.has_value(), (decoded ? std::string() : decoded.error()));
  return *decoded;
}

// Every decoder must return an error (or a value) for any input, never throw or crash.
void decode_everything(std::string_view frame) {
  CHECK_NOTHROW((void)decode_engine_core_outputs(frame));
  CHECK_NOTHROW((void)decode_utility_request(frame));
  CHECK_NOTHROW((void)decode_registration(frame));
  CHECK_NOTHROW((void)decode_handshake_status(frame));
  CHECK_NOTHROW((void)decode_init(frame));
}

void expect_all_errors(std::string_view frame) {
  CHECK_FALSE(decode_engine_core_outputs(frame).has_value());
  CHECK_FALSE(decode_utility_request(frame).has_value());
  CHECK_FALSE(decode_handshake_status(frame).has_value());
  CHECK_FALSE(decode_init(frame).has_value());
  if (!frame.empty()) CHECK_FALSE(decode_registration(frame).has_value());
}

}  // namespace

// ===================================================================================== requests

TEST_CASE("request type bytes and the dead-engine sentinel") {
  CHECK(static_cast<int>(RequestType::kAdd) == 0x00);
  CHECK(static_cast<int>(RequestType::kAbort) == 0x01);
  CHECK(static_cast<int>(RequestType::kStartDpWave) == 0x02);
  CHECK(static_cast<int>(RequestType::kUtility) == 0x03);

  CHECK(kEngineCoreDead.size() == 16);
  CHECK(std::string(kEngineCoreDead) == "ENGINE_CORE_DEAD");
  CHECK(to_hex(kEngineCoreDead) == "454e47494e455f434f52455f44454144");
  // The sentinel is not an EngineCoreOutputs (0x45 is a fixint followed by trailing bytes).
  CHECK_FALSE(decode_engine_core_outputs(kEngineCoreDead).has_value());
}

TEST_CASE("engine identity is the rank as two little-endian bytes") {
  CHECK(to_hex(engine_identity(0)) == "0000");
  CHECK(to_hex(engine_identity(1)) == "0100");
  CHECK(to_hex(engine_identity(258)) == "0201");
  CHECK(to_hex(engine_identity(65535)) == "ffff");
  CHECK(engine_identity(7).size() == 2);

  CHECK(rank_from_identity(from_hex("0000")) == 0);
  CHECK(rank_from_identity(from_hex("0100")) == 1);
  CHECK(rank_from_identity(from_hex("0201")) == 258);
  CHECK(rank_from_identity(from_hex("ffff")) == 65535);
  for (int rank : {0, 1, 2, 7, 255, 256, 258, 1000, 65535}) {
    CHECK(rank_from_identity(engine_identity(rank)) == rank);
  }
  CHECK_FALSE(rank_from_identity("").has_value());
  CHECK_FALSE(rank_from_identity(from_hex("01")).has_value());
  CHECK_FALSE(rank_from_identity(from_hex("010000")).has_value());
  CHECK_FALSE(rank_from_identity("engine-a").has_value());
}

TEST_CASE("UTILITY request vectors encode byte for byte") {
  SUBCASE("start_weight_update") {
    const std::string args = transcode(kStartArgsJson);
    CHECK(to_hex(args) == "94b373746172745f7765696768745f757064617465c09080");
    CHECK(to_hex(encode_utility_request(0, id(1), "collective_rpc", args)) == kStartRequest);
  }
  SUBCASE("init_weight_transfer_engine, args transcoded from JSON") {
    const std::string args = transcode(kInitArgsJson);
    CHECK(to_hex(encode_utility_request(0, id(1), "collective_rpc", args)) == kInitRequest);
  }
  SUBCASE("set_weight_version") {
    const std::string args = encode_string_array({"step-42"});
    CHECK(to_hex(args) == "91a7737465702d3432");
    CHECK(to_hex(encode_utility_request(0, id(2), "set_weight_version", args)) ==
          kSetVersionRequest);
    CHECK(to_hex(encode_utility_request(0, id(2), "set_weight_version",
                                        transcode(R"(["step-42"])"))) == kSetVersionRequest);
  }
  SUBCASE("get_weight_version") {
    CHECK(to_hex(encode_string_array({})) == "90");
    CHECK(to_hex(encode_utility_request(0, id(3), "get_weight_version", encode_string_array({}))) ==
          kGetVersionRequest);
  }
}

TEST_CASE("UTILITY request vectors decode") {
  struct Vector {
    std::string_view hex;
    std::uint64_t call_id;
    std::string_view method;
    std::string args_hex;
  };
  const std::vector<Vector> vectors = {
      {kStartRequest, 1, "collective_rpc", to_hex(transcode(kStartArgsJson))},
      {kInitRequest, 1, "collective_rpc", to_hex(transcode(kInitArgsJson))},
      {kSetVersionRequest, 2, "set_weight_version", "91a7737465702d3432"},
      {kGetVersionRequest, 3, "get_weight_version", "90"},
  };
  for (const Vector& vector : vectors) {
    CAPTURE(vector.hex);
    const std::string payload = from_hex(vector.hex);
    auto request = decode_utility_request(payload);
    REQUIRE_MESSAGE(request.has_value(), (request ? std::string() : request.error()));
    CHECK(request->client_index == 0);
    CHECK(request->call_id == id(vector.call_id));
    CHECK(request->method == vector.method);
    CHECK(to_hex(request->args_msgpack) == vector.args_hex);
    // And back again.
    CHECK(to_hex(encode_utility_request(request->client_index, request->call_id, request->method,
                                        request->args_msgpack)) == vector.hex);
  }
}

TEST_CASE("UTILITY request round trip keeps call id signedness and client index") {
  const std::string args = transcode(R"(["x",1.5,[-1,18446744073709551615],{"k":null}])");
  struct Case {
    CallId call_id;
    std::string_view id_hex;
  };
  const std::vector<Case> cases = {
      {id(0), "00"},
      {id(5), "05"},
      {id(127), "7f"},
      {id(128), "cc80"},
      {id(0xffffffffULL), "ceffffffff"},
      {id(std::numeric_limits<std::uint64_t>::max()), "cfffffffffffffffff"},
      {negative_id(-1), "ff"},
      {negative_id(-32), "e0"},
      {negative_id(-128), "d080"},
      {negative_id(std::numeric_limits<std::int64_t>::min()), "d38000000000000000"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.id_hex);
    const std::string payload = encode_utility_request(7, c.call_id, "m", args);
    CHECK(to_hex(payload) == "9407" + std::string(c.id_hex) + "a16d" + to_hex(args));
    auto request = decode_utility_request(payload);
    REQUIRE(request.has_value());
    CHECK(request->client_index == 7);
    CHECK(request->call_id == c.call_id);
    CHECK(request->call_id.negative == c.call_id.negative);
    CHECK(request->method == "m");
    CHECK(request->args_msgpack == args);
  }
  const std::string big_client =
      encode_utility_request(std::numeric_limits<std::uint64_t>::max(), id(1), "m", from_hex("90"));
  CHECK(to_hex(big_client) == "94cfffffffffffffffff01a16d90");
  CHECK(decode_utility_request(big_client)->client_index ==
        std::numeric_limits<std::uint64_t>::max());
}

TEST_CASE("UTILITY request decoder rejects malformed payloads") {
  const std::vector<std::string_view> bad = {
      "",                // empty
      "c0",              // nil
      "80",              // map
      "93000161",        // array of 3
      "9500016190c0",    // array of 5
      "94ff01a16d90",    // negative client_index
      "94a13001a16d90",  // string client_index
      "9400a131a16d90",  // string call_id
      "9400c0a16d90",    // nil call_id
      "9400010190",      // integer method
      "940001a16dc0",    // nil args
      "940001a16d80",    // map args
      "940001a16da0",    // string args
      "940001a16d90c0",  // trailing bytes
      "940001a16d91",    // truncated args
  };
  for (std::string_view hex : bad) {
    CAPTURE(hex);
    CHECK_FALSE(decode_utility_request(from_hex(hex)).has_value());
  }
}

// ====================================================================================== replies

TEST_CASE("EngineCoreOutputs vectors encode byte for byte") {
  CHECK(to_hex(encode_engine_core_outputs(0, ok_output(id(1), from_hex("91c0")), kTimestamp, 8)) ==
        kReplyTp1Fields8);
  CHECK(to_hex(encode_engine_core_outputs(0, ok_output(id(1), from_hex("91c0")), kTimestamp, 5)) ==
        kReplyTp1Fields5);
  CHECK(to_hex(encode_engine_core_outputs(0, ok_output(id(1), from_hex("91c0")), kTimestamp)) ==
        kReplyTp1Fields8);  // 8 fields by default, as msgspec writes them
  CHECK(to_hex(encode_engine_core_outputs(0, ok_output(id(4), from_hex("92c0c0")), kTimestamp,
                                          8)) == kReplyTp2);
  CHECK(to_hex(encode_engine_core_outputs(0, ok_output(id(2), from_hex("c0")), kTimestamp, 8)) ==
        kReplySetVersion);
  UtilityOutput none;  // default value is nil
  none.call_id = id(2);
  CHECK(to_hex(none.value_msgpack) == "c0");
  CHECK(to_hex(encode_engine_core_outputs(0, none, kTimestamp, 8)) == kReplySetVersion);
  CHECK(to_hex(encode_engine_core_outputs(0, ok_output(id(3), transcode(R"("default")")),
                                          kTimestamp, 8)) == kReplyGetVersion);
  CHECK(to_hex(encode_engine_core_outputs(0, failed_output(id(1), std::string(kFailureMessage)),
                                          kTimestamp, 8)) == kReplyFailure);
  // Fewer than 5 fields is never written.
  CHECK(to_hex(encode_engine_core_outputs(0, ok_output(id(1), from_hex("91c0")), kTimestamp, 3)) ==
        kReplyTp1Fields5);
}

TEST_CASE("EngineCoreOutputs vectors decode") {
  struct Vector {
    std::string hex;
    std::uint64_t call_id;
    std::optional<std::string_view> failure;
    std::string_view value_hex;
    int fields;
  };
  const std::vector<Vector> vectors = {
      {std::string(kReplyTp1Fields8), 1, std::nullopt, "91c0", 8},
      {std::string(kReplyTp1Fields5), 1, std::nullopt, "91c0", 5},
      {std::string(kReplyTp2), 4, std::nullopt, "92c0c0", 8},
      {std::string(kReplySetVersion), 2, std::nullopt, "c0", 8},
      {std::string(kReplyGetVersion), 3, std::nullopt, "a764656661756c74", 8},
      {kReplyFailure, 1, kFailureMessage, "c0", 8},
  };
  for (const Vector& vector : vectors) {
    CAPTURE(vector.hex);
    const std::string frame = from_hex(vector.hex);
    const EngineCoreOutputs outputs = decode_ok(frame);
    CHECK(outputs.engine_index == 0);
    REQUIRE(outputs.utility_output.has_value());
    const UtilityOutput& output = *outputs.utility_output;
    CHECK(output.call_id == id(vector.call_id));
    CHECK(output.failure_message == vector.failure);
    CHECK(to_hex(output.value_msgpack) == vector.value_hex);
    // Re-encoding what was decoded gives the vector back.
    CHECK(to_hex(encode_engine_core_outputs(outputs.engine_index, output, kTimestamp,
                                            vector.fields)) == vector.hex);
  }
}

TEST_CASE("EngineCoreOutputs of any length >= 5 decode, extra fields ignored") {
  for (std::size_t fields : {5, 6, 7, 8, 12, 16, 40}) {
    CAPTURE(fields);
    const EngineCoreOutputs outputs = decode_ok(outputs_frame(fields, "9309c092c0a26f6b", "03"));
    CHECK(outputs.engine_index == 3);
    REQUIRE(outputs.utility_output.has_value());
    CHECK(outputs.utility_output->call_id == id(9));
    CHECK_FALSE(outputs.utility_output->failure_message.has_value());
    CHECK(to_hex(outputs.utility_output->value_msgpack) == "a26f6b");
  }
  for (std::size_t fields : {0, 1, 2, 3, 4}) {
    CAPTURE(fields);
    CHECK_FALSE(decode_engine_core_outputs(outputs_frame(fields, "9309c092c0a26f6b")).has_value());
  }
  CHECK_FALSE(decode_engine_core_outputs(from_hex("940090c0cb40934a0000000000")).has_value());
  // Not an array at all.
  CHECK_FALSE(decode_engine_core_outputs(from_hex("85a16100a16200a16300a16400a16500")).has_value());
  CHECK_FALSE(decode_engine_core_outputs(from_hex("c0")).has_value());
  CHECK_FALSE(decode_engine_core_outputs(from_hex("a5")).has_value());
}

TEST_CASE("encode_engine_core_outputs writes the requested number of fields") {
  for (int fields : {5, 6, 8, 12, 15, 16, 20}) {
    CAPTURE(fields);
    const std::string frame = encode_engine_core_outputs(2, ok_output(id(1), "\xc3"), 0.5, fields);
    auto handle = decode(frame);
    REQUIRE(handle.has_value());
    REQUIRE(handle->get().type == msgpack::type::ARRAY);
    CHECK(handle->get().via.array.size == static_cast<std::uint32_t>(fields));
    // Minimal width, as msgpack-c would write it.
    CHECK(encode_object(handle->get()) == frame);
    const EngineCoreOutputs outputs = decode_ok(frame);
    CHECK(outputs.engine_index == 2);
    CHECK(to_hex(outputs.utility_output->value_msgpack) == "c3");
  }
}

TEST_CASE("EngineCoreOutputs call ids keep their signedness") {
  struct Case {
    CallId call_id;
    std::string_view id_hex;
  };
  const std::vector<Case> cases = {
      {id(0), "00"},
      {id(1), "01"},
      {id(0x7f), "7f"},
      {id(0x80), "cc80"},
      {id(0xffff), "cdffff"},
      {id(0x10000), "ce00010000"},
      {id(0x100000000ULL), "cf0000000100000000"},
      {id(0x8000000000000000ULL), "cf8000000000000000"},
      {id(std::numeric_limits<std::uint64_t>::max()), "cfffffffffffffffff"},
      {negative_id(-1), "ff"},
      {negative_id(-33), "d0df"},
      {negative_id(-128), "d080"},
      {negative_id(-129), "d1ff7f"},
      {negative_id(std::numeric_limits<std::int32_t>::min()), "d280000000"},
      {negative_id(std::numeric_limits<std::int64_t>::min()), "d38000000000000000"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.id_hex);
    const std::string frame = encode_engine_core_outputs(0, ok_output(c.call_id, "\xc0"), 1.0);
    CHECK(to_hex(frame) ==
          "980090c0cb3ff0000000000000"
          "93" +
              std::string(c.id_hex) +
              "c092c0c0"
              "c0c0c0");
    const EngineCoreOutputs outputs = decode_ok(frame);
    REQUIRE(outputs.utility_output.has_value());
    CHECK(outputs.utility_output->call_id == c.call_id);
    CHECK(outputs.utility_output->call_id.negative == c.call_id.negative);
  }
  // uint64 max and -1 share their bits but are different ids.
  CHECK_FALSE(id(std::numeric_limits<std::uint64_t>::max()) == negative_id(-1));

  SUBCASE("non-minimal integer encodings from other writers") {
    struct Wide {
      std::string_view id_hex;
      CallId expected;
    };
    for (const Wide& wide : std::vector<Wide>{
             {"cf0000000000000005", id(5)},
             {"d30000000000000005", id(5)},
             {"d000", id(0)},
             {"d3ffffffffffffffff", negative_id(-1)},
             {"d1ff80", negative_id(-128)},
             {"d3ffffffff80000000", negative_id(std::numeric_limits<std::int32_t>::min())},
         }) {
      CAPTURE(wide.id_hex);
      const EngineCoreOutputs outputs =
          decode_ok(outputs_frame(5, "93" + std::string(wide.id_hex) + "c092c0c0"));
      CHECK(outputs.utility_output->call_id == wide.expected);
    }
  }
}

TEST_CASE("utility results: [nil, nil], bare nil, failures") {
  SUBCASE("[type_info, nil] gives a nil value") {
    const EngineCoreOutputs outputs = decode_ok(outputs_frame(5, "9301c092c0c0"));
    CHECK(to_hex(outputs.utility_output->value_msgpack) == "c0");
    CHECK_FALSE(outputs.utility_output->failure_message.has_value());
  }
  SUBCASE("bare nil result gives a nil value") {
    const EngineCoreOutputs outputs = decode_ok(outputs_frame(5, "9301c0c0"));
    REQUIRE(outputs.utility_output.has_value());
    CHECK(to_hex(outputs.utility_output->value_msgpack) == "c0");
    CHECK_FALSE(outputs.utility_output->failure_message.has_value());
  }
  SUBCASE("type_info is ignored") {
    const EngineCoreOutputs outputs = decode_ok(outputs_frame(5, "9301c092a46c697374c3"));
    CHECK(to_hex(outputs.utility_output->value_msgpack) == "c3");
  }
  SUBCASE("values are re-encoded whole") {
    const std::string value =
        transcode(R"({"a":[1,2.5,"x",null,{"b":-7}],"c":18446744073709551615})");
    const EngineCoreOutputs outputs = decode_ok(outputs_frame(8, "9301c092c0" + to_hex(value)));
    CHECK(outputs.utility_output->value_msgpack == value);
  }
  SUBCASE("failure with a nil result") {
    const EngineCoreOutputs outputs =
        decode_ok(outputs_frame(5, "9305b4536572766572207368757474696e6720646f776ec0"));
    REQUIRE(outputs.utility_output.has_value());
    CHECK(outputs.utility_output->call_id == id(5));
    CHECK(outputs.utility_output->failure_message == "Server shutting down");
    CHECK(to_hex(outputs.utility_output->value_msgpack) == "c0");
  }
  SUBCASE("empty failure message is still a failure") {
    const EngineCoreOutputs outputs = decode_ok(outputs_frame(5, "9305a0c0"));
    CHECK(outputs.utility_output->failure_message == "");
  }
  SUBCASE("utility_output with extra trailing elements") {
    const EngineCoreOutputs outputs = decode_ok(outputs_frame(5, "9406c092c0c3a3616263"));
    CHECK(outputs.utility_output->call_id == id(6));
    CHECK(to_hex(outputs.utility_output->value_msgpack) == "c3");
  }
  SUBCASE("non-utility replies are ignored") {
    for (std::size_t fields : {5, 8, 12}) {
      const EngineCoreOutputs outputs = decode_ok(outputs_frame(fields, "c0", "01"));
      CHECK(outputs.engine_index == 1);
      CHECK_FALSE(outputs.utility_output.has_value());
    }
    // A request-output reply: outputs non-empty, stats present, utility nil.
    const EngineCoreOutputs outputs =
        decode_ok(from_hex("980092a178a1799101cb40934a0000000000c0c0c0c0"));
    CHECK_FALSE(outputs.utility_output.has_value());
  }
  SUBCASE("malformed utility outputs are errors") {
    for (std::string_view utility : {
             "a3616263",                  // a string
             "01",                        // an integer
             "80",                        // a map
             "90",                        // empty array
             "9201c0",                    // two elements
             "93a131c0c0",                // string call id
             "93c0c0c0",                  // nil call id
             "93cb3ff0000000000000c0c0",  // float call id
             "930101c0",                  // integer failure message
             "9301c3c0",                  // bool failure message
             "9301c091c0",                // result array of 1
             "9301c093c0c0c0",            // result array of 3
             "9301c0a3616263",            // result a string
             "9301c080",                  // result a map
         }) {
      CAPTURE(utility);
      CHECK_FALSE(decode_engine_core_outputs(outputs_frame(5, utility)).has_value());
    }
  }
}

// ===================================================================================== handshake

TEST_CASE("HELLO, READY and INIT vectors") {
  CHECK(to_hex(encode_handshake_status({"HELLO", false, true})) == kHello);
  CHECK(to_hex(encode_handshake_status({"READY", false, true})) == kReady);
  CHECK(to_hex(encode_init({{"tcp://127.0.0.1:5555"}, {"tcp://127.0.0.1:5556"}})) == kInit);

  auto hello = decode_handshake_status(from_hex(kHello));
  REQUIRE(hello.has_value());
  CHECK(hello->status == "HELLO");
  CHECK_FALSE(hello->local);
  CHECK(hello->headless);

  auto ready = decode_handshake_status(from_hex(kReady));
  REQUIRE(ready.has_value());
  CHECK(ready->status == "READY");
  CHECK_FALSE(ready->local);
  CHECK(ready->headless);

  auto init = decode_init(from_hex(kInit));
  REQUIRE(init.has_value());
  CHECK(init->inputs == std::vector<std::string>{"tcp://127.0.0.1:5555"});
  CHECK(init->outputs == std::vector<std::string>{"tcp://127.0.0.1:5556"});
}

TEST_CASE("handshake status decoding tolerates unknown and missing keys") {
  for (bool local : {false, true}) {
    for (bool headless : {false, true}) {
      auto decoded = decode_handshake_status(encode_handshake_status({"HELLO", local, headless}));
      REQUIRE(decoded.has_value());
      CHECK(decoded->status == "HELLO");
      CHECK(decoded->local == local);
      CHECK(decoded->headless == headless);
    }
  }
  SUBCASE("extra keys, in another order") {
    // {"parallel_config_hash": "abc", "headless": true, "num_gpu_blocks": 100, "status": "READY",
    //  "local": true}
    StringBuffer buffer;
    Packer packer(buffer);
    packer.pack_map(5);
    pack_str(packer, "parallel_config_hash");
    pack_str(packer, "abc");
    pack_str(packer, "headless");
    packer.pack(true);
    pack_str(packer, "num_gpu_blocks");
    packer.pack(100);
    pack_str(packer, "status");
    pack_str(packer, "READY");
    pack_str(packer, "local");
    packer.pack(true);
    auto decoded = decode_handshake_status(buffer.take());
    REQUIRE(decoded.has_value());
    CHECK(decoded->status == "READY");
    CHECK(decoded->local);
    CHECK(decoded->headless);
  }
  SUBCASE("missing flags default to false") {
    auto decoded = decode_handshake_status(from_hex("81a6737461747573a548454c4c4f"));
    REQUIRE(decoded.has_value());
    CHECK(decoded->status == "HELLO");
    CHECK_FALSE(decoded->local);
    CHECK_FALSE(decoded->headless);
  }
  SUBCASE("non-bool flags read as false") {
    auto decoded = decode_handshake_status(from_hex("82a6737461747573a548454c4c4fa56c6f63616c01"));
    REQUIRE(decoded.has_value());
    CHECK_FALSE(decoded->local);
  }
  SUBCASE("errors") {
    for (std::string_view hex : {
             "",
             "80",                              // no status
             "81a673746174757301",              // status not a string
             "81a6737461747573c0",              // status nil
             "91a548454c4c4f",                  // an array
             "a548454c4c4f",                    // a bare string
             "81a6737461747573a548454c4c",      // truncated
             "81a6737461747573a548454c4c4fc0",  // trailing bytes
         }) {
      CAPTURE(hex);
      CHECK_FALSE(decode_handshake_status(from_hex(hex)).has_value());
    }
  }
}

// INIT for coordinated DP, as vLLM's frontend writes it for master 10.0.0.1:29500, port list
// [41000..41003], DP size 2 (Python's msgpack packing the same dict, key order kept).
constexpr std::string_view kInitWithMaster =
    "82a961646472657373657385a6696e7075747391b47463703a2f2f3132372e302e302e313a35353535a76f7574"
    "7075747391b47463703a2f2f3132372e302e302e313a35353536b1636f6f7264696e61746f725f696e707574c0"
    "b2636f6f7264696e61746f725f6f7574707574c0be66726f6e74656e645f73746174735f7075626c6973685f61"
    "646472657373c0af706172616c6c656c5f636f6e66696784b7646174615f706172616c6c656c5f6d6173746572"
    "5f6970a831302e302e302e31b9646174615f706172616c6c656c5f6d61737465725f706f7274cd733cbf5f6461"
    "74615f706172616c6c656c5f6d61737465725f706f72745f6c69737494cda028cda029cda02acda02bb2646174"
    "615f706172616c6c656c5f73697a6502";

TEST_CASE("INIT carries the DP master of coordinated DP in parallel_config") {
  const DataParallelMaster master{"10.0.0.1", 29500, {41000, 41001, 41002, 41003}, 2};
  const InitMessage addresses{{"tcp://127.0.0.1:5555"}, {"tcp://127.0.0.1:5556"}};
  CHECK(to_hex(encode_init(addresses, master)) == kInitWithMaster);
  CHECK(to_hex(encode_init(addresses, std::nullopt)) == kInit);  // dense: {}

  auto decoded = decode_init(from_hex(kInitWithMaster));
  REQUIRE(decoded.has_value());
  CHECK(decoded->inputs == addresses.inputs);
  CHECK(decode_init_data_parallel_master(from_hex(kInitWithMaster)) == master);
  CHECK_FALSE(decode_init_data_parallel_master(from_hex(kInit)).has_value());

  // A master is all four keys of the types vLLM sends, or none at all.
  const auto with_config = [](const std::function<void(Packer&)>& config) {
    StringBuffer buffer;
    Packer packer(buffer);
    packer.pack_map(2);
    pack_str(packer, "addresses");
    packer.pack_map(2);
    for (const char* key : {"inputs", "outputs"}) {
      pack_str(packer, key);
      packer.pack_array(1);
      pack_str(packer, "tcp://a:1");
    }
    pack_str(packer, "parallel_config");
    config(packer);
    return buffer.take();
  };
  const std::string partial = with_config([](Packer& packer) {
    packer.pack_map(1);
    pack_str(packer, "data_parallel_master_ip");
    pack_str(packer, "10.0.0.1");
  });
  CHECK(decode_init(partial).has_value());
  CHECK_FALSE(decode_init_data_parallel_master(partial).has_value());
  const std::string string_ports = with_config([](Packer& packer) {
    packer.pack_map(4);
    pack_str(packer, "data_parallel_master_ip");
    pack_str(packer, "10.0.0.1");
    pack_str(packer, "data_parallel_master_port");
    pack_str(packer, "29500");
    pack_str(packer, "_data_parallel_master_port_list");
    packer.pack_array(0);
    pack_str(packer, "data_parallel_size");
    packer.pack(2);
  });
  CHECK_FALSE(decode_init_data_parallel_master(string_ports).has_value());
  CHECK_FALSE(decode_init_data_parallel_master("not msgpack").has_value());
}

TEST_CASE("DP master ports are derived as ParallelConfig derives them") {
  // __post_init__: the last of five open ports becomes the master port.
  DataParallelMaster master = split_master_ports("10.0.0.1", {5001, 5002, 5003, 5004, 5005}, 4);
  CHECK(master == DataParallelMaster{"10.0.0.1", 5005, {5001, 5002, 5003, 5004}, 4});
  // get_next_dp_init_port: pops the list from its end, then counts up from the master port.
  CHECK(next_dp_init_port(master) == 5004);
  CHECK(next_dp_init_port(master) == 5003);
  CHECK(next_dp_init_port(master) == 5002);
  CHECK(next_dp_init_port(master) == 5001);
  CHECK(next_dp_init_port(master) == 5005);
  CHECK(next_dp_init_port(master) == 5006);
  CHECK(master.port == 5007);

  auto picked = pick_data_parallel_master("127.0.0.1", 2);
  REQUIRE(picked.has_value());
  CHECK(picked->ip == "127.0.0.1");
  CHECK(picked->data_parallel_size == 2);
  REQUIRE(picked->port_list.size() == 4);
  std::set<std::int64_t> distinct(picked->port_list.begin(), picked->port_list.end());
  distinct.insert(picked->port);
  CHECK(distinct.size() == 5);
  for (std::int64_t port : distinct) CHECK((port > 0 && port < 65536));
}

TEST_CASE("INIT round trip and validation") {
  InitMessage message;
  message.inputs = {"tcp://10.0.0.5:40001", "ipc:///tmp/vllmd-in"};
  message.outputs = {"tcp://10.0.0.5:40002", "ipc:///tmp/vllmd-out"};
  auto decoded = decode_init(encode_init(message));
  REQUIRE(decoded.has_value());
  CHECK(decoded->inputs == message.inputs);
  CHECK(decoded->outputs == message.outputs);

  // Python writes the same map with another key order and extra keys.
  {
    StringBuffer buffer;
    Packer packer(buffer);
    packer.pack_map(3);
    pack_str(packer, "parallel_config");
    packer.pack_map(1);
    pack_str(packer, "data_parallel_master_port");
    packer.pack(1234);
    pack_str(packer, "extra");
    packer.pack_nil();
    pack_str(packer, "addresses");
    packer.pack_map(3);
    pack_str(packer, "outputs");
    packer.pack_array(1);
    pack_str(packer, "tcp://b:2");
    pack_str(packer, "coordinator_input");
    pack_str(packer, "tcp://c:3");
    pack_str(packer, "inputs");
    packer.pack_array(1);
    pack_str(packer, "tcp://a:1");
    auto python = decode_init(buffer.take());
    REQUIRE(python.has_value());
    CHECK(python->inputs == std::vector<std::string>{"tcp://a:1"});
    CHECK(python->outputs == std::vector<std::string>{"tcp://b:2"});
  }

  CHECK_FALSE(decode_init(encode_init({{}, {}})).has_value());                 // empty lists
  CHECK_FALSE(decode_init(encode_init({{"a", "b"}, {"c"}})).has_value());      // unequal
  CHECK_FALSE(decode_init(from_hex("80")).has_value());                        // no addresses
  CHECK_FALSE(decode_init(from_hex("81a9616464726573736573c0")).has_value());  // nil addresses
  CHECK_FALSE(decode_init(from_hex("81a961646472657373657390")).has_value());  // array
  CHECK_FALSE(decode_init(from_hex("90")).has_value());                        // not a map
  // inputs holds a non-string
  CHECK_FALSE(
      decode_init(from_hex("81a961646472657373657382a6696e707574739101a76f75747075747391a178"))
          .has_value());
  // outputs missing
  CHECK_FALSE(decode_init(from_hex("81a961646472657373657381a6696e707574739101")).has_value());
}

// ================================================================================= registration

TEST_CASE("registration frames") {
  SUBCASE("empty frame from older engines") {
    auto registration = decode_registration("");
    REQUIRE(registration.has_value());
    CHECK(registration->empty);
    CHECK_FALSE(registration->world_size.has_value());
    CHECK_FALSE(registration->weight_transfer_backend.has_value());
    CHECK_FALSE(registration->supports_draft_weight_updates.has_value());
    CHECK(encode_registration(Registration{}).empty());
  }
  SUBCASE("full map with unknown keys") {
    StringBuffer buffer;
    Packer packer(buffer);
    packer.pack_map(15);
    pack_str(packer, "max_model_len");
    packer.pack(4096);
    pack_str(packer, "num_gpu_blocks");
    packer.pack(12345);
    pack_str(packer, "block_size");
    packer.pack(16);
    pack_str(packer, "dtype");
    pack_str(packer, "bfloat16");
    pack_str(packer, "vllm_version");
    pack_str(packer, "0.11.1");
    pack_str(packer, "world_size");
    packer.pack(4);
    pack_str(packer, "data_parallel_size");
    packer.pack(2);
    pack_str(packer, "tensor_parallel_size");
    packer.pack(2);
    pack_str(packer, "pipeline_parallel_size");
    packer.pack(2);
    pack_str(packer, "data_parallel_rank");
    packer.pack(1);
    pack_str(packer, "weight_transfer_backend");
    pack_str(packer, "nccl");
    pack_str(packer, "enable_sleep_mode");
    packer.pack(false);
    pack_str(packer, "supports_draft_weight_updates");
    packer.pack(true);
    packer.pack(42);  // a non-string key
    pack_str(packer, "ignored");
    pack_str(packer, "nested");
    packer.pack_map(1);
    pack_str(packer, "world_size");
    packer.pack(99);
    auto registration = decode_registration(buffer.take());
    REQUIRE(registration.has_value());
    CHECK_FALSE(registration->empty);
    CHECK(registration->world_size == 4);
    CHECK(registration->data_parallel_size == 2);
    CHECK(registration->tensor_parallel_size == 2);
    CHECK(registration->pipeline_parallel_size == 2);
    CHECK(registration->data_parallel_rank == 1);
    CHECK(registration->vllm_version == "0.11.1");
    CHECK(registration->max_model_len == 4096);
    CHECK(registration->weight_transfer_backend == "nccl");
    CHECK(registration->supports_draft_weight_updates == true);
  }
  SUBCASE("map with missing and mistyped keys") {
    StringBuffer buffer;
    Packer packer(buffer);
    packer.pack_map(4);
    pack_str(packer, "world_size");
    pack_str(packer, "four");
    pack_str(packer, "weight_transfer_backend");
    packer.pack_nil();
    pack_str(packer, "supports_draft_weight_updates");
    packer.pack(1);
    pack_str(packer, "tensor_parallel_size");
    packer.pack(std::numeric_limits<std::uint64_t>::max());  // beyond int64
    auto registration = decode_registration(buffer.take());
    REQUIRE(registration.has_value());
    CHECK_FALSE(registration->empty);
    CHECK_FALSE(registration->world_size.has_value());
    CHECK_FALSE(registration->data_parallel_size.has_value());
    CHECK_FALSE(registration->tensor_parallel_size.has_value());
    CHECK_FALSE(registration->vllm_version.has_value());
    CHECK_FALSE(registration->weight_transfer_backend.has_value());
    CHECK_FALSE(registration->supports_draft_weight_updates.has_value());
  }
  SUBCASE("empty map is not the empty frame") {
    auto registration = decode_registration(from_hex("80"));
    REQUIRE(registration.has_value());
    CHECK_FALSE(registration->empty);
    CHECK_FALSE(registration->world_size.has_value());
  }
  SUBCASE("round trip") {
    Registration full;
    full.empty = false;
    full.world_size = 8;
    full.data_parallel_size = 4;
    full.tensor_parallel_size = 4;
    full.pipeline_parallel_size = 2;
    full.decode_context_parallel_size = 1;
    full.data_parallel_rank = 3;
    full.vllm_version = "0.11.1rc2";
    full.max_model_len = 131072;
    full.weight_transfer_backend = "ipc";
    full.supports_draft_weight_updates = false;
    auto decoded = decode_registration(encode_registration(full));
    REQUIRE(decoded.has_value());
    CHECK_FALSE(decoded->empty);
    CHECK(decoded->world_size == 8);
    CHECK(decoded->data_parallel_size == 4);
    CHECK(decoded->tensor_parallel_size == 4);
    CHECK(decoded->pipeline_parallel_size == 2);
    CHECK(decoded->decode_context_parallel_size == 1);
    CHECK(decoded->data_parallel_rank == 3);
    CHECK(decoded->max_model_len == 131072);
    CHECK(decoded->vllm_version == "0.11.1rc2");
    CHECK(decoded->weight_transfer_backend == "ipc");
    CHECK(decoded->supports_draft_weight_updates == false);

    Registration sparse;
    sparse.empty = false;
    sparse.world_size = -1;
    const std::string bytes = encode_registration(sparse);
    // {"world_size": -1, "weight_transfer_backend": nil}
    CHECK(to_hex(bytes) ==
          "82aa776f726c645f73697a65ff"
          "b7" +
              text_hex("weight_transfer_backend") + "c0");
    auto sparse_decoded = decode_registration(bytes);
    REQUIRE(sparse_decoded.has_value());
    CHECK(sparse_decoded->world_size == -1);
    CHECK_FALSE(sparse_decoded->data_parallel_size.has_value());
    CHECK_FALSE(sparse_decoded->weight_transfer_backend.has_value());
    CHECK_FALSE(sparse_decoded->supports_draft_weight_updates.has_value());

    // The encoding is minimal-width (msgpack-c writes the same bytes).
    const std::string full_bytes = encode_registration(full);  // outlives the handle
    auto handle = decode(full_bytes);
    REQUIRE(handle.has_value());
    CHECK(encode_object(handle->get()) == full_bytes);
  }
  SUBCASE("non-map frames are errors") {
    for (std::string_view hex : {"90", "c0", "01", "a3616263", "9180", "c1", "81", "80c0"}) {
      CAPTURE(hex);
      CHECK_FALSE(decode_registration(from_hex(hex)).has_value());
    }
  }
}

// ================================================================================== robustness

TEST_CASE("every proper prefix of every vector is an error, as is any trailing byte") {
  std::vector<std::string> frames;
  for (std::string_view hex :
       {kStartRequest, kInitRequest, kSetVersionRequest, kGetVersionRequest, kReplyTp1Fields8,
        kReplyTp1Fields5, kReplyTp2, kReplySetVersion, kReplyGetVersion, kHello, kReady, kInit}) {
    frames.push_back(from_hex(hex));
  }
  frames.push_back(from_hex(kReplyFailure));
  for (const std::string& frame : frames) {
    CAPTURE(to_hex(frame));
    for (std::size_t length = 0; length < frame.size(); ++length) {
      CAPTURE(length);
      const std::string_view prefix(frame.data(), length);
      decode_everything(prefix);
      expect_all_errors(prefix);
    }
    for (char trailing : {'\x00', '\xc0', '\x90'}) {
      decode_everything(frame + trailing);
      expect_all_errors(frame + trailing);
    }
  }
}

TEST_CASE("garbage frames never crash or throw") {
  SplitMix64 random(0x5eed);
  for (int i = 0; i < 20000; ++i) {
    std::string frame(random.below(48), '\0');
    for (char& c : frame) c = static_cast<char>(random.next());
    decode_everything(frame);
  }
  // Mutations of valid frames reach deeper into the decoders.
  const std::vector<std::string> seeds = {from_hex(kReplyTp1Fields8),
                                          from_hex(kReplyGetVersion),
                                          from_hex(kInitRequest),
                                          kReplyFailure,
                                          from_hex(kInit),
                                          from_hex(kHello)};
  for (int i = 0; i < 20000; ++i) {
    std::string frame = seeds[random.below(seeds.size())];
    const std::uint64_t flips = 1 + random.below(4);
    for (std::uint64_t f = 0; f < flips; ++f) {
      frame[random.below(frame.size())] = static_cast<char>(random.next());
    }
    decode_everything(frame);
  }
}

TEST_CASE("huge declared lengths are rejected without allocating") {
  for (std::string_view hex : {
           "ddffffffff",    // array32 of 4 G elements
           "dfffffffff",    // map32
           "dbffffffff",    // str32
           "c6ffffffff",    // bin32
           "c9ffffffff01",  // ext32
           "dcffff",        // array16, truncated
           "deffff",        // map16, truncated
           "dd00100001",    // just over the 1 Mi array limit
           "95ddffffffff",  // inside an outputs array
           "9500ddffffffff", "95009ac0cb40934a000000000093cfffffffffffffffffdbffffffff",
           "940001a16dddffffffff",  // args
           "c1",                    // never-used type byte
           "d9",                    // str8 without its length
           "cb3ff0",                // truncated float
       }) {
    CAPTURE(hex);
    const std::string frame = from_hex(hex);
    decode_everything(frame);
    expect_all_errors(frame);
  }
}

TEST_CASE("deep nesting is an error, not a stack overflow") {
  const std::string deep(10000, '\x91');
  decode_everything(deep);
  expect_all_errors(deep);
  const std::string deep_complete = deep + '\xc0';
  decode_everything(deep_complete);
  expect_all_errors(deep_complete);
  std::string deep_maps;
  for (int i = 0; i < 10000; ++i) deep_maps += "\x81\xa1k";
  deep_maps += '\xc0';
  decode_everything(deep_maps);
  expect_all_errors(deep_maps);
  // Inside a reply's value.
  const std::string deep_reply = from_hex("950090c0cb40934a00000000009301c092c0") + deep_complete;
  CHECK_FALSE(decode_engine_core_outputs(deep_reply).has_value());
  // Nesting within the limit is fine: the default depth is 64.
  const std::string shallow =
      from_hex("950090c0cb40934a00000000009301c092c0") + std::string(50, '\x91') + '\xc0';
  CHECK(decode_engine_core_outputs(shallow).has_value());
}

TEST_CASE("DecodeLimits are respected") {
  const std::string reply = from_hex(kReplyTp1Fields8);
  SUBCASE("array size") {
    DecodeLimits limits;
    limits.array = 8;
    CHECK(decode_engine_core_outputs(reply, limits).has_value());
    limits.array = 7;
    CHECK_FALSE(decode_engine_core_outputs(reply, limits).has_value());
    CHECK_FALSE(decode_engine_core_outputs(reply, DecodeLimits{2, 0, 0, 0, 0, 64}).has_value());
  }
  SUBCASE("depth") {
    DecodeLimits limits;
    limits.depth = 4;  // outputs -> utility_output -> result -> value
    CHECK(decode_engine_core_outputs(reply, limits).has_value());
    limits.depth = 1;
    CHECK_FALSE(decode_engine_core_outputs(reply, limits).has_value());
  }
  SUBCASE("string size") {
    DecodeLimits limits;
    limits.str = kFailureMessage.size();
    CHECK(decode_engine_core_outputs(from_hex(kReplyFailure), limits).has_value());
    limits.str = kFailureMessage.size() - 1;
    CHECK_FALSE(decode_engine_core_outputs(from_hex(kReplyFailure), limits).has_value());
  }
  SUBCASE("map size in a request") {
    DecodeLimits limits;
    limits.map = 4;
    CHECK(decode_utility_request(from_hex(kInitRequest), limits).has_value());
    limits.map = 3;  // init_info has 4 keys
    CHECK_FALSE(decode_utility_request(from_hex(kInitRequest), limits).has_value());
  }
  SUBCASE("bin size") {
    DecodeLimits limits;
    limits.bin = 2;
    const std::string with_bin = from_hex("950090c0cb40934a00000000009301c092c0c403616263");
    CHECK(decode_engine_core_outputs(with_bin).has_value());
    CHECK_FALSE(decode_engine_core_outputs(with_bin, limits).has_value());
  }
}

TEST_CASE("msgpack_codec helpers") {
  SUBCASE("decode needs exactly one value") {
    CHECK_FALSE(decode("").has_value());
    CHECK_FALSE(decode(from_hex("c0c0")).has_value());
    CHECK(decode(from_hex("c0")).has_value());
    auto error = decode(from_hex("0102")).error();
    CHECK(error.find("trailing") != std::string::npos);
    CHECK(decode(from_hex("91")).error().find("truncated") != std::string::npos);
  }
  SUBCASE("as_* accessors") {
    // decode() references the bytes: keep them alive as long as the handle.
    const std::string bytes = from_hex(
        "97a3616263c3ffcfffffffffffffffffc0"
        "cb3ff0000000000000"
        "01");
    auto handle = decode(bytes);
    REQUIRE(handle.has_value());
    const msgpack::object* items = handle->get().via.array.ptr;
    CHECK(as_str(items[0]) == "abc");
    CHECK_FALSE(as_str(items[1]).has_value());
    CHECK(as_bool(items[1]) == true);
    CHECK_FALSE(as_bool(items[6]).has_value());
    CHECK(as_int64(items[2]) == -1);
    CHECK_FALSE(as_int64(items[3]).has_value());  // uint64 max does not fit
    CHECK(is_nil(items[4]));
    CHECK_FALSE(is_nil(items[0]));
    CHECK_FALSE(as_int64(items[5]).has_value());  // a float
    CHECK(as_int64(items[6]) == 1);
  }
  SUBCASE("find_key keeps the last duplicate and skips non-string keys") {
    const std::string map_bytes = from_hex("84a16101a1610201a161a16203");
    auto map = decode(map_bytes);
    REQUIRE(map.has_value());
    const msgpack::object* a = find_key(map->get(), "a");
    REQUIRE(a != nullptr);
    CHECK(as_int64(*a) == 2);
    CHECK(find_key(map->get(), "b") != nullptr);
    CHECK(find_key(map->get(), "c") == nullptr);
    const std::string array_bytes = from_hex("91a161");
    auto array = decode(array_bytes);
    CHECK(find_key(array->get(), "a") == nullptr);
  }
  SUBCASE("pack_str writes minimal headers") {
    for (std::size_t length : {0, 31, 32, 255, 256, 65535, 65536}) {
      CAPTURE(length);
      StringBuffer buffer;
      Packer packer(buffer);
      pack_str(packer, std::string(length, 'x'));
      const std::string bytes = buffer.take();
      const std::size_t header = length < 32 ? 1 : length < 256 ? 2 : length < 65536 ? 3 : 5;
      CHECK(bytes.size() == header + length);
    }
  }
}

// ================================================================================ float types

TEST_CASE("floats keep their type through the codecs") {
  // msgpack-c >= 4.1 packs integral doubles as integers; our encoders must not.
  SUBCASE("timestamps are always float64") {
    struct Case {
      double timestamp;
      std::string_view hex;
    };
    for (const Case& c : std::vector<Case>{{1.0, "cb3ff0000000000000"},
                                           {0.0, "cb0000000000000000"},
                                           {-0.0, "cb8000000000000000"},
                                           {1700000000.0, "cb41d954fc40000000"},
                                           {1234.5, "cb40934a0000000000"}}) {
      CAPTURE(c.hex);
      const std::string frame =
          encode_engine_core_outputs(0, ok_output(id(1), "\xc0"), c.timestamp);
      CHECK(to_hex(frame) == "980090c0" + std::string(c.hex) +
                                 "9301c092c0c0"
                                 "c0c0c0");
    }
  }
  SUBCASE("encode_object") {
    for (std::string_view hex : {
             "cb3ff0000000000000",   // 1.0
             "cb8000000000000000",   // -0.0
             "cb0000000000000000",   // 0.0
             "cbc000000000000000",   // -2.0
             "cb4340000000000000",   // 2^53
             "cb7e37e43c8800759c",   // 1e300, integral
             "cb3ff8000000000000",   // 1.5
             "cb7ff8000000000000",   // NaN
             "ca3f800000",           // float32 1.0 stays float32
             "ca3fc00000",           // float32 1.5
             "93cb3ff0000000000000"  // NOLINT(bugprone-suspicious-missing-comma): one vector
             "81a178cb4000000000000000"
             "92ca40400000c0",
         }) {
      CAPTURE(hex);
      const std::string bytes = from_hex(hex);
      auto handle = decode(bytes);
      REQUIRE(handle.has_value());
      CHECK(to_hex(encode_object(handle->get())) == hex);
    }
  }
  SUBCASE("utility results") {
    const std::string value = from_hex("92cb3ff0000000000000cb8000000000000000");  // [1.0, -0.0]
    const EngineCoreOutputs outputs = decode_ok(outputs_frame(5, "9301c092c0" + to_hex(value)));
    CHECK(to_hex(outputs.utility_output->value_msgpack) == to_hex(value));
  }
  SUBCASE("request args") {
    // collective_rpc with a float timeout of 30.0 and an integral float in kwargs.
    const std::string args = transcode(R"(["start_weight_update",30.0,[1.0],{"x":-0.0}])");
    const std::string payload = encode_utility_request(0, id(1), "collective_rpc", args);
    auto request = decode_utility_request(payload);
    REQUIRE(request.has_value());
    CHECK(to_hex(request->args_msgpack) == to_hex(args));
  }
}
