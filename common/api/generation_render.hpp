#pragma once
// The JSON of /inference/v1/generate's answers, in vLLM's Python shape (docs/http-api.md):
// written straight into strings from the engine's arrays, with no document tree in between,
// since a stream renders one piece per request per engine step.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/wire/generation_output.hpp"

namespace vllmd::api {

// vLLM clamps logprobs at this (−inf included), so every value is a finite JSON number.
inline constexpr double kMinLogprob = -9999.0;

// Appends one "content" item per row of the sample logprobs, comma-separated after what `out`
// holds: {"token":"token_id:N","logprob":x,"bytes":null,"top_logprobs":[...]}. The sampled
// token comes first in top_logprobs, which keeps max(k, 1) distinct tokens (k < 0: all).
void append_logprob_items(std::string& out, const wire::LogprobsView& rows, std::int64_t k);

// Appends one prompt_logprobs entry per row: {"<id>":{"logprob":x,"rank":r,"decoded_token":
// "token_id:<id>"},...}, the prompt's own token first.
void append_prompt_logprob_rows(std::string& out, const wire::LogprobsView& rows);

void append_token_ids(std::string& out, std::span<const std::int64_t> ids);

struct Usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_tokens = 0;
};
void append_usage(std::string& out, const Usage& usage);

// One choice of a response or a stream chunk: {"index":i,"logprobs":...,"finish_reason":...,
// "stop_reason":...,"token_ids":[...]}. `logprob_items` is what append_logprob_items wrote,
// or nullopt when logprobs were not asked for (then "logprobs":null).
struct ChoiceText {
  std::int64_t index = 0;
  std::span<const std::int64_t> token_ids;
  const std::string* logprob_items = nullptr;
  std::optional<std::string_view> finish_reason;
  std::optional<std::int64_t> stop_token;
  // The weight versions' items ({"version":...,"first_token":N},...), or null for none.
  const std::string* weight_versions = nullptr;
};
void append_choice(std::string& out, const ChoiceText& choice);

// /v1/completions' logprobs: four parallel lists, grown row by row as outputs arrive (each
// held without its brackets). Tokens are "token_id:N" placeholders, so text_offset counts
// their characters; it runs on across a stream's events, as vLLM's does.
struct CompletionLogprobs {
  std::string text_offset;
  std::string token_logprobs;
  std::string tokens;
  std::string top_logprobs;
  std::int64_t next_offset = 0;
  void clear_rows() {
    text_offset.clear();
    token_logprobs.clear();
    tokens.clear();
    top_logprobs.clear();
  }
};
// Appends each row: the sampled token and its logprob, and in top_logprobs the first k + 1
// distinct tokens of the row (the sampled one first; k < 0: all), as vLLM keeps them.
void append_completion_logprobs(CompletionLogprobs& out, const wire::LogprobsView& rows,
                                std::int64_t k);

// One choice of /v1/completions: {"index":i,"text":"","logprobs":...,"finish_reason":...,
// "stop_reason":...,"token_ids":...,"prompt_token_ids":...}, then "prompt_logprobs" in a body.
struct CompletionChoiceText {
  std::int64_t index = 0;
  std::span<const std::int64_t> token_ids;
  const CompletionLogprobs* logprobs = nullptr;  // null: "logprobs":null
  std::optional<std::string_view> finish_reason;
  std::optional<std::int64_t> stop_token;
  bool with_token_ids = false;                                    // return_token_ids
  std::optional<std::span<const std::int64_t>> prompt_token_ids;  // null when absent
  bool body = false;  // a whole response's choice, not a stream chunk's
  const std::string* prompt_logprob_rows = nullptr;  // body: what follows the leading null
  const std::string* weight_versions = nullptr;      // as in ChoiceText
};
void append_completion_choice(std::string& out, const CompletionChoiceText& choice);

// One server-sent event: "data: <json>\n\n".
std::string sse_event(std::string_view json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// The error event a stream ends with when the engine fails it: Python's shape, the status as
// an integer code.
std::string sse_error_event(std::string_view message, std::string_view type, int code);

}  // namespace vllmd::api
