#pragma once
// The generation half of the engine-core wire, frontend → engine (docs/engine-protocol.md §8):
// ADD carries an EngineCoreRequest, a positional array whose layout depends on the engine's
// vLLM version, with its SamplingParams as a map of the non-default keys; ABORT carries the
// ids of requests to drop. Encoders write what vLLM's frontend writes (minimal-width ints,
// float64 floats); the decoders are the reference engine's, and accept any layout in the table.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <utility>
#include <vector>

#include "common/wire/msgpack_codec.hpp"

namespace vllmd::wire {

// SamplingParams (msgspec omit_defaults, a map): a key is sent only when set. The engine fills
// every other key with vLLM's default (temperature 1.0, top_p 1.0, top_k 0, max_tokens 16, ...)
// and ignores keys it does not know.
struct SamplingParams {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<std::int64_t> top_k;
  std::optional<std::int64_t> seed;
  std::optional<std::int64_t> max_tokens;
  std::optional<std::int64_t> min_tokens;
  std::optional<std::int64_t> logprobs;         // -1: the whole vocabulary
  std::optional<std::int64_t> prompt_logprobs;  // likewise
  std::optional<double> min_p;
  std::optional<double> frequency_penalty;
  std::optional<double> presence_penalty;
  std::optional<double> repetition_penalty;
  std::optional<std::vector<std::int64_t>> stop_token_ids;
  std::optional<bool> ignore_eos;
  std::optional<std::int64_t> eos_token_id;                     // _eos_token_id
  std::optional<std::vector<std::int64_t>> all_stop_token_ids;  // _all_stop_token_ids
  std::optional<bool> skip_reading_prefix_cache;
  std::string extra_args_msgpack;  // one msgpack map, or empty for none
  // Keys passed through as given (logit_bias, allowed_token_ids, ...): name, msgpack value.
  std::vector<std::pair<std::string, std::string>> other;
  friend bool operator==(const SamplingParams&, const SamplingParams&) = default;
};

// The fields of EngineCoreRequest a token-in/token-out frontend sets; everything else is sent
// as its default (nil, false or 0).
struct EngineCoreRequest {
  std::string request_id;  // unique per engine
  std::vector<std::int64_t> prompt_token_ids;
  std::optional<SamplingParams> sampling_params;
  double arrival_time = 0.0;  // wall clock, seconds
  std::optional<std::string> cache_salt;
  std::optional<std::int64_t> data_parallel_rank;
  std::int64_t client_index = 0;
  std::int64_t current_wave = 0;
  std::int64_t priority = 0;
  std::vector<std::pair<std::string, std::string>> trace_headers;  // nil when empty
  std::optional<std::string> external_req_id;
  std::optional<std::string> session_id;
  friend bool operator==(const EngineCoreRequest&, const EngineCoreRequest&) = default;
};

// Every field EngineCoreRequest has had since the weight-transfer API exists, by name. A
// layout lists the ones an engine version expects, in its order.
enum class RequestField : std::uint8_t {
  kRequestId,
  kPromptTokenIds,
  kMmFeatures,
  kSamplingParams,
  kPoolingParams,
  kArrivalTime,
  kLoraRequest,
  kCacheSalt,
  kDataParallelRank,
  kPromptEmbeds,
  kPromptIsTokenIds,
  kClientIndex,
  kCurrentWave,
  kPriority,
  kTraceHeaders,
  kResumable,
  kExternalReqId,
  kReasoningEnded,
  kReasoningParserKwargs,
  kAbortImmediately,
  kSessionId,
};

struct RequestLayout {
  std::string_view name;
  std::string_view versions;  // which vllm_version strings it serves, for docs and logs
  std::span<const RequestField> fields;
};

// The layout for an engine that registered `vllm_version` (nullopt: it did not say). Unknown
// and newer versions get the newest layout.
const RequestLayout& request_layout_for(const std::optional<std::string>& vllm_version);
const RequestLayout& newest_request_layout();
std::span<const RequestLayout> request_layouts();

std::string encode_sampling_params(const SamplingParams& params);
// Fields 0-8 (they have no default), then up to the last field not at its default: a plain
// token-only request is the same 9 fields for every layout. `every_field` writes them all, as
// msgspec does.
std::string encode_engine_core_request(const EngineCoreRequest& request,
                                       const RequestLayout& layout = newest_request_layout(),
                                       bool every_field = false);
// ABORT payload: the ids as one msgpack array of strings.
std::string encode_abort(std::span<const std::string> request_ids);

// Decoders for the engine side. A request decodes by position with `layout`; a shorter array
// leaves the missing trailing fields at their defaults and extra ones are ignored, as msgspec
// does. Sampling keys this struct has no member for land in `other`.
tl::expected<SamplingParams, std::string> decode_sampling_params(const msgpack::object& map);
tl::expected<EngineCoreRequest, std::string> decode_engine_core_request(
    std::string_view payload, const RequestLayout& layout = newest_request_layout(),
    const DecodeLimits& limits = {});
tl::expected<std::vector<std::string>, std::string> decode_abort(std::string_view payload,
                                                                 const DecodeLimits& limits = {});

// "0.19.1rc2" → {0, 19, 1}; nullopt when it does not start with a number.
std::optional<std::vector<int>> parse_version(std::string_view version);

}  // namespace vllmd::wire
