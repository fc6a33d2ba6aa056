#include "daemon/metrics.hpp"

#include <sstream>

#include "common/api/table.hpp"

namespace vllmd::daemon {

namespace {
constexpr std::string_view kOperationMetric = "vllm:rl_weight_update_operation_duration_seconds";
}  // namespace

void Metrics::observe_operation(std::string_view operation, double seconds) {
  std::lock_guard lock(mutex_);
  auto found = operations_.find(operation);
  if (found == operations_.end())
    found = operations_.emplace(std::string(operation), Histogram{}).first;
  Histogram& histogram = found->second;
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) {
      ++histogram.buckets[i];
      break;
    }
  }
  ++histogram.count;
  histogram.sum += seconds;
}

void Metrics::count_request(std::string_view route, int status) {
  // Only table routes get their own label: arbitrary paths must not grow the series set.
  const api::Route* found = api::find_route(route);
  const std::size_t index = found != nullptr ? api::route_index(*found) : api::routes().size();
  std::lock_guard lock(mutex_);
  ++requests_[{index, status}];
}

namespace {

// One metric without labels: its HELP and TYPE lines, then its value.
template <typename T> void write_single(std::ostream& out, std::string_view name,
                                        std::string_view type, std::string_view help, T value) {
  out << "# HELP " << name << " " << help << "\n"
      << "# TYPE " << name << " " << type << "\n"
      << name << " " << value << "\n";
}

void write_engines(std::ostream& out, const std::vector<engine::EngineStatus>& engines,
                   std::size_t pending_calls) {
  out << "# HELP vllmd_engine_up Whether the engine of each DP rank is attached and alive.\n"
      << "# TYPE vllmd_engine_up gauge\n";
  for (const engine::EngineStatus& engine : engines) {
    out << "vllmd_engine_up{rank=\"" << engine.rank << "\"} "
        << (engine.state == engine::EngineState::kReady ? 1 : 0) << "\n";
  }
  write_single(out, "vllmd_engine_calls_pending", "gauge",
               "Engine calls sent and not yet answered.", pending_calls);
}

void write_connections(std::ostream& out, const ConnectionGauges& connections) {
  write_single(out, "vllmd_http_connections", "gauge", "Open HTTP connections.",
               connections.current);
  write_single(out, "vllmd_http_connections_busy", "gauge",
               "Connections whose request is being handled.", connections.busy);
  write_single(out, "vllmd_http_connections_queued", "gauge",
               "Requests waiting for an executor thread.", connections.queued);
  write_single(out, "vllmd_http_connections_refused_total", "counter",
               "Connections refused: too many open.", connections.refused);
  write_single(out, "vllmd_http_connections_total", "counter", "Connections accepted.",
               connections.total);
}

}  // namespace

void Metrics::write_operations(std::ostream& out) const {
  out << "# HELP " << kOperationMetric
      << " Duration of weight-sync operations that reached the engines.\n"
      << "# TYPE " << kOperationMetric << " histogram\n";
  // Every operation label appears from the start, so dashboards see zeros rather than gaps.
  for (const api::Route& route : api::routes()) {
    const std::string_view operation = route.metric;
    if (operation.empty()) continue;
    const auto found = operations_.find(operation);
    const Histogram histogram = found == operations_.end() ? Histogram{} : found->second;
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < kBuckets.size(); ++i) {
      cumulative += histogram.buckets[i];
      out << kOperationMetric << "_bucket{operation=\"" << operation << "\",le=\"" << kBuckets[i]
          << "\"} " << cumulative << "\n";
    }
    out << kOperationMetric << "_bucket{operation=\"" << operation << "\",le=\"+Inf\"} "
        << histogram.count << "\n";
    out << kOperationMetric << "_sum{operation=\"" << operation << "\"} " << histogram.sum << "\n";
    out << kOperationMetric << "_count{operation=\"" << operation << "\"} " << histogram.count
        << "\n";
  }
}

void Metrics::write_requests(std::ostream& out) const {
  out << "# HELP vllmd_http_requests_total HTTP requests answered, by route and status.\n"
      << "# TYPE vllmd_http_requests_total counter\n";
  for (const auto& [key, count] : requests_) {
    const std::string_view route = key.first < api::routes().size() ? api::routes()[key.first].path
                                                                    : std::string_view("other");
    out << "vllmd_http_requests_total{route=\"" << route << "\",status=\"" << key.second << "\"} "
        << count << "\n";
  }
}

std::string Metrics::render(const std::vector<engine::EngineStatus>& engines,
                            std::size_t pending_calls, const ConnectionGauges& connections) const {
  std::ostringstream out;
  out.precision(9);
  std::lock_guard lock(mutex_);
  write_operations(out);
  write_requests(out);
  write_engines(out, engines, pending_calls);
  write_connections(out, connections);
  return out.str();
}

}  // namespace vllmd::daemon
