#include "common/reference/scheduler.hpp"

#include <algorithm>
#include <utility>

#include "common/reference/tokens.hpp"
#include "common/util/log.hpp"

namespace vllmd::reference {

namespace {

constexpr std::int64_t kDefaultMaxTokens = 16;  // SamplingParams.max_tokens

bool contains(const std::vector<std::int64_t>& ids, std::int64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Empties `slot` for new rows, keeping its buffers.
wire::LogprobRows& reset_rows(std::optional<wire::LogprobRows>& slot, std::size_t columns) {
  if (!slot) slot.emplace();
  slot->rows = 0;
  slot->columns = columns;
  slot->token_ids.clear();
  slot->logprobs.clear();
  slot->ranks.clear();
  return *slot;
}

// One row: `token` first (rank 1), then the top k tokens by tokens.hpp's rule.
void add_row(wire::LogprobRows& rows, std::int64_t token, std::int64_t vocab_size) {
  rows.token_ids.push_back(token);
  rows.logprobs.push_back(logprob_of_rank(1));
  rows.ranks.push_back(1);
  for (std::size_t j = 1; j < rows.columns; ++j) {
    rows.token_ids.push_back((token + static_cast<std::int64_t>(j) - 1) % vocab_size);
    rows.logprobs.push_back(logprob_of_rank(static_cast<std::int64_t>(j)));
  }
  ++rows.rows;
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options) : options_(options) {
  options_.max_num_seqs = std::max<std::size_t>(1, options_.max_num_seqs);
  options_.tokens_per_step = std::max(1, options_.tokens_per_step);
  options_.vocab_size = std::max<std::int64_t>(2, options_.vocab_size);
  outbox_.engine_index = options_.engine_index;
}

Scheduler::Request Scheduler::make_request(wire::EngineCoreRequest&& request) {
  Request made;
  made.id = std::move(request.request_id);
  made.prompt = std::move(request.prompt_token_ids);
  const wire::SamplingParams params =
      request.sampling_params ? std::move(*request.sampling_params) : wire::SamplingParams{};
  made.key = request_key(params.seed, made.id);
  made.digest = prompt_digest(made.prompt);
  made.max_tokens = params.max_tokens.value_or(kDefaultMaxTokens);
  made.min_tokens = params.min_tokens.value_or(0);
  if (!params.ignore_eos.value_or(false)) made.eos = params.eos_token_id;
  made.stop_ids = params.stop_token_ids.value_or(std::vector<std::int64_t>{});
  // vLLM's min-tokens logits processor masks _all_stop_token_ids (stop ids and EOS).
  made.masked = params.all_stop_token_ids.value_or(std::vector<std::int64_t>{});
  for (std::int64_t id : made.stop_ids) {
    if (!contains(made.masked, id)) made.masked.push_back(id);
  }
  if (made.eos && !contains(made.masked, *made.eos)) made.masked.push_back(*made.eos);
  made.logprobs = params.logprobs;
  made.prompt_logprobs = params.prompt_logprobs;
  made.sampling.temperature = params.temperature.value_or(1.0);
  made.sampling.top_p = params.top_p.value_or(1.0);
  made.sampling.top_k = params.top_k.value_or(0);
  made.sampling.min_p = params.min_p.value_or(0.0);
  made.random = RandomStream(made.key);  // the seed's, or the request id's
  return made;
}

bool Scheduler::add(wire::EngineCoreRequest request, bool fail) {
  if (!in_flight_.insert(request.request_id).second) {
    util::log::warning("reference engine ", options_.engine_index, ": dropping request ",
                       request.request_id, ": a request with that id is in flight");
    return false;
  }
  if (fail) {
    endings_.push_back({request.request_id, wire::FinishReason::kError});
    return true;
  }
  waiting_.push_back(make_request(std::move(request)));
  return true;
}

void Scheduler::abort(std::span<const std::string> request_ids) {
  for (const std::string& id : request_ids) {
    if (!in_flight_.erase(id)) continue;
    const auto same = [&](const auto& item) { return item.id == id; };
    std::erase_if(running_, same);
    std::erase_if(waiting_, same);
    std::erase_if(endings_, same);
    stats_pending_ = true;
    if (options_.include_finished_set) client_aborted_.push_back(id);
  }
}

void Scheduler::pause(PauseMode mode) {
  if (mode != PauseMode::kKeep) phantoms_ = 0;
  if (mode == PauseMode::kKeep) {
    state_ = State::kPausedAll;
    return;
  }
  state_ = State::kPausedNew;
  if (mode == PauseMode::kWait) return;
  // Every request ends with an ABORT output; its tokens so far went out already.
  for (Request& request : running_) endings_.push_back({request.id, wire::FinishReason::kAbort});
  for (Request& request : waiting_) endings_.push_back({request.id, wire::FinishReason::kAbort});
  running_.clear();
  waiting_.clear();
}

void Scheduler::resume() { state_ = State::kRunning; }

void Scheduler::set_fingerprint(std::uint64_t fingerprint) {
  fingerprint_ = fingerprint;
  ++epoch_;
}

bool Scheduler::has_work() const {
  // stats_pending_ also covers client_aborted_: both come from a client's ABORT.
  if (!endings_.empty() || stats_pending_) return true;
  if (state_ == State::kPausedAll) return false;
  return !running_.empty() || (state_ == State::kRunning && !waiting_.empty());
}

wire::OutputToSend& Scheduler::next_output() {
  if (spare_.empty()) {
    outbox_.outputs.emplace_back();
  } else {
    outbox_.outputs.push_back(std::move(spare_.back()));
    spare_.pop_back();
  }
  wire::OutputToSend& output = outbox_.outputs.back();
  output.new_token_ids.clear();
  output.finish_reason.reset();
  output.stop_token.reset();
  output.num_cached_tokens.reset();
  return output;
}

std::int64_t Scheduler::columns(std::int64_t k) const {
  // -1 asks for the whole vocabulary.
  return 1 + (k < 0 ? options_.vocab_size : std::min(k, options_.vocab_size));
}

void Scheduler::fill_prompt_logprobs(const Request& request, wire::OutputToSend& output) const {
  // The first prompt token has no row, as in vLLM: nothing precedes it.
  if (!request.prompt_logprobs || request.prompt.size() < 2) return;
  wire::LogprobRows& rows = reset_rows(output.prompt_logprobs,
                                       static_cast<std::size_t>(columns(*request.prompt_logprobs)));
  for (std::size_t i = 1; i < request.prompt.size(); ++i) {
    const std::int64_t token = request.prompt[i] % options_.vocab_size;
    add_row(rows, token < 0 ? token + options_.vocab_size : token, options_.vocab_size);
  }
}

void Scheduler::set_model(const LlamaModel* model) {
  model_ = model;
  if (model_ == nullptr) return;
  options_.vocab_size = model_->config().vocab_size;
  logits_.resize(static_cast<std::size_t>(options_.vocab_size));
  logprobs_.resize(logits_.size());
}

std::int64_t Scheduler::formula_token(Request& request, wire::OutputToSend& output) {
  if (request.epoch != epoch_) {
    request.base = token_base(fingerprint_, request.key, request.digest);
    request.epoch = epoch_;
  }
  const std::int64_t t = request.generated;
  std::int64_t token = token_at(request.base, t, options_.vocab_size);
  if (t < request.min_tokens) {
    for (std::size_t tries = 0; tries <= request.masked.size() && contains(request.masked, token);
         ++tries) {
      token = (token + 1) % options_.vocab_size;
    }
  }
  if (request.logprobs) add_row(*output.logprobs, token, options_.vocab_size);
  return token;
}

// A row from the model's logprobs: the token, its logprob and rank, then the top ones.
void Scheduler::add_model_row(wire::LogprobRows& rows, std::int64_t token) {
  rows.token_ids.push_back(token);
  rows.logprobs.push_back(static_cast<float>(logprobs_[static_cast<std::size_t>(token)]));
  rows.ranks.push_back(rank_of(logprobs_, token));
  top_ids(logprobs_, rows.columns - 1, top_);
  for (const std::int64_t id : top_) {
    rows.token_ids.push_back(id);
    rows.logprobs.push_back(static_cast<float>(logprobs_[static_cast<std::size_t>(id)]));
  }
  ++rows.rows;
}

// The prompt through the model: logits after its last token, and with prompt_logprobs a row
// for every token after the first.
void Scheduler::prefill(Request& request, wire::OutputToSend& output) {
  if (request.prompt.empty()) request.prompt.push_back(0);  // vLLM refuses empty prompts
  const bool rows = request.prompt_logprobs && request.prompt.size() > 1;
  wire::LogprobRows* prompt_rows =
      rows ? &reset_rows(output.prompt_logprobs,
                         static_cast<std::size_t>(columns(*request.prompt_logprobs)))
           : nullptr;
  for (std::size_t i = 0; i < request.prompt.size(); ++i) {
    const bool last = i + 1 == request.prompt.size();
    model_->forward(
        request.cache, request.prompt[i],
        last || prompt_rows != nullptr ? std::span<double>(logits_) : std::span<double>{});
    if (prompt_rows != nullptr && !last) {
      log_softmax(logits_, logprobs_);
      std::int64_t next = request.prompt[i + 1] % options_.vocab_size;
      add_model_row(*prompt_rows, next < 0 ? next + options_.vocab_size : next);
    }
  }
}

std::int64_t Scheduler::model_token(Request& request, wire::OutputToSend& output) {
  if (request.unfed) {
    model_->forward(request.cache, *request.unfed, logits_);
  } else {
    prefill(request, output);
  }
  const std::span<const std::int64_t> banned = request.generated < request.min_tokens
                                                   ? std::span<const std::int64_t>(request.masked)
                                                   : std::span<const std::int64_t>{};
  const std::int64_t token =
      sample_token(logits_, request.sampling, banned, request.random, probs_);
  if (request.logprobs) {
    log_softmax(logits_, logprobs_);
    add_model_row(*output.logprobs, token);
  }
  request.unfed = token;
  return token;
}

void Scheduler::generate(Request& request, wire::OutputToSend& output) {
  output.request_id.assign(request.id);
  if (request.logprobs) {
    reset_rows(output.logprobs, static_cast<std::size_t>(columns(*request.logprobs)));
  }
  if (!request.started) {
    request.started = true;
    output.num_cached_tokens = 0;
    if (model_ == nullptr) fill_prompt_logprobs(request, output);
  }
  const auto prompt_length = static_cast<std::int64_t>(request.prompt.size());
  for (int i = 0; i < options_.tokens_per_step && !output.finish_reason; ++i) {
    const std::int64_t token =
        model_ != nullptr ? model_token(request, output) : formula_token(request, output);
    output.new_token_ids.push_back(token);
    ++request.generated;
    // vLLM's check_stop: the length caps first, then the stops once min_tokens is reached.
    if (prompt_length + request.generated >= options_.max_model_len ||
        request.generated >= request.max_tokens) {
      output.finish_reason = wire::FinishReason::kLength;
    } else if (request.generated >= request.min_tokens) {
      if (request.eos && token == *request.eos) {
        output.finish_reason = wire::FinishReason::kStop;  // stop_reason stays None for EOS
      } else if (contains(request.stop_ids, token)) {
        output.finish_reason = wire::FinishReason::kStop;
        output.stop_token = token;
      }
    }
  }
}

void Scheduler::finish(std::string_view id) {
  if (options_.include_finished_set) outbox_.finished_requests.emplace_back(id);
  in_flight_.erase(std::string(id));
}

const wire::OutputsToSend& Scheduler::step(double timestamp) {
  stats_pending_ = false;
  // In reverse, so that the next step's outputs take back the same buffers in order.
  for (auto output = outbox_.outputs.rbegin(); output != outbox_.outputs.rend(); ++output) {
    spare_.push_back(std::move(*output));
  }
  outbox_.outputs.clear();
  outbox_.finished_requests.clear();
  for (std::string& id : client_aborted_) outbox_.finished_requests.push_back(std::move(id));
  client_aborted_.clear();

  for (Ending& ending : endings_) {
    wire::OutputToSend& output = next_output();
    output.request_id.assign(ending.id);
    output.logprobs.reset();
    output.prompt_logprobs.reset();
    output.finish_reason = ending.reason;
    finish(ending.id);
  }
  endings_.clear();

  if (state_ == State::kRunning) {
    while (running_.size() < options_.max_num_seqs && !waiting_.empty()) {
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
  }
  if (state_ != State::kPausedAll) {
    for (Request& request : running_) {
      wire::OutputToSend& output = next_output();
      if (!request.logprobs) output.logprobs.reset();
      // A recycled output may hold an earlier request's prompt rows.
      if (request.started || !request.prompt_logprobs) output.prompt_logprobs.reset();
      generate(request, output);
      if (output.finish_reason) finish(request.id);
    }
    std::erase_if(running_,
                  [&](const Request& request) { return !in_flight_.contains(request.id); });
  }
  outbox_.scheduler_stats = wire::SchedulerStats{static_cast<std::int64_t>(running_.size()),
                                                 static_cast<std::int64_t>(waiting_.size())};
  outbox_.timestamp = timestamp;
  return outbox_;
}

}  // namespace vllmd::reference
