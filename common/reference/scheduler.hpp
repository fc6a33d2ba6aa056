#pragma once
// The reference engine's scheduler, without sockets (like core.hpp): continuous batching of
// EngineCoreRequests into one EngineCoreOutputs per step, with vLLM's stop rules, pause
// modes and client aborts (docs/engine-protocol.md §10.3, §10.4, as vLLM). Tokens follow
// tokens.hpp, or, with a model (set_model), come from it through sampler.hpp. Steps reuse
// their output buffers, so a step allocates nothing per token.

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/reference/llama.hpp"
#include "common/reference/sampler.hpp"
#include "common/wire/generation_output.hpp"
#include "common/wire/generation_request.hpp"

namespace vllmd::reference {

struct SchedulerOptions {
  std::int64_t engine_index = 0;
  std::size_t max_num_seqs = 256;  // running at once; the rest wait, first come first served
  int tokens_per_step = 1;         // tokens per running request per step (as spec decode)
  std::int64_t vocab_size = 32000;
  std::int64_t max_model_len = 4096;  // prompt plus output
  bool include_finished_set = false;  // vLLM fills finished_requests only with DP > 1
};

// pause_scheduler's modes: abort ends every request, wait lets the running ones drain and
// starts no new one, keep freezes everything.
enum class PauseMode { kAbort, kWait, kKeep };

class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options);

  // Queues a request; false (and a log line) when its id is already in flight. With
  // `fail`, it ends at the next step with finish_reason ERROR and no tokens.
  bool add(wire::EngineCoreRequest request, bool fail = false);
  // A client abort: the requests end without any output (finished_requests names them later
  // when the set is on). Unknown ids are ignored.
  void abort(std::span<const std::string> request_ids);

  void pause(PauseMode mode);
  void resume();
  bool paused() const { return state_ != State::kRunning; }
  // New weights: tokens from the next step on (frozen requests too) use this fingerprint.
  void set_fingerprint(std::uint64_t fingerprint);
  std::uint64_t fingerprint() const { return fingerprint_; }
  // Generate from `model` (nullptr: the token formula). The model is read at every step, so
  // weights loaded into it apply from the next step on; it must outlive the scheduler.
  void set_model(const LlamaModel* model);

  // Requests that hold KV blocks without a client ("--running-requests"): they count as
  // active, send nothing, and a pause in mode abort or wait ends them.
  void set_phantom_requests(int count) { phantoms_ = count; }

  // Whether requests ended (pause abort, the generate fault) wait for their output.
  bool has_endings() const { return !endings_.empty(); }
  // Whether step() would send something now.
  bool has_work() const;
  std::size_t running() const { return running_.size(); }
  std::size_t waiting() const { return waiting_.size(); }
  // Running requests, phantoms included: what holds KV blocks.
  std::size_t active() const { return running_.size() + static_cast<std::size_t>(phantoms_); }

  // One step: ends what pause/fault ended, admits waiting requests (unless paused), one token
  // batch for every running request (unless paused in keep). The result is valid until the
  // next call.
  const wire::OutputsToSend& step(double timestamp);

 private:
  enum class State { kRunning, kPausedNew, kPausedAll };

  struct Request {
    std::string id;
    std::vector<std::int64_t> prompt;
    std::uint64_t key = 0;
    std::uint64_t digest = 0;
    std::uint64_t base = 0;
    std::uint64_t epoch = 0;  // of the fingerprint `base` was made with; 0: none yet
    std::int64_t max_tokens = 16;
    std::int64_t min_tokens = 0;
    std::optional<std::int64_t> eos;       // unless ignore_eos
    std::vector<std::int64_t> stop_ids;    // stop_token_ids
    std::vector<std::int64_t> masked;      // under min_tokens: every stop id and EOS
    std::optional<std::int64_t> logprobs;  // k
    std::optional<std::int64_t> prompt_logprobs;
    std::int64_t generated = 0;
    bool started = false;  // its first output went out
    // With a model: the sampling settings, the random stream, the KV cache, and the last
    // token, fed at the next step (so that step's logits come from the weights then held).
    SamplingSettings sampling;
    RandomStream random;
    KvCache cache;
    std::optional<std::int64_t> unfed;
  };

  struct Ending {
    std::string id;
    wire::FinishReason reason;
  };

  static Request make_request(wire::EngineCoreRequest&& request);
  wire::OutputToSend& next_output();
  void generate(Request& request, wire::OutputToSend& output);
  std::int64_t formula_token(Request& request, wire::OutputToSend& output);
  std::int64_t model_token(Request& request, wire::OutputToSend& output);
  void prefill(Request& request, wire::OutputToSend& output);
  void add_model_row(wire::LogprobRows& rows, std::int64_t token);
  void fill_prompt_logprobs(const Request& request, wire::OutputToSend& output) const;
  std::int64_t columns(std::int64_t k) const;
  void finish(std::string_view id);

  SchedulerOptions options_;
  State state_ = State::kRunning;
  std::uint64_t fingerprint_ = 0;
  std::uint64_t epoch_ = 1;
  int phantoms_ = 0;
  std::deque<Request> waiting_;
  std::vector<Request> running_;
  std::vector<Ending> endings_;
  std::vector<std::string> client_aborted_;  // for finished_requests
  // A client aborted a request in flight: one step reports the stats without it, as vLLM's
  // scheduler steps while aborted ids wait to be reported.
  bool stats_pending_ = false;
  std::unordered_set<std::string> in_flight_;
  const LlamaModel* model_ = nullptr;
  std::vector<double> logits_, logprobs_, probs_;  // one token's, reused
  std::vector<std::int64_t> top_;
  wire::OutputsToSend outbox_;
  std::vector<wire::OutputToSend> spare_;  // outputs of earlier steps, kept for their buffers
};

}  // namespace vllmd::reference
