// EngineCoreOutputs with request outputs (common/wire/generation_output.*, docs/engine-protocol.md
// §10): the generation protocol reference's test vectors D, E, F and G both ways, then the
// tolerance the decoder owes older and newer engines, and the malformed arrays it must refuse.

#include <doctest/doctest.h>

#include <list>
#include <string>
#include <string_view>
#include <vector>

#include "common/wire/generation_output.hpp"
#include "tests/unit/wire/hex.hpp"

using namespace vllmd::wire;
using vllmd::test::from_hex;
using vllmd::test::to_hex;

namespace {

constexpr std::string_view kShortD =
    "96009196a57265712d31920708c0c0c001c0cb0000000000000000c091a57265712d31";
constexpr std::string_view kFullD =
    "980091dc0011a57265712d31920708c0c0c001c0c0c0c0c0c0c000c0c0c0c0cb0000000000000000c091a57265"
    "712d31c0c0";
constexpr std::string_view kInlineE =
    "96009196a57265712d319207089493a33c6938920203c730030100000000000000020000000000000003000000"
    "0000000004000000000000000500000000000000060000000000000093a33c6634920203c718030000803f0000"
    "004000004040000080400000a0400000c04093a33c69389102d80301000000000000000200000000000000c0c0"
    "c001c0cb0000000000000000c091a57265712d31";
constexpr std::string_view kMultipartF0 =
    "96009196a57265712d319207089493a33c69389202030193a33c66349202030293a33c6938910203c0c0c001c0"
    "cb0000000000000000c091a57265712d31";
constexpr std::string_view kMultipartF1 =
    "010000000000000002000000000000000300000000000000040000000000000005000000000000000600000000"
    "000000";
constexpr std::string_view kMultipartF2 = "0000803f0000004000004040000080400000a0400000c040";
constexpr std::string_view kMultipartF3 = "01000000000000000200000000000000";
constexpr std::string_view kPromptG =
    "96009196a57265712d31920708c09593a5696e743634920203c730030a000000000000000b000000000000000c"
    "000000000000000d000000000000000e000000000000000f0000000000000093a7666c6f61743332920203c718"
    "0300002041000030410000404100005041000060410000704193a5696e7436349102d803030000000000000004"
    "00000000000000c0c0c001c0cb0000000000000000c091a57265712d31";

LogprobRows rows(std::vector<std::int64_t> ids, std::vector<float> logprobs,
                 std::vector<std::int64_t> ranks) {
  LogprobRows result;
  result.rows = ranks.size();
  result.columns = ids.size() / ranks.size();
  result.token_ids = std::move(ids);
  result.logprobs = std::move(logprobs);
  result.ranks = std::move(ranks);
  return result;
}

OutputsToSend length_finish(std::optional<LogprobRows> logprobs = std::nullopt,
                            std::optional<LogprobRows> prompt = std::nullopt) {
  OutputsToSend message;
  OutputToSend output;
  output.request_id = "req-1";
  output.new_token_ids = {7, 8};
  output.logprobs = std::move(logprobs);
  output.prompt_logprobs = std::move(prompt);
  output.finish_reason = FinishReason::kLength;
  message.outputs.push_back(std::move(output));
  message.finished_requests = {"req-1"};
  return message;
}

constexpr OutputEncoding kShort{.outputs_fields = 6, .output_fields = 6};

// The frames of every message decoded here, kept for the whole run: the decoded views point
// into them (a list, whose nodes never move).
std::list<std::vector<std::string>>& kept_frames() {
  static std::list<std::vector<std::string>> frames;
  return frames;
}

DecodedOutputs decode_ok(std::vector<std::string> frames) {
  const std::vector<std::string>& held = kept_frames().emplace_back(std::move(frames));
  std::vector<std::string_view> views(held.begin(), held.end());
  auto decoded = decode_outputs(views);
  if (!decoded) FAIL(decoded.error());
  return std::move(*decoded);
}

// The positions of rows, as (token, logprob, rank) per column.
struct Position {
  std::int64_t token;
  double logprob;
  std::int64_t rank;
  friend bool operator==(const Position&, const Position&) = default;
};
std::vector<std::vector<Position>> positions(const LogprobsView& view) {
  std::vector<std::vector<Position>> result(view.rows());
  for (std::size_t r = 0; r < view.rows(); ++r) {
    for (std::size_t c = 0; c < view.columns(); ++c) {
      const std::size_t i = r * view.columns() + c;
      result[r].push_back({view.token_ids.integer(i), view.logprobs.real(i),
                           c == 0 ? view.ranks.integer(r) : static_cast<std::int64_t>(c)});
    }
  }
  return result;
}

void check_d(const DecodedOutputs& decoded) {
  CHECK(decoded.engine_index == 0);
  REQUIRE(decoded.outputs.size() == 1);
  const OutputView& output = decoded.outputs[0];
  CHECK(output.request_id == "req-1");
  CHECK(std::vector<std::int64_t>(output.new_token_ids.begin(), output.new_token_ids.end()) ==
        std::vector<std::int64_t>{7, 8});
  CHECK(output.finish_reason == 1);
  CHECK_FALSE(output.stop_token.has_value());
  CHECK(output.logprobs == nullptr);
  CHECK(decoded.finished_requests == std::vector<std::string_view>{"req-1"});
  CHECK_FALSE(decoded.utility_output.has_value());
  CHECK_FALSE(decoded.scheduler_stats.has_value());
}

}  // namespace

TEST_CASE("vector D: the short and the full form encode byte for byte and decode alike") {
  const auto short_form = encode_outputs(length_finish(), kShort);
  REQUIRE(short_form.size() == 1);
  CHECK(to_hex(short_form[0]) == kShortD);
  const auto full_form = encode_outputs(length_finish());
  REQUIRE(full_form.size() == 1);
  CHECK(to_hex(full_form[0]) == kFullD);
  check_d(decode_ok({from_hex(kShortD)}));
  check_d(decode_ok({from_hex(kFullD)}));
}

TEST_CASE("vector E: sample logprobs inline as ext type 3") {
  const auto sent = rows({1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6}, {1, 2});
  const auto frames = encode_outputs(length_finish(sent), kShort);
  REQUIRE(frames.size() == 1);
  CHECK(to_hex(frames[0]) == kInlineE);
  const DecodedOutputs decoded = decode_ok({from_hex(kInlineE)});
  REQUIRE(decoded.outputs.size() == 1);
  REQUIRE(decoded.outputs[0].logprobs != nullptr);
  const std::vector<std::vector<Position>> expected{{{1, 1.0, 1}, {2, 2.0, 1}, {3, 3.0, 2}},
                                                    {{4, 4.0, 2}, {5, 5.0, 1}, {6, 6.0, 2}}};
  CHECK(positions(*decoded.outputs[0].logprobs) == expected);
}

TEST_CASE("vector F: sample logprobs in extra frames, with the threshold at 1") {
  const auto sent = rows({1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6}, {1, 2});
  OutputEncoding encoding = kShort;
  encoding.zero_copy_threshold = 1;
  const auto frames = encode_outputs(length_finish(sent), encoding);
  REQUIRE(frames.size() == 4);
  CHECK(to_hex(frames[0]) == kMultipartF0);
  CHECK(to_hex(frames[1]) == kMultipartF1);
  CHECK(to_hex(frames[2]) == kMultipartF2);
  CHECK(to_hex(frames[3]) == kMultipartF3);
  const DecodedOutputs decoded = decode_ok({from_hex(kMultipartF0), from_hex(kMultipartF1),
                                            from_hex(kMultipartF2), from_hex(kMultipartF3)});
  REQUIRE(decoded.outputs[0].logprobs != nullptr);
  const std::vector<std::vector<Position>> expected{{{1, 1.0, 1}, {2, 2.0, 1}, {3, 3.0, 2}},
                                                    {{4, 4.0, 2}, {5, 5.0, 1}, {6, 6.0, 2}}};
  CHECK(positions(*decoded.outputs[0].logprobs) == expected);
  // A frame index the message does not have is an error, never a read past the frames.
  const std::string frame0 = from_hex(kMultipartF0);
  const std::string frame1 = from_hex(kMultipartF1);
  std::vector<std::string_view> two{frame0, frame1};
  CHECK_FALSE(decode_outputs(two).has_value());
}

TEST_CASE("vector G: prompt logprobs as torch tensors in a 5-tuple") {
  const auto sent = rows({10, 11, 12, 13, 14, 15}, {10, 11, 12, 13, 14, 15}, {3, 4});
  const auto frames = encode_outputs(length_finish(std::nullopt, sent), kShort);
  REQUIRE(frames.size() == 1);
  CHECK(to_hex(frames[0]) == kPromptG);
  const DecodedOutputs decoded = decode_ok({from_hex(kPromptG)});
  REQUIRE(decoded.outputs[0].prompt_logprobs != nullptr);
  CHECK(decoded.outputs[0].logprobs == nullptr);
  const std::vector<std::vector<Position>> expected{{{10, 10.0, 3}, {11, 11.0, 1}, {12, 12.0, 2}},
                                                    {{13, 13.0, 4}, {14, 14.0, 1}, {15, 15.0, 2}}};
  CHECK(positions(*decoded.outputs[0].prompt_logprobs) == expected);
}

TEST_CASE("any number of fields: missing ones read as nil, extra ones are ignored") {
  for (std::size_t outer : {6, 8, 9, 20}) {
    for (std::size_t inner : {6, 12, 17, 18, 30}) {
      CAPTURE(outer);
      CAPTURE(inner);
      check_d(decode_ok(
          encode_outputs(length_finish(), {.outputs_fields = outer, .output_fields = inner})));
    }
  }
  // [engine_index, outputs] alone, and an output of [id, tokens].
  const DecodedOutputs two =
      decode_ok({from_hex("920291"
                          "92a17891"
                          "05")});
  REQUIRE(two.outputs.size() == 1);
  CHECK(two.engine_index == 2);
  CHECK(two.outputs[0].request_id == "x");
  CHECK(*two.outputs[0].new_token_ids.begin() == 5);
  CHECK_FALSE(two.outputs[0].finish_reason.has_value());
}

namespace {

// An EngineCoreOutputs of one output whose fields are given as hex.
std::string one_output(const std::vector<std::string>& fields, std::string_view outer_tail = "") {
  std::string hex =
      "96"
      "00"
      "91";
  hex += fields.size() < 16 ? std::string(1, "0123456789abcdef"[fields.size()]).insert(0, "9")
                            : "dc00" + std::string(1, "0123456789abcdef"[fields.size() >> 4]) +
                                  std::string(1, "0123456789abcdef"[fields.size() & 15]);
  for (const std::string& field : fields) hex += field;
  hex +=
      "c0"
      "cb0000000000000000"
      "c0";
  hex += outer_tail.empty() ? "c0" : std::string(outer_tail);
  return from_hex(hex);
}

const std::string kId = "a57265712d31";  // "req-1"
const std::string kTokens = "920708";    // [7, 8]

// [dtype, shape, data] with the data as any ext header.
std::string array_hex(std::string_view dtype_hex, std::string_view shape_hex,
                      std::string_view ext_header, std::string_view bytes_hex) {
  return "93" + std::string(dtype_hex) + std::string(shape_hex) + std::string(ext_header) +
         std::string(bytes_hex);
}

}  // namespace

TEST_CASE("num_cached_tokens: prefill_stats in newer layouts, the plain field in older ones") {
  // Newest: prefill_stats map at index 11.
  std::vector<std::string> newest(17, "c0");
  newest[0] = kId;
  newest[1] = kTokens;
  newest[11] = "81b16e756d5f6361636865645f746f6b656e7310";  // {"num_cached_tokens": 16}
  newest[13] = "00";
  auto decoded = decode_ok({one_output(newest)});
  CHECK(decoded.outputs[0].num_cached_tokens == 16);
  // Older: num_cached_tokens at 10, num_external_computed_tokens at 11.
  std::vector<std::string> older(14, "c0");
  older[0] = kId;
  older[1] = kTokens;
  older[10] = "0c";
  older[11] = "00";
  decoded = decode_ok({one_output(older)});
  CHECK(decoded.outputs[0].num_cached_tokens == 12);
  // kv_transfer_params at 8 is handed over as the map it is.
  newest[8] = "81a16101";
  decoded = decode_ok({one_output(newest)});
  CHECK(to_hex(decoded.outputs[0].kv_transfer_params) == "81a16101");
}

TEST_CASE("the early layout without pooling_output: finish_reason at 4, stop_reason at 5") {
  auto decoded = decode_ok({one_output({kId, kTokens, "c0", "c0", "00", "cd2710"})});
  CHECK(decoded.outputs[0].finish_reason == 0);
  CHECK(decoded.outputs[0].stop_token == 10000);
  // The current layout with a stop token and a stop string.
  decoded = decode_ok({one_output({kId, kTokens, "c0", "c0", "c0", "00", "02"})});
  CHECK(decoded.outputs[0].finish_reason == 0);
  CHECK(decoded.outputs[0].stop_token == 2);
  decoded = decode_ok({one_output(
      {kId, kTokens, "c0", "c0", "c0", "04", "b372657065746974696f6e5f6465746563746564"})});
  CHECK(decoded.outputs[0].finish_reason == 4);
  CHECK(decoded.outputs[0].stop_text == "repetition_detected");
  CHECK(finish_reason_name(FinishReason::kRepetition) == "repetition");
}

TEST_CASE("every ext width carries an array, and both byte orders and dtype spellings read") {
  // One row of one int32 token id (4 bytes: fixext4), logprob float32, rank int64 (fixext8).
  const std::string ids4 = array_hex("a33c6934", "920101", "d603", "05000000");
  const std::string lp4 = array_hex("a33c6634", "920101", "d603", "0000803f");
  const std::string rank8 = array_hex("a33c6938", "9101", "d703", "0700000000000000");
  auto decoded = decode_ok({one_output({kId, kTokens, "94" + ids4 + lp4 + rank8 + "c0"})});
  REQUIRE(decoded.outputs[0].logprobs != nullptr);
  CHECK(decoded.outputs[0].logprobs->token_ids.integer(0) == 5);
  CHECK(decoded.outputs[0].logprobs->logprobs.real(0) == 1.0);
  CHECK(decoded.outputs[0].logprobs->ranks.integer(0) == 7);
  // The same values as ext8, ext16 and ext32, a 3-tuple (older engines), big-endian torch-less
  // numpy names and '=' / '|' prefixes.
  const std::string ids_e8 = array_hex("a33e6934", "920101", "c70403", "00000005");
  const std::string lp_e16 = array_hex("a33d6634", "920101", "c8000403", "0000803f");
  const std::string rank_e32 = array_hex("a37c6938", "9101", "c90000000803", "0700000000000000");
  decoded = decode_ok({one_output({kId, kTokens, "93" + ids_e8 + lp_e16 + rank_e32})});
  REQUIRE(decoded.outputs[0].logprobs != nullptr);
  CHECK(decoded.outputs[0].logprobs->token_ids.integer(0) == 5);
  CHECK(decoded.outputs[0].logprobs->logprobs.real(0) == 1.0);
  CHECK(decoded.outputs[0].logprobs->ranks.integer(0) == 7);
  // fixext1 and fixext2 hold too few bytes for any of these dtypes: refused by the size check.
  const std::string ids1 = array_hex("a33c6934", "920101", "d403", "05");
  CHECK_FALSE(decode_outputs(std::vector<std::string_view>{
                                 one_output({kId, kTokens, "94" + ids1 + lp4 + rank8 + "c0"})})
                  .has_value());
}

TEST_CASE("malformed logprob arrays are refused with a reason, never read out of bounds") {
  const std::string ids = array_hex("a33c6938", "920101", "d703", "0500000000000000");
  const std::string lp = array_hex("a33c6634", "920101", "d603", "0000803f");
  const std::string rank = array_hex("a33c6938", "9101", "d703", "0700000000000000");
  auto refused = [](const std::string& logprobs) {
    const std::string frame = one_output({kId, kTokens, logprobs});
    auto decoded = decode_outputs(std::vector<std::string_view>{frame});
    REQUIRE_FALSE(decoded.has_value());
    return decoded.error();
  };
  CHECK(refused("94" + ids + lp + rank + "01").find("cu_num_generated_tokens") !=
        std::string::npos);
  CHECK(refused("92" + ids + lp).find("3 to 5") != std::string::npos);
  // Unknown dtype, more dimensions than two, a shape larger than its data, the wrong ext type.
  CHECK(refused("93" + array_hex("a33c6632", "920101", "d503", "0000") + lp + rank).find("dtype") !=
        std::string::npos);
  CHECK(refused("93" + array_hex("a33c6938", "93010101", "d703", "0500000000000000") + lp + rank)
            .find("dimensions") != std::string::npos);
  CHECK(refused("93" + array_hex("a33c6938", "920201", "d703", "0500000000000000") + lp + rank)
            .find("bytes") != std::string::npos);
  CHECK(refused("93" + array_hex("a33c6938", "920101", "d704", "0500000000000000") + lp + rank)
            .find("ext type 3") != std::string::npos);
  // Frame index 0 is the message itself, never array data.
  CHECK(refused("93" + array_hex("a33c6938", "920101", "", "00") + lp + rank).find("frames") !=
        std::string::npos);
  // Logprobs that are not float32, and ranks that do not match the rows.
  CHECK(refused("93" + ids + ids + rank).find("float32") != std::string::npos);
  CHECK(refused("93" + ids + lp +
                array_hex("a33c6938", "9102", "d803", "07000000000000000700000000000000"))
            .find("shapes") != std::string::npos);
  // A huge extent cannot overflow the size check.
  CHECK_FALSE(refused("93" +
                      array_hex("a33c6938", "92cf8000000000000000cf8000000000000000", "d703",
                                "0500000000000000") +
                      lp + rank)
                  .empty());
}

TEST_CASE("outputs of the wrong shape are refused, and stats, waves and utility replies read") {
  auto refused = [](std::string_view hex) {
    const std::string frame = from_hex(hex);
    return !decode_outputs(std::vector<std::string_view>{frame}).has_value();
  };
  CHECK(refused("9100"));                // no outputs field
  CHECK(refused("9200c0"));              // outputs is nil
  CHECK(refused("92009191a178"));        // an output of one field
  CHECK(refused("92009192a17891a178"));  // a token id that is a string
  CHECK(refused("92009192a178a178"));    // new_token_ids that is a string
  CHECK(
      refused("9200919301"
              "90c0"));                        // a request id that is an integer
  CHECK(refused("92009196a17890c0c0c0a16c"));  // a finish_reason that is a string
  CHECK(refused("c0"));
  CHECK(refused("85a16100a16200a16300a16400a16500"));
  CHECK(decode_outputs(std::span<const std::string_view>{}).has_value() == false);
  // Stats-only step, and the DP control fields.
  const DecodedOutputs stats = decode_ok(
      {from_hex("98"
                "01"
                "90"
                "82b06e756d5f72756e6e696e675f7265717303b06e756d5f77616974696e675f7265717305"
                "cb0000000000000000"
                "c0"
                "c0"
                "07"
                "08")});
  CHECK(stats.engine_index == 1);
  CHECK(stats.outputs.empty());
  REQUIRE(stats.scheduler_stats.has_value());
  CHECK(stats.scheduler_stats->running == 3);
  CHECK(stats.scheduler_stats->waiting == 5);
  CHECK(stats.wave_complete == 7);
  CHECK(stats.start_wave == 8);
  // A utility reply, as encode_engine_core_outputs writes it.
  UtilityOutput reply;
  reply.call_id = CallId{9, false};
  reply.value_msgpack = "\xc3";
  const DecodedOutputs utility = decode_ok({encode_engine_core_outputs(2, reply, 0.5)});
  REQUIRE(utility.utility_output.has_value());
  CHECK(utility.utility_output->call_id == CallId{9, false});
  CHECK(to_hex(utility.utility_output->value_msgpack) == "c3");
}
