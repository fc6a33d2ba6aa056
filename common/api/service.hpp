#pragma once
// The weight-sync service: one validated route in, one HTTP response out, with the engine
// calls in between (http-api.md section 5). It knows nothing of sockets or HTTP servers, so
// the daemon, the tests and the benchmarks drive the same code.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/api/errors.hpp"
#include "common/api/known_state.hpp"
#include "common/api/request.hpp"
#include "common/api/serial_queue.hpp"
#include "common/api/session.hpp"
#include "common/api/table.hpp"
#include "common/engine/client.hpp"
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
};

struct Response {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  double engine_seconds = 0;  // time spent waiting for engines
};

Response error_response(const ApiError& error, double engine_seconds = 0);

// The outcome of one operation that reached the engines, for the duration histogram.
using OperationObserver = std::function<void(std::string_view operation, double seconds)>;

// Every request ends in exactly one call of its Done, from whatever thread finished it (the
// caller's, an engine IO thread's or the executor's): it must not block.
using Done = std::function<void(Response)>;

// What a request carries besides its route, query and body.
struct RequestContext {
  std::optional<std::string> session;  // its Vllmd-Session id (valid; nullopt: none)
};

class WeightSyncService {
 public:
  // `executor` starts queued lifecycle calls and runs their wait limits (see SerialQueue).
  WeightSyncService(engine::EngineClient& engines, ServiceOptions options,
                    util::Executor* executor = nullptr);

  // `body` is the raw request body (empty when none was sent); it is released once
  // transcoded, so a 90 MB body and its msgpack never sit in memory with a third copy.
  // Validation and transcoding run on the calling thread; nothing waits there.
  void handle(const Route& route, const Query& query, std::string body, RequestContext context,
              Done done);

  // Whether `operation` is answered without waiting for an engine right now (a GET that
  // reads vllmd's own state): handle_without_waiting then answers it in place.
  bool answers_at_once(Operation operation) const;
  // Reads from known state even when it is uncertain, never asking the engines.
  Response handle_without_waiting(const Route& route, const Query& query);

  void set_operation_observer(OperationObserver observer) { observer_ = std::move(observer); }
  // Give it every engine state change (EngineClient::set_state_listener), while both live.
  void on_engine_state(const engine::EngineStatus& engine);

 private:
  // Runs one UTILITY method on every engine (or on `ranks`); `then` gets the replies and the
  // error summary.
  struct FanOut {
    std::uint64_t sequence = 0;  // known state: what it established dates from then
    std::optional<ApiError> error;
    std::vector<engine::EngineReply> replies;
    double seconds = 0;
  };
  void fan_out(std::string operation_name, std::string metric, std::string engine_method,
               const engine::EngineClient::ArgParts& args, const engine::CallOptions& options,
               const std::vector<int>& ranks, std::function<void(FanOut)> then);

  // The lifecycle (lifecycle.cpp).
  struct LifecycleCall;
  void lifecycle(const Route& route, std::string body, std::optional<std::string> client,
                 Done done);
  void run_lifecycle(const std::shared_ptr<LifecycleCall>& call, Done done);
  static Response succeeded_response(const Route& route, double seconds);
  void forward(const LifecycleCall& call, std::vector<std::uint64_t> incarnations,
               std::function<void(FanOut)> then);
  void start(const std::shared_ptr<LifecycleCall>& call, Done done);
  void flush_pending_closes(std::function<void()> then);
  std::optional<std::vector<std::uint64_t>> continue_session(const LifecycleCall& call, Done& done);
  void update(const std::shared_ptr<LifecycleCall>& call, Done done);
  void finish(const std::shared_ptr<LifecycleCall>& call, Done done);
  void set_version(const std::string& version, double seconds_before,
                   std::vector<std::uint64_t> incarnations, Done done);
  void lose(const std::vector<int>& restarted, const std::vector<std::uint64_t>& session,
            bool survivors_open, double seconds, Done done);
  void close_sessions(const std::vector<int>& ranks, std::vector<std::uint64_t> incarnations,
                      std::function<void(std::string outcome)> then);
  std::string close_outcome(const std::vector<engine::EngineReply>& replies,
                            const std::vector<std::uint64_t>& incarnations);
  std::vector<std::uint64_t> current_incarnations() const;
  std::vector<int> restarted_ranks(const std::vector<std::uint64_t>& session) const;
  std::vector<int> all_ranks() const;

  // Reads, the scheduler and vllmd's own answers (service.cpp).
  void read(const Route& route, Done done);
  void scheduler(const Route& route, const Query& query, Done done);
  Response known_answer(const Route& route);
  void sync_known();
  std::optional<ApiError> not_ready() const;
  Response health() const;
  Response version() const;
  Response world_size(const Query& query) const;

  engine::EngineClient& engines_;
  ServiceOptions options_;
  OperationObserver observer_;
  SerialQueue lifecycle_queue_;
  Sessions sessions_;
  std::atomic<int> calls_in_flight_{0};
  std::atomic<std::uint64_t> synced_admissions_{~std::uint64_t{0}};  // none synced yet
  KnownState known_;
  // A pause or resume that could not reach an engine (it was unreachable or not answering):
  // delivered as soon as the engine is ready again. By rank: the method and its args.
  std::mutex scheduler_mutex_;
  std::map<int, std::pair<std::string, std::string>> undelivered_scheduler_;
  // Ranks that were unreachable when vllmd closed their session (by rank: the incarnation
  // that may still hold it): closed once they answer again, and before any start.
  std::mutex pending_closes_mutex_;
  std::map<int, std::uint64_t> pending_closes_;
};

}  // namespace vllmd::api
