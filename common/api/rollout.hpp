#pragma once
// One generation request on its way through an engine: the sink the engine client feeds on its
// IO thread (engine_requests.hpp). It turns each step's delta into the client's answer: kept
// for one JSON body at the end, or written as one SSE event, merged with the next ones while
// the client has not taken the previous (so a slow reader costs one event per step at most,
// and a reader too slow for stream_buffer_limit is cut off).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/api/call.hpp"
#include "common/api/committed_version.hpp"
#include "common/api/errors.hpp"
#include "common/api/generation_render.hpp"
#include "common/api/generation_stats.hpp"
#include "common/engine/engine_requests.hpp"

namespace vllmd::api {

class GenerationService;
class RolloutGroup;

// What the service's table of requests in flight holds: one answer, with one engine request
// (a Rollout) or several (a RolloutGroup).
class InFlightAnswer {
 public:
  InFlightAnswer() = default;
  virtual ~InFlightAnswer() = default;
  InFlightAnswer(const InFlightAnswer&) = delete;
  InFlightAnswer& operator=(const InFlightAnswer&) = delete;

  virtual const std::string& request_id() const = 0;
  // Any thread: marks it aborted for `cause` (unless it already was) and appends the engine
  // ids to abort.
  virtual void abort_with(AbortCause cause, std::vector<std::string>& engine_ids) = 0;
  // Any thread. The client left: the engines stop, and nobody gets an answer.
  virtual void cancel() = 0;
};

struct RolloutSetup {
  // /v1/completions' shape ("id", "object": "text_completion", logprobs as four lists)
  // rather than /inference/v1/generate's.
  bool completion = false;
  bool return_token_ids = false;  // completions: token_ids and prompt_token_ids per choice
  std::string request_id;         // as the client knows it: "generate-tokens-<base>", "cmpl-<base>"
  std::string engine_id;          // unique among the requests in flight
  std::string model_name;
  std::int64_t created = 0;
  std::int64_t prompt_tokens = 0;
  std::vector<std::int64_t> prompt_token_ids;  // for the body's prompt_token_ids
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;
  std::optional<std::int64_t> logprobs;  // k, when asked for
  bool prompt_logprobs = false;
  std::size_t stream_buffer_limit = 0;
  const CommittedVersion* versions = nullptr;  // labels the tokens with weight versions
  std::chrono::steady_clock::time_point started;
  // One choice of several (n > 1, a batch of prompts): its index, and the answer it is part of.
  std::int64_t index = 0;
  std::shared_ptr<RolloutGroup> group;
};

// An answer's JSON around its choices (`choices`: rendered, comma-separated): the body, and a
// stream's closing events (the usage chunk when asked for, then [DONE]).
struct AnswerParts {
  std::string_view choices;
  Usage usage;
  std::string_view prompt_logprob_rows;  // the generate route's: what follows the leading null
  std::string_view kv_transfer_params;   // JSON
  // The generate route's one label for the answer (vime reads it): the version of its last
  // token, or the one in force when it ended without tokens. Null: none.
  const std::string* weight_version = nullptr;
};
std::string answer_body(const RolloutSetup& setup, const AnswerParts& parts);
std::string closing_events(const RolloutSetup& setup, const Usage& usage);

// How one choice of a RolloutGroup ended well: what the group's answer needs of it.
struct ChoiceEnd {
  std::int64_t index = 0;
  std::string choice;  // rendered (a body's choice; empty for a stream)
  Usage usage;
  std::chrono::steady_clock::time_point first_token_at{};
  std::string prompt_logprob_rows;
  std::string kv_transfer_params;
  ChoiceStats stats;
  // Its answer_version(): the answer's label is the newest of its choices' (highest epoch).
  std::uint64_t version_epoch = 0;
  std::shared_ptr<const std::string> version;
};

class Rollout final : public engine::RequestSink, public InFlightAnswer {
 public:
  Rollout(GenerationService& service, engine::EngineRequests& requests, RolloutSetup setup,
          CallPtr call, Done done);

  void on_sent(int rank) override;
  void on_output(const wire::OutputView& output) override;
  void on_closed(engine::Closed why, std::string_view message) override;

  void cancel() override;
  const std::string& request_id() const override { return setup_.request_id; }
  void abort_with(AbortCause cause, std::vector<std::string>& engine_ids) override;
  const std::string& engine_id() const { return setup_.engine_id; }
  // IO thread, for its group, which ended early: this choice says nothing more. Its stats,
  // unless it had ended already.
  std::optional<ChoiceStats> silence();

 private:
  void take(const wire::OutputView& output);
  void begin_stream();
  bool stream_open() const;  // its head went out (this choice's or, in a group, another's)
  void label_version();      // a commit happened since the last tokens
  // The version its last token came under, else the one in force now; its epoch first. A
  // null version when nothing labels the tokens.
  std::pair<std::uint64_t, std::shared_ptr<const std::string>> answer_version() const;
  void finish(std::string_view reason, std::optional<std::int64_t> stop_token);
  void finish_choice(std::string_view reason, std::optional<std::int64_t> stop_token);
  void fail(const ApiError& error);
  // Streams: the merged delta as one event (with the finish reason at the end).
  std::string chunk(std::optional<std::string_view> finish_reason,
                    std::optional<std::int64_t> stop_token);
  void append_choice_to(std::string& out, std::optional<std::string_view> finish_reason,
                        std::optional<std::int64_t> stop_token, bool body) const;
  void write_delta();
  std::string body(std::string_view finish_reason, std::optional<std::int64_t> stop_token) const;
  Usage usage() const;
  void mark_aborted(AbortCause cause);
  ChoiceStats stats() const;
  void end(Response response);

  // IO thread, every engine step: first, on as few cache lines as they fit (thousands of
  // streams each get a delta per step, and each line a step touches per stream is a likely
  // cache miss).
  bool streaming_ = false;  // the SSE head went out
  bool ended_ = false;
  const bool continuous_usage_;  // setup_'s flags that every event reads, kept here
  const bool with_logprobs_;
  const bool completion_;
  bool prompt_ids_pending_;           // a completion stream's first chunk carries them
  ResponseStream* stream_;            // call_->stream, one hop less per event
  std::vector<std::int64_t> tokens_;  // all of them, or a stream's unsent delta
  std::string logprob_items_;         // like tokens_, rendered
  // What every event of a stream starts with, up to its choice: rendered once.
  const std::string event_head_;
  std::int64_t completion_tokens_ = 0;
  std::chrono::steady_clock::time_point first_token_at_{};  // {} until the first token
  const CommittedVersion* versions_;                        // setup_'s
  std::uint64_t version_epoch_ = 0;  // the commit the last labelled tokens came under
  RolloutGroup* const group_;        // setup_'s, or null for an answer of its own

  GenerationService& service_;
  engine::EngineRequests& requests_;
  const RolloutSetup setup_;
  CallPtr call_;
  Done done_;

  // IO thread only, now and then.
  CompletionLogprobs completion_logprobs_;  // /v1/completions: instead of logprob_items_
  // {"version":...,"first_token":N} items, one per version the tokens came under.
  std::string weight_versions_;
  std::shared_ptr<const std::string> last_version_;
  std::string prompt_logprob_rows_;
  std::string kv_transfer_params_ = "null";
  std::int64_t cached_tokens_ = 0;
  int rank_ = -1;  // the engine that took it
  std::chrono::steady_clock::time_point last_output_at_{};
  InterTokenLatency inter_token_;
  std::string_view finished_reason_;

  std::atomic<bool> client_gone_{false};
  std::atomic<AbortCause> abort_cause_{AbortCause::kNone};
};

}  // namespace vllmd::api
