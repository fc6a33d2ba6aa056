#include "common/api/generation_render.hpp"

#include <algorithm>
#include <cmath>

#include "common/wire/json_text.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::api {

namespace {

void append_logprob(std::string& out, double value) {
  wire::append_double(out, std::isnan(value) ? kMinLogprob : std::max(value, kMinLogprob));
}

void append_placeholder(std::string& out, std::int64_t id) {
  out += "\"token_id:";
  out += std::to_string(id);
  out += '"';
}

// Whether column `column` of `row` repeats a token of an earlier column: vLLM keys each
// position by token id, so the sampled token listed again among the top ones counts once.
bool repeated(const wire::LogprobsView& view, std::size_t row, std::size_t column) {
  const std::size_t columns = view.columns();
  const std::int64_t id = view.token_ids.integer(row * columns + column);
  for (std::size_t earlier = 0; earlier < column; ++earlier) {
    if (view.token_ids.integer(row * columns + earlier) == id) return true;
  }
  return false;
}

// ,"finish_reason":...,"stop_reason":... of a choice.
void append_ending(std::string& out, std::optional<std::string_view> finish_reason,
                   std::optional<std::int64_t> stop_token) {
  out += ",\"finish_reason\":";
  if (finish_reason) {
    wire::append_json_string(out, *finish_reason);
  } else {
    out += "null";
  }
  out += ",\"stop_reason\":";
  out += stop_token ? std::to_string(*stop_token) : "null";
}

void append_weight_versions(std::string& out, const std::string* items) {
  if (items == nullptr) return;
  out += ",\"weight_versions\":[";
  out += *items;
  out += ']';
}

}  // namespace

void append_token_ids(std::string& out, std::span<const std::int64_t> ids) {
  out += '[';
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i != 0) out += ',';
    out += std::to_string(ids[i]);
  }
  out += ']';
}

void append_logprob_items(std::string& out, const wire::LogprobsView& rows, std::int64_t k) {
  const std::size_t columns = rows.columns();
  const std::size_t keep =
      k < 0 ? columns : std::min(columns, static_cast<std::size_t>(std::max<std::int64_t>(k, 1)));
  for (std::size_t row = 0; row < rows.rows(); ++row) {
    if (!out.empty()) out += ',';
    const std::size_t first = row * columns;
    out += "{\"token\":";
    append_placeholder(out, rows.token_ids.integer(first));
    out += ",\"logprob\":";
    append_logprob(out, rows.logprobs.real(first));
    out += ",\"bytes\":null,\"top_logprobs\":[";
    std::size_t kept = 0;
    for (std::size_t column = 0; column < columns && kept < keep; ++column) {
      if (repeated(rows, row, column)) continue;
      if (kept++ != 0) out += ',';
      out += "{\"token\":";
      append_placeholder(out, rows.token_ids.integer(first + column));
      out += ",\"logprob\":";
      append_logprob(out, rows.logprobs.real(first + column));
      out += ",\"bytes\":null}";
    }
    out += "]}";
  }
}

void append_prompt_logprob_rows(std::string& out, const wire::LogprobsView& rows) {
  const std::size_t columns = rows.columns();
  for (std::size_t row = 0; row < rows.rows(); ++row) {
    out += ",{";
    bool first_entry = true;
    for (std::size_t column = 0; column < columns; ++column) {
      if (repeated(rows, row, column)) continue;
      const std::int64_t id = rows.token_ids.integer(row * columns + column);
      if (!first_entry) out += ',';
      first_entry = false;
      out += '"';
      out += std::to_string(id);
      out += "\":{\"logprob\":";
      append_logprob(out, rows.logprobs.real(row * columns + column));
      out += ",\"rank\":";
      out +=
          std::to_string(column == 0 ? rows.ranks.integer(row) : static_cast<std::int64_t>(column));
      out += ",\"decoded_token\":";
      append_placeholder(out, id);
      out += '}';
    }
    out += '}';
  }
}

void append_usage(std::string& out, const Usage& usage) {
  out += "{\"prompt_tokens\":";
  out += std::to_string(usage.prompt_tokens);
  out += ",\"total_tokens\":";
  out += std::to_string(usage.prompt_tokens + usage.completion_tokens);
  out += ",\"completion_tokens\":";
  out += std::to_string(usage.completion_tokens);
  out += ",\"prompt_tokens_details\":{\"cached_tokens\":";
  out += std::to_string(usage.cached_tokens);
  out += "}}";
}

void append_choice(std::string& out, const ChoiceText& choice) {
  out += "{\"index\":";
  out += std::to_string(choice.index);
  out += ",\"logprobs\":";
  if (choice.logprob_items != nullptr) {
    out += "{\"content\":[";
    out += *choice.logprob_items;
    out += "]}";
  } else {
    out += "null";
  }
  append_ending(out, choice.finish_reason, choice.stop_token);
  out += ",\"token_ids\":";
  append_token_ids(out, choice.token_ids);
  append_weight_versions(out, choice.weight_versions);
  out += '}';
}

void append_completion_logprobs(CompletionLogprobs& out, const wire::LogprobsView& rows,
                                std::int64_t k) {
  const std::size_t columns = rows.columns();
  const std::size_t keep = k < 0 ? columns : std::min(columns, static_cast<std::size_t>(k) + 1);
  for (std::size_t row = 0; row < rows.rows(); ++row) {
    const bool later = !out.tokens.empty();
    if (later) {
      out.text_offset += ',';
      out.token_logprobs += ',';
      out.tokens += ',';
      out.top_logprobs += ',';
    }
    const std::size_t first = row * columns;
    const std::int64_t id = rows.token_ids.integer(first);
    out.text_offset += std::to_string(out.next_offset);
    const std::size_t before = out.tokens.size();
    append_placeholder(out.tokens, id);
    out.next_offset += static_cast<std::int64_t>(out.tokens.size() - before - 2);  // no quotes
    append_logprob(out.token_logprobs, rows.logprobs.real(first));
    out.top_logprobs += '{';
    std::size_t kept = 0;
    for (std::size_t column = 0; column < columns && kept < keep; ++column) {
      if (repeated(rows, row, column)) continue;
      if (kept++ != 0) out.top_logprobs += ',';
      append_placeholder(out.top_logprobs, rows.token_ids.integer(first + column));
      out.top_logprobs += ':';
      append_logprob(out.top_logprobs, rows.logprobs.real(first + column));
    }
    out.top_logprobs += '}';
  }
}

void append_completion_choice(std::string& out, const CompletionChoiceText& choice) {
  out += "{\"index\":";
  out += std::to_string(choice.index);
  out += ",\"text\":\"\",\"logprobs\":";
  if (const CompletionLogprobs* logprobs = choice.logprobs) {
    out += "{\"text_offset\":[";
    out += logprobs->text_offset;
    out += "],\"token_logprobs\":[";
    out += logprobs->token_logprobs;
    out += "],\"tokens\":[";
    out += logprobs->tokens;
    out += "],\"top_logprobs\":[";
    out += logprobs->top_logprobs;
    out += "]}";
  } else {
    out += "null";
  }
  append_ending(out, choice.finish_reason, choice.stop_token);
  out += ",\"token_ids\":";
  if (choice.with_token_ids) {
    append_token_ids(out, choice.token_ids);
  } else {
    out += "null";
  }
  out += ",\"prompt_token_ids\":";
  if (choice.prompt_token_ids) {
    append_token_ids(out, *choice.prompt_token_ids);
  } else {
    out += "null";
  }
  append_weight_versions(out, choice.weight_versions);
  if (choice.body) {
    out += ",\"prompt_logprobs\":";
    if (choice.prompt_logprob_rows != nullptr) {
      out += "[null";
      out += *choice.prompt_logprob_rows;
      out += ']';
    } else {
      out += "null";
    }
  }
  out += '}';
}

std::string sse_event(std::string_view json) {
  std::string event;
  event.reserve(json.size() + 8);
  event += "data: ";
  event += json;
  event += "\n\n";
  return event;
}

std::string sse_error_event(std::string_view message, std::string_view type, int code) {
  std::string json = "{\"error\":{\"message\":";
  wire::append_json_string(json, message);
  json += ",\"type\":";
  wire::append_json_string(json, type);
  json += ",\"param\":null,\"code\":";
  json += std::to_string(code);
  json += "}}";
  return sse_event(json);
}

}  // namespace vllmd::api
