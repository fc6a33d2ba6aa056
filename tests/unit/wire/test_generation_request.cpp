// ADD and ABORT (common/wire/generation_request.*, docs/engine-protocol.md §10): the generation
// protocol reference's test vectors A, B and C, byte for byte where vllmd writes them and field
// by field where it reads them, then the layouts.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/wire/generation_request.hpp"
#include "tests/unit/wire/hex.hpp"

using namespace vllmd::wire;
using vllmd::test::from_hex;
using vllmd::test::to_hex;

namespace {

// A: the minimal 9-field token-only request.
constexpr std::string_view kAddA =
    "99ae67656e2d312d306131623263336493010203c085ab74656d7065726174757265cb0000000000000000aa6d"
    "61785f746f6b656e7308ae73746f705f746f6b656e5f69647390ad5f656f735f746f6b656e5f696402b35f616c"
    "6c5f73746f705f746f6b656e5f6964739102c0cb41d954fc40100000c0c0c0";
// B: python_compat's 21-field request, with sampling keys vllmd passes through unread.
constexpr std::string_view kAddB =
    "dc0015a57265712d31920b16c08cab74656d7065726174757265cb3fe999999999999aac77617465726d61726b"
    "696e67c2a5746f705f70cb3feccccccccccccda5746f705f6b08aa6d61785f746f6b656e7320aa6d696e5f746f"
    "6b656e7301b57468696e6b696e675f746f6b656e5f627564676574cd0100ae73746f705f746f6b656e5f696473"
    "91ce0002505bad5f656f735f746f6b656e5f6964ce0002505db35f616c6c5f73746f705f746f6b656e5f696473"
    "92ce0002505bce0002505dbb726f757465645f657870657274735f70726f6d70745f737461727401ab6f757470"
    "75745f6b696e6402c0cb4045400000000000c0c0c0c0c0000000c0c2c0c0c0c2a973657373696f6e2d31";
// B's defaults_request: every field, an empty sampling map.
constexpr std::string_view kAddDefaults =
    "dc0015ac7265712d64656661756c747393050607c080c0cb3ff0000000000000c0c0c0c0c0000000c0c2c0c0c0"
    "c2c0";
// C: ABORT of one id.
constexpr std::string_view kAbortC = "91ae67656e2d312d3061316232633364";

EngineCoreRequest request_a() {
  EngineCoreRequest request;
  request.request_id = "gen-1-0a1b2c3d";
  request.prompt_token_ids = {1, 2, 3};
  SamplingParams params;
  params.temperature = 0.0;
  params.max_tokens = 8;
  params.stop_token_ids = std::vector<std::int64_t>{};
  params.eos_token_id = 2;
  params.all_stop_token_ids = std::vector<std::int64_t>{2};
  request.sampling_params = params;
  request.arrival_time = 1700000000.25;
  return request;
}

}  // namespace

TEST_CASE("vector A: a token-only ADD is the 9-field array, byte for byte") {
  CHECK(to_hex(encode_engine_core_request(request_a())) == kAddA);
  // The same 9 fields whichever layout the engine's version picks: nothing past index 8 is set.
  for (const RequestLayout& layout : request_layouts()) {
    CAPTURE(layout.name);
    CHECK(to_hex(encode_engine_core_request(request_a(), layout)) == kAddA);
  }
  auto decoded = decode_engine_core_request(from_hex(kAddA));
  REQUIRE(decoded.has_value());
  CHECK(*decoded == request_a());
}

TEST_CASE("vector B: every field and the sampling keys vllmd does not model decode") {
  auto decoded = decode_engine_core_request(from_hex(kAddB));
  REQUIRE(decoded.has_value());
  CHECK(decoded->request_id == "req-1");
  CHECK(decoded->prompt_token_ids == std::vector<std::int64_t>{11, 22});
  CHECK(decoded->arrival_time == 42.5);
  CHECK(decoded->session_id == "session-1");
  CHECK(decoded->client_index == 0);
  REQUIRE(decoded->sampling_params.has_value());
  const SamplingParams& params = *decoded->sampling_params;
  CHECK(params.temperature == 0.8);
  CHECK(params.top_p == 0.9);
  CHECK(params.top_k == 8);
  CHECK(params.max_tokens == 32);
  CHECK(params.min_tokens == 1);
  CHECK(params.stop_token_ids == std::vector<std::int64_t>{151643});
  CHECK(params.eos_token_id == 151645);
  CHECK(params.all_stop_token_ids == std::vector<std::int64_t>{151643, 151645});
  // Kept as given, so an engine-side decoder loses nothing.
  REQUIRE(params.other.size() == 4);
  CHECK(params.other[0].first == "watermarking");
  CHECK(to_hex(params.other[0].second) == "c2");
  CHECK(params.other[1].first == "thinking_token_budget");
  CHECK(to_hex(params.other[1].second) == "cd0100");
  CHECK(params.other[2].first == "routed_experts_prompt_start");
  CHECK(params.other[3].first == "output_kind");
  CHECK(to_hex(params.other[3].second) == "02");
}

TEST_CASE("defaults_request: every field of the newest layout, byte for byte") {
  EngineCoreRequest request;
  request.request_id = "req-defaults";
  request.prompt_token_ids = {5, 6, 7};
  request.sampling_params = SamplingParams{};
  request.arrival_time = 1.0;
  CHECK(to_hex(encode_engine_core_request(request, newest_request_layout(), true)) == kAddDefaults);
  auto decoded = decode_engine_core_request(from_hex(kAddDefaults));
  REQUIRE(decoded.has_value());
  CHECK(*decoded == request);
}

TEST_CASE("vector C: ABORT is an array of ids") {
  const std::vector<std::string> ids{"gen-1-0a1b2c3d"};
  CHECK(to_hex(encode_abort(ids)) == kAbortC);
  auto decoded = decode_abort(from_hex(kAbortC));
  REQUIRE(decoded.has_value());
  CHECK(*decoded == ids);
  const std::vector<std::string> several{"a", "b", "c"};
  CHECK(decode_abort(encode_abort(several)).value() == several);
  CHECK_FALSE(decode_abort(from_hex("9101")).has_value());
  CHECK_FALSE(decode_abort(from_hex("a161")).has_value());
}

TEST_CASE("fields past index 8 are written up to the last one set, at the layout's positions") {
  EngineCoreRequest request = request_a();
  request.priority = 3;
  const std::string newest = encode_engine_core_request(request, request_layouts()[0]);
  const std::string older = encode_engine_core_request(request, request_layouts()[1]);
  // Newest: prompt_embeds, prompt_is_token_ids, client_index, current_wave, then priority.
  CHECK(
      to_hex(newest).ends_with("c0c0c0"
                               "c0c0"
                               "0000"
                               "03"));
  CHECK(
      to_hex(older).ends_with("c0c0c0"
                              "c0"
                              "0000"
                              "03"));
  CHECK(to_hex(newest).substr(0, 2) == "9e");  // 14 fields
  CHECK(to_hex(older).substr(0, 2) == "9d");   // 13 fields
  for (std::size_t i = 0; i < 2; ++i) {
    const RequestLayout& layout = request_layouts()[i];
    auto decoded = decode_engine_core_request(i == 0 ? newest : older, layout);
    REQUIRE(decoded.has_value());
    CHECK(decoded->priority == 3);
    CHECK(*decoded == request);
  }
  request.trace_headers = {{"traceparent", "00-ab-cd-01"}};
  request.session_id = "s";
  auto decoded = decode_engine_core_request(encode_engine_core_request(request));
  REQUIRE(decoded.has_value());
  CHECK(*decoded == request);
}

TEST_CASE("the layout follows the engine's registered vLLM version") {
  CHECK(request_layout_for(std::nullopt).name == "2026");
  CHECK(request_layout_for(std::string("0.25.1")).name == "2026");
  CHECK(request_layout_for(std::string("0.20.0")).name == "2026");
  CHECK(request_layout_for(std::string("1.0")).name == "2026");
  CHECK(request_layout_for(std::string("0.19.1rc2.dev7+g1234")).name == "2025");
  CHECK(request_layout_for(std::string("0.11.0")).name == "2025");
  CHECK(request_layout_for(std::string("main")).name == "2026");  // no number: the newest
  CHECK(parse_version("0.19.1rc2") == std::vector<int>{0, 19, 1});
  CHECK_FALSE(parse_version("dev").has_value());
}

TEST_CASE("sampling values of the wrong type and malformed requests are refused, not guessed") {
  CHECK_FALSE(decode_engine_core_request(from_hex("93a161900a")).has_value());  // 3 fields
  // max_tokens as a string.
  const std::string bad_sampling =
      "99a16190c081aa6d61785f746f6b656e73a138c0cb3ff0000000000000c0c0c0";
  auto decoded = decode_engine_core_request(from_hex(bad_sampling));
  REQUIRE_FALSE(decoded.has_value());
  CHECK(decoded.error().find("max_tokens") != std::string::npos);
  CHECK_FALSE(decode_engine_core_request(from_hex("990190c0c0c0cb0000000000000000c0c0c0"))
                  .has_value());  // request_id is an integer
}
