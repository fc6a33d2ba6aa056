#pragma once
// POST /inference/v1/generate's body (docs/http-api.md): validated, then lowered into the
// engine's SamplingParams as vLLM's Rust frontend lowers them (lower_sampling_params). Every
// 400 names its parameter; a request that fails here reaches no engine. Keys only a
// detokenizer or vLLM's output processor reads (detokenize, skip_special_tokens,
// include_stop_str_in_output, output_kind, return_token_ids, ...) and unknown keys are
// accepted and ignored; stop strings, bad_words and multimodal input are refused, since
// vllmd has no tokenizer.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "common/api/errors.hpp"
#include "common/wire/generation_request.hpp"

namespace vllmd::api {

// What vllmd knows of the model it serves: config.json and generation_config.json of --model,
// and the engines' registrations. Without --model only the name and max_model_len are known:
// no EOS (unless a request names stop ids) and no vocabulary check.
struct ModelInfo {
  std::string name;                               // the served model name
  std::optional<std::int64_t> vocab_size;         // config.json vocab_size
  std::optional<std::int64_t> eos_token_id;       // the primary EOS
  std::vector<std::int64_t> extra_eos_token_ids;  // the other EOS ids (generation_config.json)
  // generation_config.json's sampling defaults, used where a request sets nothing.
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<std::int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<std::int64_t> max_new_tokens;
  std::optional<std::int64_t> max_model_len;  // the smallest any engine registered
  std::int64_t max_logprobs = 20;             // vLLM's --max-logprobs default
};

// n is served by fanning a request out into n engine requests; vLLM bounds it by the engines'
// max_num_seqs, whose default this is. A batch of prompts times n is bounded too.
inline constexpr std::int64_t kMaxChoicesPerPrompt = 256;
inline constexpr std::int64_t kMaxChoicesPerRequest = 4096;

struct GenerateRequest {
  std::vector<std::int64_t> token_ids;
  std::int64_t n = 1;                           // choices, each its own engine request
  wire::SamplingParams sampling;                // lowered: what the engine gets
  std::optional<std::int64_t> logprobs;         // top-k asked per sampled token (-1: all)
  std::optional<std::int64_t> prompt_logprobs;  // likewise per prompt token
  std::optional<std::string> request_id;        // the body's
  std::optional<std::string> cache_salt;
  std::int64_t priority = 0;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats
};

tl::expected<GenerateRequest, ApiError> parse_generate_request(std::string_view body,
                                                               const ModelInfo& model);

// POST /v1/completions with a token-id `prompt` (docs/http-api.md): the sampling keys at the
// top level, validated and lowered as above. A text prompt, echo, suffix, beam search and
// structured outputs are refused with a 400 that says why. A list of lists is a batch of
// prompts: one GenerateRequest each, in order, sharing the sampling.
struct CompletionRequest {
  std::vector<GenerateRequest> prompts;
  bool return_token_ids = false;  // token_ids and prompt_token_ids in each choice
};
tl::expected<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   const ModelInfo& model);

}  // namespace vllmd::api
