#pragma once
// The weight-sync service: one validated route in, one HTTP response out, with the engine
// calls in between (http-api.md section 5). It knows nothing of sockets or HTTP servers, so
// the daemon, the tests and the benchmarks drive the same code.

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/api/errors.hpp"
#include "common/api/known_state.hpp"
#include "common/api/request.hpp"
#include "common/api/table.hpp"
#include "common/engine/client.hpp"

namespace vllmd::api {

struct ServiceOptions {
  // NCCL init and update block inside the engine until the trainer's rendezvous or broadcast
  // completes, so lifecycle calls get minutes; queries get seconds.
  std::chrono::milliseconds lifecycle_timeout = std::chrono::minutes(30);
  std::chrono::milliseconds query_timeout = std::chrono::seconds(10);
  // world_size for engines whose registration frame is empty (older vLLM).
  std::int64_t world_size_fallback = 1;
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

class WeightSyncService {
 public:
  WeightSyncService(engine::EngineClient& engines, ServiceOptions options);

  // `body` is the raw request body (empty when none was sent); the service may release it
  // once transcoded, so a 90 MB body and its msgpack never sit in memory with a third copy.
  Response handle(const Route& route, const Query& query, std::string& body);

  // Whether `operation` is answered without waiting for an engine right now (a GET that
  // reads vllmd's own state). An event loop may then serve it in place.
  bool answers_at_once(Operation operation) const;
  // Reads from known state even when it is uncertain, never asking the engines: for a
  // caller that must not block (the answer is what vllmd last knew).
  Response handle_without_waiting(const Route& route, const Query& query);

  void set_operation_observer(OperationObserver observer) { observer_ = std::move(observer); }

 private:
  Response lifecycle(const Route& route, const Query& query, std::string& body);
  Response read_only(const Route& route, const Query& query, bool may_wait = true);
  void sync_known();
  Response finish(const Route& route, std::string& body);
  Response health() const;
  Response version() const;
  Response world_size(const Query& query) const;

  // Runs one UTILITY method on every engine; an error response when any failed.
  struct FanOut {
    std::optional<ApiError> error;
    std::vector<engine::EngineReply> replies;
    double seconds = 0;
  };
  FanOut fan_out(std::string_view operation_name, std::string_view metric,
                 std::string_view engine_method, const engine::EngineClient::ArgParts& args,
                 const engine::CallOptions& options);

  engine::EngineClient& engines_;
  ServiceOptions options_;
  OperationObserver observer_;
  std::timed_mutex lifecycle_mutex_;
  std::atomic<int> calls_in_flight_{0};
  std::atomic<std::uint64_t> synced_admissions_{~std::uint64_t{0}};  // none synced yet
  KnownState known_;
};

}  // namespace vllmd::api
