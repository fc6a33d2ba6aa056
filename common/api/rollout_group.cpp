#include "common/api/rollout_group.hpp"

#include <algorithm>

#include "common/api/generation.hpp"

namespace vllmd::api {

RolloutGroup::RolloutGroup(GenerationService& service, engine::EngineRequests& requests,
                           RolloutSetup head, std::int64_t n, std::size_t choices, CallPtr call,
                           Done done)
    : service_(service), requests_(requests), head_(std::move(head)), n_(n), call_(std::move(call)),
      done_(std::move(done)), finished_(choices), has_finished_(choices, false), left_(choices) {
  choices_.reserve(choices);
  engine_ids_.reserve(choices);
}

void RolloutGroup::add(const std::shared_ptr<Rollout>& choice) {
  choices_.push_back(choice);
  engine_ids_.push_back(choice->engine_id());
}

void RolloutGroup::abort_with(AbortCause cause, std::vector<std::string>& engine_ids) {
  for (const auto& weak : choices_) {
    if (auto choice = weak.lock()) choice->abort_with(cause, engine_ids);
  }
}

void RolloutGroup::cancel() {
  for (const auto& weak : choices_) {
    if (auto choice = weak.lock()) choice->cancel();
  }
}

void RolloutGroup::begin_stream() {
  if (streaming_) return;
  call_->stream->begin(200, "text/event-stream");
  streaming_ = true;
}

void RolloutGroup::choice_finished(ChoiceEnd end) {
  if (ended_) return;
  const auto index = static_cast<std::size_t>(end.index);
  finished_[index] = std::move(end);
  has_finished_[index] = true;
  if (--left_ == 0) answer();
}

void RolloutGroup::answer() {
  // A prompt's tokens count once however many choices it has; every choice's tokens count.
  Usage usage;
  auto first_token = std::chrono::steady_clock::time_point::max();
  for (const ChoiceEnd& choice : finished_) {
    if (choice.index % n_ == 0) {
      usage.prompt_tokens += choice.usage.prompt_tokens;
      usage.cached_tokens += choice.usage.cached_tokens;
    }
    usage.completion_tokens += choice.usage.completion_tokens;
    if (choice.first_token_at != std::chrono::steady_clock::time_point{}) {
      first_token = std::min(first_token, choice.first_token_at);
    }
  }
  Response response;
  if (head_.stream) {
    call_->stream->write(closing_events(head_, usage));
    response.streamed = true;
  } else {
    std::size_t size = 0;
    for (const ChoiceEnd& choice : finished_) size += choice.choice.size() + 1;
    std::string choices;
    choices.reserve(size);
    for (const ChoiceEnd& choice : finished_) {
      if (!choices.empty()) choices += ',';
      choices += choice.choice;
    }
    // The generate route's prompt_logprobs are the first prompt's (it has only one).
    const ChoiceEnd& first = finished_.front();
    const ChoiceEnd& newest = *std::max_element(
        finished_.begin(), finished_.end(),
        [](const ChoiceEnd& a, const ChoiceEnd& b) { return a.version_epoch < b.version_epoch; });
    response.body = answer_body(head_, {choices, usage, first.prompt_logprob_rows,
                                        first.kv_transfer_params, newest.version.get()});
  }
  response.tokens = usage.completion_tokens;
  response.choices.reserve(finished_.size());
  for (const ChoiceEnd& choice : finished_) response.choices.push_back(choice.stats);
  if (first_token != std::chrono::steady_clock::time_point::max()) {
    response.first_token_seconds =
        std::chrono::duration<double>(first_token - head_.started).count();
  }
  finish(std::move(response));
}

void RolloutGroup::end(Response response) {
  if (ended_) return;
  // The others say nothing more, and their engines stop. /metrics hears of every choice.
  for (std::size_t i = 0; i < finished_.size(); ++i) {
    if (has_finished_[i]) response.choices.push_back(finished_[i].stats);
  }
  for (const auto& weak : choices_) {
    if (auto choice = weak.lock()) {
      if (auto stats = choice->silence()) response.choices.push_back(*stats);
    }
  }
  requests_.abort(engine_ids_);
  finish(std::move(response));
}

void RolloutGroup::finish(Response response) {
  ended_ = true;
  Done done = std::move(done_);
  service_.finished(head_.request_id);
  done(std::move(response));
}

}  // namespace vllmd::api
