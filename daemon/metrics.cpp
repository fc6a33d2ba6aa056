#include "daemon/metrics.hpp"

#include <sstream>

#include "common/api/table.hpp"

namespace vllmd::daemon {

namespace {

constexpr std::string_view kWeightDuration = "vllm:rl_weight_update_operation_duration_seconds";
constexpr std::string_view kWeightOutcomes = "vllm:rl_weight_update_operations_total";
constexpr std::string_view kWeightInFlight = "vllm:rl_weight_update_operations_in_flight";
constexpr std::string_view kSleepDuration = "vllm:sleep_mode_operation_duration_seconds";
constexpr std::string_view kSleepInFlight = "vllm:sleep_mode_operations_in_flight";
constexpr std::string_view kSleepState = "vllm:engine_sleep_state";

void header(std::ostream& out, std::string_view name, std::string_view type,
            std::string_view help) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

}  // namespace

void Metrics::operation_started(std::string_view operation) {
  std::lock_guard lock(mutex_);
  auto found = operations_.find(operation);
  if (found == operations_.end()) found = operations_.emplace(operation, Operation{}).first;
  ++found->second.in_flight;
}

void Metrics::operation_finished(std::string_view operation, double seconds, bool succeeded,
                                 bool reached_engine) {
  std::lock_guard lock(mutex_);
  auto found = operations_.find(operation);
  if (found == operations_.end()) found = operations_.emplace(operation, Operation{}).first;
  Operation& entry = found->second;
  --entry.in_flight;
  ++(succeeded ? entry.succeeded : entry.failed);
  if (!reached_engine) return;
  Histogram& histogram = entry.duration;
  for (std::size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) {
      ++histogram.buckets[i];
      break;
    }
  }
  ++histogram.count;
  histogram.sum += seconds;
}

void Metrics::count_request(const api::Route* route, int status) {
  // Only table routes get their own label: arbitrary paths must not grow the series set.
  const std::size_t index = route != nullptr ? api::route_index(*route) : api::routes().size();
  std::lock_guard lock(mutex_);
  ++requests_[{index, status}];
}

void Metrics::generation_finished(std::int64_t tokens, std::optional<double> first_token_seconds,
                                  const std::vector<api::ChoiceStats>& choices) {
  generation_.record(choices);
  std::lock_guard lock(mutex_);
  generation_tokens_ += static_cast<std::uint64_t>(tokens);
  if (!first_token_seconds) return;
  for (std::size_t i = 0; i < kFirstTokenBuckets.size(); ++i) {
    if (*first_token_seconds <= kFirstTokenBuckets[i]) {
      ++first_token_buckets_[i];
      break;
    }
  }
  ++first_token_count_;
  first_token_sum_ += *first_token_seconds;
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

namespace {

void write_histogram(std::ostream& out, std::string_view name, std::string_view operation,
                     const std::array<std::uint64_t, Metrics::kBuckets.size()>& buckets,
                     std::uint64_t count, double sum) {
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    cumulative += buckets[i];
    out << name << "_bucket{operation=\"" << operation << "\",le=\"" << Metrics::kBuckets[i]
        << "\"} " << cumulative << "\n";
  }
  out << name << "_bucket{operation=\"" << operation << "\",le=\"+Inf\"} " << count << "\n";
  out << name << "_sum{operation=\"" << operation << "\"} " << sum << "\n";
  out << name << "_count{operation=\"" << operation << "\"} " << count << "\n";
}

// The routes' operation labels of one family, in table order.
std::vector<std::string_view> labels(api::MetricFamily family) {
  std::vector<std::string_view> found;
  for (const api::Route& route : api::routes()) {
    if (!route.metric.empty() && route.metric_family == family) found.push_back(route.metric);
  }
  return found;
}

}  // namespace

// Every operation label appears from the start, so dashboards see zeros rather than gaps.
void Metrics::write_operations(std::ostream& out) const {
  const auto entry = [this](std::string_view operation) {
    const auto found = operations_.find(operation);
    return found == operations_.end() ? Operation{} : found->second;
  };
  const std::vector<std::string_view> weight = labels(api::MetricFamily::kWeightUpdate);
  const std::vector<std::string_view> sleep = labels(api::MetricFamily::kSleepMode);
  header(out, kWeightDuration, "histogram",
         "Duration of weight-sync operations that reached the engines.");
  for (std::string_view operation : weight) {
    const Histogram h = entry(operation).duration;
    write_histogram(out, kWeightDuration, operation, h.buckets, h.count, h.sum);
  }
  header(out, kWeightOutcomes, "counter",
         "Weight-sync operations by outcome, one per dispatched engine call.");
  for (std::string_view operation : weight) {
    const Operation o = entry(operation);
    out << kWeightOutcomes << "{operation=\"" << operation << "\",status=\"success\"} "
        << o.succeeded << "\n"
        << kWeightOutcomes << "{operation=\"" << operation << "\",status=\"error\"} " << o.failed
        << "\n";
  }
  header(out, kWeightInFlight, "gauge", "Weight-sync operations currently awaited.");
  for (std::string_view operation : weight) {
    out << kWeightInFlight << "{operation=\"" << operation << "\"} " << entry(operation).in_flight
        << "\n";
  }
  header(out, kSleepDuration, "histogram", "Duration of sleep-mode operations.");
  for (std::string_view operation : sleep) {
    const Histogram h = entry(operation).duration;
    write_histogram(out, kSleepDuration, operation, h.buckets, h.count, h.sum);
  }
  header(out, kSleepInFlight, "gauge", "Sleep-mode operations currently awaited.");
  for (std::string_view operation : sleep) {
    out << kSleepInFlight << "{operation=\"" << operation << "\"} " << entry(operation).in_flight
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

void Metrics::write_generations(std::ostream& out, std::size_t in_flight) const {
  write_single(out, "vllmd_generations_in_flight", "gauge",
               "Generation requests sent to engines and not yet ended.", in_flight);
  write_single(out, "vllmd_generation_tokens_total", "counter",
               "Tokens generated for requests that ended.", generation_tokens_);
  constexpr std::string_view kName = "vllmd_time_to_first_token_seconds";
  out << "# HELP " << kName << " From a generation request's arrival to its first token.\n"
      << "# TYPE " << kName << " histogram\n";
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < kFirstTokenBuckets.size(); ++i) {
    cumulative += first_token_buckets_[i];
    out << kName << "_bucket{le=\"" << kFirstTokenBuckets[i] << "\"} " << cumulative << "\n";
  }
  out << kName << "_bucket{le=\"+Inf\"} " << first_token_count_ << "\n"
      << kName << "_sum " << first_token_sum_ << "\n"
      << kName << "_count " << first_token_count_ << "\n";
}

namespace {

// vLLM's gauge: 1 for the state each engine is in, 0 for the others.
void write_sleep_states(std::ostream& out, const std::vector<std::string_view>& states) {
  header(out, kSleepState, "gauge",
         "Each engine's sleep state: awake, weights_offloaded (level 1), discard_all (level 2).");
  for (std::size_t rank = 0; rank < states.size(); ++rank) {
    for (std::string_view state : {"awake", "weights_offloaded", "discard_all"}) {
      out << kSleepState << "{engine=\"" << rank << "\",sleep_state=\"" << state << "\"} "
          << (states[rank] == state ? 1 : 0) << "\n";
    }
  }
}

}  // namespace

std::string Metrics::render(const std::vector<engine::EngineStatus>& engines,
                            std::size_t pending_calls, const ConnectionGauges& connections,
                            const std::vector<std::string_view>& sleep_states,
                            std::size_t generations, const std::vector<engine::EngineLoad>& loads,
                            std::string_view model_name) const {
  std::ostringstream out;
  out.precision(9);
  generation_.write(out, loads, model_name);
  std::lock_guard lock(mutex_);
  write_operations(out);
  write_sleep_states(out, sleep_states);
  write_requests(out);
  write_generations(out, generations);
  write_engines(out, engines, pending_calls);
  write_connections(out, connections);
  return out.str();
}

}  // namespace vllmd::daemon
