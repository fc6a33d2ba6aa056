#pragma once
// The weight-sync service: one call in, one response out, with the engine calls in between
// (docs/http-api.md §5). The API table says how each route is served and names its handler
// here. It knows nothing of sockets or HTTP servers, so the daemon, the tests and the
// benchmarks drive the same code.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/api/call.hpp"
#include "common/api/committed_version.hpp"
#include "common/api/errors.hpp"
#include "common/api/known_state.hpp"
#include "common/api/request.hpp"
#include "common/api/serial_queue.hpp"
#include "common/api/session.hpp"
#include "common/api/sleep_state.hpp"
#include "common/api/table.hpp"
#include "common/engine/engine_calls.hpp"
#include "common/util/executor.hpp"

namespace vllmd::api {

struct ServiceOptions {
  // NCCL init and update block inside the engine until the trainer's rendezvous or broadcast
  // completes, so lifecycle calls get minutes; queries get seconds.
  std::chrono::milliseconds lifecycle_timeout = std::chrono::minutes(30);
  std::chrono::milliseconds query_timeout = std::chrono::seconds(10);
  // world_size for engines whose registration frame is empty (older vLLM).
  std::int64_t world_size_fallback = 1;
  // An owned weight-update session idle this long becomes anonymous.
  std::chrono::milliseconds session_idle_timeout = std::chrono::minutes(10);
  // The model GET /v1/models lists.
  std::string served_model_name = "default";
};

Response error_response(const ApiError& error, double engine_seconds = 0);

// One engine operation a route makes (its Route::metric label), for vLLM's RL metrics: once
// when it is dispatched (`finished` false), once when it ends.
struct OperationEvent {
  std::string_view operation;
  bool finished = false;
  double seconds = 0;
  bool succeeded = false;
  bool reached_engine = false;  // false: every engine was unavailable, nothing was sent
};
using OperationObserver = std::function<void(const OperationEvent& event)>;

// What only the daemon can answer, for the routes the service hands to it.
struct DaemonHooks {
  std::function<Response()> metrics;                   // Prometheus text
  std::function<std::optional<std::string>()> reload;  // the error line, when invalid
  // GET /server_info's body; `json_config`: the configuration as JSON, else as TOML text.
  std::function<std::string(bool json_config)> server_info;
};

class WeightSyncService {
 public:
  // `engines`: the daemon's EngineClient, or a fake in unit tests; it outlives the service.
  // `executor` starts queued lifecycle calls and runs their wait limits (see SerialQueue).
  WeightSyncService(engine::EngineCalls& engines, ServiceOptions options,
                    util::Executor* executor = nullptr);

  // Answers one call as its route says (Route::handling, Route::handler). Validation and
  // transcoding run on the calling thread; nothing waits there.
  void handle(const CallPtr& call, const Done& done);
  // Whether the route is answered without waiting for an engine right now (vllmd's own
  // answers, and reads of known state): an event loop may then call handle in place.
  bool answers_at_once(const Route& route) const;

  void set_operation_observer(OperationObserver observer) { observer_ = std::move(observer); }
  void set_daemon_hooks(DaemonHooks hooks) { hooks_ = std::move(hooks); }
  // Told of every version committed on all engines (it outlives the service).
  void label_commits(CommittedVersion* committed) { committed_ = committed; }
  // By rank: "awake", "weights_offloaded" (sleep level 1), "discard_all" (level 2), or ""
  // when only the KV cache sleeps (vllm:engine_sleep_state).
  std::vector<std::string_view> sleep_states() const;
  // Give it every engine state change (EngineClient::set_state_listener), while both live.
  void on_engine_state(const engine::EngineStatus& engine);

  // The routes' handlers (named by the API table). Lifecycle ones run in the lifecycle
  // queue with the call's body validated; the others as they come.
  void forward_to_workers(const CallPtr& call, const Done& done);  // init
  void start(const CallPtr& call, const Done& done);
  void update(const CallPtr& call, const Done& done);
  void finish(const CallPtr& call, const Done& done);
  void set_version_label(const CallPtr& call, const Done& done);  // update_weight_version
  void read(const CallPtr& call, const Done& done);               // weight_info, is_paused
  void scheduler(const CallPtr& call, const Done& done);          // pause, resume
  void engine_command(const CallPtr& call, const Done& done);     // reset_mm_cache, ...
  void reset_prefix_cache(const CallPtr& call, const Done& done);
  void is_sleeping(const CallPtr& call, const Done& done);
  void sleep(const CallPtr& call, const Done& done);  // lifecycle, as are the two below
  void wake_up(const CallPtr& call, const Done& done);
  void release_kv_cache_memory(const CallPtr& call, const Done& done);
  void collective_rpc(const CallPtr& call, const Done& done);  // lifecycle (rpc.cpp)
  void weight_checker(const CallPtr& call, const Done& done);  // lifecycle
  void world_size(const CallPtr& call, const Done& done);
  void health(const CallPtr& call, const Done& done);
  void version(const CallPtr& call, const Done& done);
  void metrics(const CallPtr& call, const Done& done);
  void reload(const CallPtr& call, const Done& done);
  void session_status(const CallPtr& call, const Done& done);
  void models(const CallPtr& call, const Done& done);  // GET /v1/models
  void server_info(const CallPtr& call, const Done& done);

 private:
  // Runs one UTILITY method on every engine (or on `ranks`); `then` gets the replies and the
  // error summary. `changes`: the known state it makes uncertain until it succeeds.
  struct FanOut {
    std::uint64_t sequence = 0;  // known state: what it established dates from then
    std::optional<ApiError> error;
    std::vector<engine::EngineReply> replies;
    double seconds = 0;
  };
  void fan_out(std::string operation_name, std::string metric, const std::string& engine_method,
               const engine::EngineCalls::ArgParts& args, const engine::CallOptions& options,
               Changes changes, const std::vector<int>& ranks, std::function<void(FanOut)> then);

  // The route's engine method with the call's args on every engine; `answer` turns the
  // replies into the 200 (an engine's failure is answered before it). engine_commands.cpp.
  void on_every_engine(const CallPtr& call, Changes changes,
                       std::function<Response(const FanOut&)> answer, const Done& done);

  // Sleep mode (sleep.cpp): the 409 for a weight update while weights sleep, or nothing.
  std::optional<ApiError> weights_asleep() const;
  void sleep_call(const CallPtr& call,
                  std::function<void(FanOut, std::vector<std::uint64_t>)> then);
  Response sleep_failure(const FanOut& result) const;

  // The lifecycle (lifecycle.cpp).
  void enqueue(const CallPtr& call, const Done& done);
  static Response succeeded_response(const Route& route, double seconds);
  void forward(const Call& call, std::vector<std::uint64_t> incarnations,
               std::function<void(FanOut)> then);
  void flush_pending_closes(const std::function<void()>& then);
  std::vector<int> unclosed_ranks() const;
  std::optional<std::vector<std::uint64_t>> continue_session(const Call& call, const Done& done);
  void commit_version(const std::string& version, double seconds_before,
                      std::vector<std::uint64_t> incarnations, const Done& done);
  void lose(const std::vector<int>& restarted, const std::vector<std::uint64_t>& session,
            bool survivors_open, double seconds, const Done& done);
  void close_sessions(const std::vector<int>& ranks, std::vector<std::uint64_t> incarnations,
                      const std::function<void(const std::string& outcome)>& then);
  std::string close_outcome(const std::vector<engine::EngineReply>& replies,
                            const std::vector<std::uint64_t>& incarnations);
  std::vector<std::uint64_t> current_incarnations() const;
  std::vector<int> restarted_ranks(const std::vector<std::uint64_t>& session) const;
  std::vector<int> all_ranks() const;

  void deliver_scheduler(int rank,
                         const std::pair<std::string, std::string>& call);  // scheduler.cpp
  // Reads and vllmd's own answers (service.cpp).
  Response known_answer(const Route& route);
  void sync_known();
  std::optional<ApiError> not_ready() const;

  engine::EngineCalls& engines_;
  ServiceOptions options_;
  std::int64_t started_at_;  // Unix seconds: /v1/models' "created"
  OperationObserver observer_;
  DaemonHooks hooks_;
  SerialQueue lifecycle_queue_;
  Sessions sessions_;
  std::atomic<int> calls_in_flight_{0};
  std::atomic<std::uint64_t> synced_admissions_{~std::uint64_t{0}};  // none synced yet
  KnownState known_;
  CommittedVersion* committed_ = nullptr;
  SleepStates sleep_;
  // A pause or resume that could not reach an engine (it was unreachable or not answering):
  // delivered as soon as the engine is ready again. By rank: the method and its args.
  std::mutex scheduler_mutex_;
  std::map<int, std::pair<std::string, std::string>> undelivered_scheduler_;
  // Ranks that were unreachable when vllmd closed their session (by rank: the incarnation
  // that may still hold it): closed once they answer again, and before any start.
  mutable std::mutex pending_closes_mutex_;
  std::map<int, std::uint64_t> pending_closes_;
};

}  // namespace vllmd::api
