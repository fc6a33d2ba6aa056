#include "common/api/rollout.hpp"

#include <tuple>

#include "common/api/generation.hpp"
#include "common/api/rollout_group.hpp"
#include "common/api/service.hpp"
#include "common/wire/json_text.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::api {

namespace {

using Clock = std::chrono::steady_clock;

// Roughly what a merged token costs once rendered, for the slow-reader limit.
constexpr std::size_t kBytesPerToken = 8;
// Room left in each event for the transport's framing (a chunk's size line and CRLF), so
// that it frames the event in place.
constexpr std::size_t kFramingRoom = 24;

// An answer's object up to its choices: {"request_id":...}, or for a completion {"id":...,
// "object":"text_completion","created":...,"model":...}; without the closing brace.
void append_object_head(std::string& json, const RolloutSetup& setup) {
  if (!setup.completion) {
    json += "{\"request_id\":";
    wire::append_json_string(json, setup.request_id);
    return;
  }
  json += "{\"id\":";
  wire::append_json_string(json, setup.request_id);
  json += ",\"object\":\"text_completion\",\"created\":";
  json += std::to_string(setup.created);
  json += ",\"model\":";
  wire::append_json_string(json, setup.model_name);
}

// ,"weight_version":"..." when there is one.
void append_weight_version(std::string& json, const std::string* version) {
  if (version == nullptr) return;
  json += ",\"weight_version\":";
  wire::append_json_string(json, *version);
}

std::string event_head(const RolloutSetup& setup) {
  std::string head = "data: ";
  append_object_head(head, setup);
  head += ",\"choices\":[";
  return head;
}

}  // namespace

std::string answer_body(const RolloutSetup& setup, const AnswerParts& parts) {
  std::string json;
  json.reserve(256 + parts.choices.size() + parts.prompt_logprob_rows.size() +
               setup.prompt_token_ids.size() * 7);
  append_object_head(json, setup);
  if (!setup.completion) {
    json += ",\"model\":";
    wire::append_json_string(json, setup.model_name);
    json += ",\"created\":";
    json += std::to_string(setup.created);
  }
  json += ",\"choices\":[";
  json += parts.choices;
  json += "],\"usage\":";
  append_usage(json, parts.usage);
  if (!setup.completion) {
    json += ",\"prompt_logprobs\":";
    if (setup.prompt_logprobs) {
      json += "[null";
      json += parts.prompt_logprob_rows;
      json += ']';
    } else {
      json += "null";
    }
    json += ",\"prompt_token_ids\":";
    append_token_ids(json, setup.prompt_token_ids);
  }
  json += ",\"kv_transfer_params\":";
  json += parts.kv_transfer_params;
  if (!setup.completion) append_weight_version(json, parts.weight_version);
  json += '}';
  return json;
}

std::string closing_events(const RolloutSetup& setup, const Usage& usage) {
  std::string events;
  if (setup.include_usage) {
    std::string json;
    append_object_head(json, setup);
    json += ",\"choices\":[],\"usage\":";
    append_usage(json, usage);
    json += '}';
    events += sse_event(json);
  }
  events += kSseDone;
  return events;
}

Rollout::Rollout(GenerationService& service, engine::EngineRequests& requests, RolloutSetup setup,
                 CallPtr call, Done done)
    : continuous_usage_(setup.continuous_usage), with_logprobs_(setup.logprobs.has_value()),
      completion_(setup.completion),
      prompt_ids_pending_(setup.completion && setup.return_token_ids), stream_(call->stream.get()),
      event_head_(event_head(setup)), versions_(setup.versions), group_(setup.group.get()),
      service_(service), requests_(requests), setup_(std::move(setup)), call_(std::move(call)),
      done_(std::move(done)) {}

void Rollout::cancel() {
  mark_aborted(AbortCause::kClientGone);
  client_gone_ = true;
  requests_.abort({setup_.engine_id});
}

void Rollout::abort_with(AbortCause cause, std::vector<std::string>& engine_ids) {
  mark_aborted(cause);
  engine_ids.push_back(setup_.engine_id);
}

void Rollout::mark_aborted(AbortCause cause) {
  AbortCause none = AbortCause::kNone;
  abort_cause_.compare_exchange_strong(none, cause);
}

std::optional<ChoiceStats> Rollout::silence() {
  if (ended_) return std::nullopt;
  ended_ = true;
  mark_aborted(AbortCause::kChoiceFailed);
  finished_reason_ = "abort";
  return stats();
}

ChoiceStats Rollout::stats() const {
  ChoiceStats stats;
  stats.engine = rank_;
  stats.prompt_tokens = setup_.prompt_tokens;
  stats.generation_tokens = completion_tokens_;
  stats.finished_reason = finished_reason_;
  if (finished_reason_ == "abort") {
    const AbortCause cause = abort_cause_.load();
    stats.abort_cause = cause == AbortCause::kNone ? AbortCause::kEngine : cause;
  }
  if (first_token_at_ != Clock::time_point{}) {
    stats.first_token_seconds =
        std::chrono::duration<double>(first_token_at_ - setup_.started).count();
  }
  stats.e2e_seconds = std::chrono::duration<double>(Clock::now() - setup_.started).count();
  stats.inter_token = inter_token_;
  return stats;
}

void Rollout::on_sent(int rank) {
  rank_ = rank;
  if (!setup_.stream || ended_) return;
  // The head goes once an engine took the request: a refusal before that is a plain 503.
  begin_stream();
}

void Rollout::begin_stream() {
  if (group_ != nullptr) {
    group_->begin_stream();
  } else {
    stream_->begin(200, "text/event-stream");
  }
  streaming_ = true;
}

void Rollout::take(const wire::OutputView& output) {
  // The output's fields first: most steps need no more of the setup than that.
  if (output.prompt_logprobs && setup_.prompt_logprobs) {
    append_prompt_logprob_rows(prompt_logprob_rows_, *output.prompt_logprobs);
  }
  if (output.num_cached_tokens) cached_tokens_ = *output.num_cached_tokens;
  if (!output.kv_transfer_params.empty()) {
    if (auto json = wire::msgpack_to_json(output.kv_transfer_params)) {
      kv_transfer_params_ = std::move(*json);
    }
  }
  const std::size_t count = output.new_token_ids.size();
  if (count == 0) return;
  const Clock::time_point now = Clock::now();
  if (first_token_at_ == Clock::time_point{}) {
    first_token_at_ = now;
  } else {
    inter_token_.observe(std::chrono::duration<double>(now - last_output_at_).count());
  }
  last_output_at_ = now;
  if (versions_ != nullptr && versions_->epoch() != version_epoch_) label_version();
  for (const std::int64_t token : output.new_token_ids) tokens_.push_back(token);
  completion_tokens_ += static_cast<std::int64_t>(count);
  if (output.logprobs && setup_.logprobs) {
    if (completion_) {
      append_completion_logprobs(completion_logprobs_, *output.logprobs, *setup_.logprobs);
    } else {
      append_logprob_items(logprob_items_, *output.logprobs, *setup_.logprobs);
    }
  }
}

// The version committed now counts from this output's first token on (docs/http-api.md §9.7).
// A commit between reading the epoch and the text labels with the newer version, once.
void Rollout::label_version() {
  version_epoch_ = versions_->epoch();
  std::shared_ptr<const std::string> version = versions_->version();
  if (last_version_ && *last_version_ == *version) return;
  last_version_ = std::move(version);
  if (!weight_versions_.empty()) weight_versions_ += ',';
  weight_versions_ += "{\"version\":";
  wire::append_json_string(weight_versions_, *last_version_);
  weight_versions_ += ",\"first_token\":";
  weight_versions_ += std::to_string(completion_tokens_);
  weight_versions_ += '}';
}

std::pair<std::uint64_t, std::shared_ptr<const std::string>> Rollout::answer_version() const {
  if (versions_ == nullptr) return {0, nullptr};
  if (last_version_) return {version_epoch_, last_version_};
  return {versions_->epoch(), versions_->version()};
}

void Rollout::on_output(const wire::OutputView& output) {
  if (ended_) return;
  // The heap lines an event reads, asked for together rather than one miss after another.
  __builtin_prefetch(tokens_.data(), 1);
  __builtin_prefetch(event_head_.data());
  take(output);
  if (output.finish_reason) {
    const std::int64_t reason = *output.finish_reason;
    if (reason == static_cast<std::int64_t>(wire::FinishReason::kError)) {
      return fail(server_error("Internal server error"));
    }
    if (reason < 0 || reason > static_cast<std::int64_t>(wire::FinishReason::kRepetition)) {
      return fail(server_error("the engine ended the request with an unknown finish reason " +
                               std::to_string(reason)));
    }
    return finish(wire::finish_reason_name(static_cast<wire::FinishReason>(reason)),
                  output.stop_token);
  }
  if (!streaming_ || tokens_.empty()) return;
  const ResponseStream& stream = *stream_;
  if (stream.writable()) return write_delta();
  // The client has not taken the last event: merge, unless too much waits for it.
  if (stream.backlog() + logprob_items_.size() + tokens_.size() * kBytesPerToken >
      setup_.stream_buffer_limit) {
    mark_aborted(AbortCause::kSlowReader);
    client_gone_ = true;
    requests_.abort({setup_.engine_id});
    stream_->abort();
  }
}

void Rollout::on_closed(engine::Closed why, std::string_view message) {
  if (ended_) return;
  if (client_gone_) {
    // Nobody reads the answer: only the access log hears of it.
    finished_reason_ = "abort";
    Response gone{kClientClosedRequest, ""};
    gone.streamed = stream_open();
    return end(std::move(gone));
  }
  switch (why) {
    case engine::Closed::kAborted: return finish("abort", std::nullopt);
    case engine::Closed::kEngineLost: return fail(server_error(std::string(message)));
    case engine::Closed::kRefused: return fail(engine_unavailable(std::string(message)));
    case engine::Closed::kShutdown:
      return fail(engine_unavailable("vllmd is stopping: " + std::string(message)));
  }
}

Usage Rollout::usage() const { return {setup_.prompt_tokens, completion_tokens_, cached_tokens_}; }

// The one choice, in the route's shape. A completion stream's first chunk carries the
// prompt's ids (return_token_ids), a body all of them and the prompt logprobs.
void Rollout::append_choice_to(std::string& out, std::optional<std::string_view> finish_reason,
                               std::optional<std::int64_t> stop_token, bool body) const {
  // The weight versions go with the whole answer, and with a stream's last chunk.
  const std::string* versions =
      versions_ != nullptr && (body || finish_reason) ? &weight_versions_ : nullptr;
  if (!completion_) {
    return append_choice(out, {setup_.index, tokens_, with_logprobs_ ? &logprob_items_ : nullptr,
                               finish_reason, stop_token, versions});
  }
  CompletionChoiceText choice;
  choice.index = setup_.index;
  choice.token_ids = tokens_;
  choice.logprobs = with_logprobs_ ? &completion_logprobs_ : nullptr;
  choice.finish_reason = finish_reason;
  choice.stop_token = stop_token;
  choice.with_token_ids = setup_.return_token_ids;
  if (setup_.return_token_ids && (body || prompt_ids_pending_)) {
    choice.prompt_token_ids = setup_.prompt_token_ids;
  }
  choice.body = body;
  choice.prompt_logprob_rows = setup_.prompt_logprobs ? &prompt_logprob_rows_ : nullptr;
  choice.weight_versions = versions;
  append_completion_choice(out, choice);
}

std::string Rollout::chunk(std::optional<std::string_view> finish_reason,
                           std::optional<std::int64_t> stop_token) {
  // The event is rendered in place: one allocation per event, whatever its size.
  std::string event;
  const std::size_t logprob_bytes =
      with_logprobs_ ? logprob_items_.size() + completion_logprobs_.top_logprobs.size() * 2 : 0;
  event.reserve(kFramingRoom + event_head_.size() + 128 + tokens_.size() * 8 + logprob_bytes);
  event += event_head_;
  append_choice_to(event, finish_reason, stop_token, false);
  if (prompt_ids_pending_) prompt_ids_pending_ = false;
  event += "],\"usage\":";
  if (continuous_usage_) {
    append_usage(event, usage());
  } else {
    event += "null";
  }
  // The terminal chunk carries the answer's weight version too, as vime reads it.
  if (finish_reason && !completion_) append_weight_version(event, answer_version().second.get());
  event += "}\n\n";
  return event;
}

void Rollout::write_delta() {
  stream_->write(chunk(std::nullopt, std::nullopt));
  tokens_.clear();
  if (with_logprobs_) {
    logprob_items_.clear();
    completion_logprobs_.clear_rows();
  }
}

std::string Rollout::body(std::string_view finish_reason,
                          std::optional<std::int64_t> stop_token) const {
  std::string choice;
  choice.reserve(
      128 + tokens_.size() * 7 + logprob_items_.size() +
      (completion_ ? prompt_logprob_rows_.size() + setup_.prompt_token_ids.size() * 7 : 0));
  append_choice_to(choice, finish_reason, stop_token, true);
  const auto version = answer_version().second;
  return answer_body(setup_,
                     {choice, usage(), prompt_logprob_rows_, kv_transfer_params_, version.get()});
}

void Rollout::finish(std::string_view reason, std::optional<std::int64_t> stop_token) {
  finished_reason_ = reason;
  if (!streaming_) {
    if (setup_.stream) {
      // Ended before any engine took it (an abort while queued): still a well-formed stream.
      begin_stream();
    } else if (group_ == nullptr) {
      return end(Response{200, body(reason, stop_token)});
    }
  }
  if (group_ != nullptr) return finish_choice(reason, stop_token);
  // The terminal chunk always goes out, with whatever delta is still merged.
  std::string events = chunk(reason, stop_token);
  events += closing_events(setup_, usage());
  stream_->write(std::move(events));
  Response streamed;
  streamed.streamed = true;
  end(std::move(streamed));
}

// One choice of several ended well: its terminal chunk goes out, or its rendered choice to the
// group, which answers once every choice has ended.
void Rollout::finish_choice(std::string_view reason, std::optional<std::int64_t> stop_token) {
  ended_ = true;
  ChoiceEnd end;
  end.index = setup_.index;
  if (setup_.stream) {
    stream_->write(chunk(reason, stop_token));
  } else {
    append_choice_to(end.choice, reason, stop_token, true);
  }
  end.usage = usage();
  end.first_token_at = first_token_at_;
  end.prompt_logprob_rows = std::move(prompt_logprob_rows_);
  end.kv_transfer_params = std::move(kv_transfer_params_);
  end.stats = stats();
  std::tie(end.version_epoch, end.version) = answer_version();
  group_->choice_finished(std::move(end));
}

bool Rollout::stream_open() const {
  return streaming_ || (group_ != nullptr && group_->streaming());
}

void Rollout::fail(const ApiError& error) {
  finished_reason_ = "error";
  if (!stream_open()) return end(error_response(error));
  // Tokens already merged are not lost: they go out before the error.
  std::string events = tokens_.empty() ? std::string() : chunk(std::nullopt, std::nullopt);
  events += sse_error_event(error.message, error.status >= 500 ? "InternalServerError" : error.type,
                            error.status);
  events += kSseDone;
  stream_->write(std::move(events));
  Response streamed{error.status, ""};
  streamed.streamed = true;
  end(std::move(streamed));
}

void Rollout::end(Response response) {
  ended_ = true;
  response.tokens = completion_tokens_;
  if (first_token_at_ != Clock::time_point{}) {
    response.first_token_seconds =
        std::chrono::duration<double>(first_token_at_ - setup_.started).count();
  }
  response.choices.push_back(stats());
  // A choice of several that fails, or whose client left, ends its whole answer.
  if (group_ != nullptr) return group_->end(std::move(response));
  Done done = std::move(done_);
  service_.finished(setup_.request_id);
  done(std::move(response));
}

}  // namespace vllmd::api
