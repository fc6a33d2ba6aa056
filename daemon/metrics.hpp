#pragma once
// Prometheus metrics of vllmd (text exposition format 0.0.4): vLLM's RL operation metrics
// (weight-update duration, outcomes and in-flight; sleep-mode duration and in-flight; each
// engine's sleep state), request counts by route and status, engine liveness and HTTP
// connection gauges.

#include <array>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/engine/client.hpp"
#include "daemon/generation_metrics.hpp"

namespace vllmd::api {
struct Route;
}  // namespace vllmd::api

namespace vllmd::daemon {

struct ConnectionGauges {
  int current = 0;            // open connections
  int busy = 0;               // with a request being handled
  int queued = 0;             // tasks waiting for an executor thread
  std::uint64_t refused = 0;  // cumulative: over server.max_connections
  std::uint64_t total = 0;    // cumulative: accepted
};

class Metrics {
 public:
  // Upper bounds of the duration buckets, seconds; +Inf is implied.
  static constexpr std::array<double, 17> kBuckets = {
      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800};

  // An operation dispatched (`finished` false) or ended (api::OperationEvent's fields).
  void operation_started(std::string_view operation);
  void operation_finished(std::string_view operation, double seconds, bool succeeded,
                          bool reached_engine);
  // `route`: the table's row, or nullptr for a path outside the table.
  void count_request(const api::Route* route, int status);
  // A generation ended (answered, failed or left): its tokens and, once one came, the time
  // from its request to its first token; and each of its engine requests.
  void generation_finished(std::int64_t tokens, std::optional<double> first_token_seconds,
                           const std::vector<api::ChoiceStats>& choices);
  // `sleep_states`: by rank, as api::WeightSyncService::sleep_states gives them.
  // `generations`: in flight now. `loads` and `model_name`: for vLLM's generation metrics.
  std::string render(const std::vector<engine::EngineStatus>& engines, std::size_t pending_calls,
                     const ConnectionGauges& connections,
                     const std::vector<std::string_view>& sleep_states = {},
                     std::size_t generations = 0, const std::vector<engine::EngineLoad>& loads = {},
                     std::string_view model_name = {}) const;

  // Time to first token, seconds (vLLM's buckets up to 10 s); +Inf is implied.
  static constexpr std::array<double, 16> kFirstTokenBuckets = {
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10};

 private:
  struct Histogram {
    std::array<std::uint64_t, kBuckets.size()> buckets{};  // non-cumulative counts
    std::uint64_t count = 0;
    double sum = 0;
  };
  struct Operation {
    Histogram duration;  // of those that reached an engine
    std::uint64_t succeeded = 0;
    std::uint64_t failed = 0;
    std::int64_t in_flight = 0;
  };
  void write_operations(std::ostream& out) const;                          // with mutex_ held
  void write_requests(std::ostream& out) const;                            // with mutex_ held
  void write_generations(std::ostream& out, std::size_t in_flight) const;  // with mutex_ held

  mutable std::mutex mutex_;
  std::map<std::string, Operation, std::less<>> operations_;
  // By route (an index into api::routes(); routes().size() for any other path) and status.
  std::map<std::pair<std::size_t, int>, std::uint64_t> requests_;
  std::uint64_t generation_tokens_ = 0;
  std::array<std::uint64_t, kFirstTokenBuckets.size()> first_token_buckets_{};  // non-cumulative
  std::uint64_t first_token_count_ = 0;
  double first_token_sum_ = 0;
  GenerationMetrics generation_;  // locks on its own
};

}  // namespace vllmd::daemon
