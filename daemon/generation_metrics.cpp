#include "daemon/generation_metrics.hpp"

#include <algorithm>
#include <ostream>

namespace vllmd::daemon {

namespace {

void header(std::ostream& out, std::string_view name, std::string_view type,
            std::string_view help) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
}

// A histogram's series for one label set ("engine=\"0\",model_name=\"m\"").
template <std::size_t N, typename Buckets>
void write_histogram(std::ostream& out, std::string_view name, const std::string& labels,
                     const std::array<double, N>& bounds, const Buckets& buckets,
                     std::uint64_t count, double sum) {
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < N; ++i) {
    cumulative += buckets[i];
    out << name << "_bucket{" << labels << ",le=\"" << bounds[i] << "\"} " << cumulative << "\n";
  }
  out << name << "_bucket{" << labels << ",le=\"+Inf\"} " << count << "\n"
      << name << "_sum{" << labels << "} " << sum << "\n"
      << name << "_count{" << labels << "} " << count << "\n";
}

// Prometheus' escapes in a label value.
std::string label_value(std::string_view text) {
  std::string escaped;
  for (const char c : text) {
    if (c == '\\' || c == '"') escaped += '\\';
    escaped += c == '\n' ? std::string_view("\\n") : std::string_view(&c, 1);
  }
  return escaped;
}

}  // namespace

template <std::size_t N>
void GenerationMetrics::Histogram<N>::observe(const std::array<double, N>& bounds, double value) {
  const auto at = std::lower_bound(bounds.begin(), bounds.end(), value);
  ++buckets[static_cast<std::size_t>(at - bounds.begin())];
  ++count;
  sum += value;
}

void GenerationMetrics::record(const std::vector<api::ChoiceStats>& choices) {
  std::lock_guard lock(mutex_);
  for (const api::ChoiceStats& choice : choices) {
    if (choice.abort_cause != api::AbortCause::kNone) {
      ++aborts_[static_cast<std::size_t>(choice.abort_cause)];
    }
    if (choice.engine < 0) continue;  // no engine took it: nothing of vLLM's to count
    PerEngine& engine = engines_[choice.engine];
    engine.prompt_tokens += static_cast<std::uint64_t>(choice.prompt_tokens);
    engine.generation_tokens += static_cast<std::uint64_t>(choice.generation_tokens);
    const auto reason =
        std::find(kFinishedReasons.begin(), kFinishedReasons.end(), choice.finished_reason);
    if (reason != kFinishedReasons.end()) {
      ++engine.finished[static_cast<std::size_t>(reason - kFinishedReasons.begin())];
    }
    if (choice.first_token_seconds) {
      engine.first_token.observe(kFirstTokenBuckets, *choice.first_token_seconds);
    }
    const api::InterTokenLatency& gaps = choice.inter_token;
    for (std::size_t i = 0; i < gaps.buckets.size(); ++i) {
      engine.inter_token.buckets[i] += gaps.buckets[i];
    }
    engine.inter_token.count += gaps.count;
    engine.inter_token.sum += gaps.sum;
    engine.end_to_end.observe(kEndToEndBuckets, choice.e2e_seconds);
  }
}

void GenerationMetrics::write(std::ostream& out, const std::vector<engine::EngineLoad>& loads,
                              std::string_view model_name) const {
  std::lock_guard lock(mutex_);
  const std::string model = label_value(model_name);
  const auto labels = [&](int rank) {
    return "engine=\"" + std::to_string(rank) + "\",model_name=\"" + model + "\"";
  };
  const auto per_engine = [this](int rank) {
    const auto found = engines_.find(rank);
    return found == engines_.end() ? PerEngine{} : found->second;
  };
  // Every engine appears from the start, so dashboards see zeros rather than gaps.
  const auto gauge = [&](std::string_view name, std::string_view help, auto value_of) {
    header(out, name, "gauge", help);
    for (const engine::EngineLoad& load : loads) {
      out << name << "{" << labels(load.rank) << "} " << value_of(load) << "\n";
    }
  };
  gauge("vllm:num_requests_running", "Requests in the engine's running batch (its own stats).",
        [](const engine::EngineLoad& load) { return load.running; });
  gauge("vllm:num_requests_waiting", "Requests waiting in the engine's queue (its own stats).",
        [](const engine::EngineLoad& load) { return load.waiting; });
  const auto counter = [&](std::string_view name, std::string_view help, auto value_of) {
    header(out, name, "counter", help);
    for (const engine::EngineLoad& load : loads) {
      out << name << "{" << labels(load.rank) << "} " << value_of(per_engine(load.rank)) << "\n";
    }
  };
  counter("vllm:prompt_tokens_total", "Prompt tokens of the requests that ended.",
          [](const PerEngine& engine) { return engine.prompt_tokens; });
  counter("vllm:generation_tokens_total", "Tokens generated for the requests that ended.",
          [](const PerEngine& engine) { return engine.generation_tokens; });
  header(out, "vllm:request_success_total", "counter", "Requests that ended, by finished reason.");
  for (const engine::EngineLoad& load : loads) {
    const PerEngine engine = per_engine(load.rank);
    for (std::size_t i = 0; i < kFinishedReasons.size(); ++i) {
      out << "vllm:request_success_total{" << labels(load.rank) << ",finished_reason=\""
          << kFinishedReasons[i] << "\"} " << engine.finished[i] << "\n";
    }
  }
  const auto histograms = [&](std::string_view name, std::string_view help, const auto& bounds,
                              auto of) {
    header(out, name, "histogram", help);
    for (const engine::EngineLoad& load : loads) {
      const PerEngine engine = per_engine(load.rank);
      const auto& h = of(engine);
      write_histogram(out, name, labels(load.rank), bounds, h.buckets, h.count, h.sum);
    }
  };
  histograms(
      "vllm:time_to_first_token_seconds", "From a request's arrival at vllmd to its first token.",
      kFirstTokenBuckets,
      [](const PerEngine& engine) -> const auto& { return engine.first_token; });
  histograms(
      "vllm:inter_token_latency_seconds", "Between a request's consecutive outputs with tokens.",
      api::kInterTokenBuckets,
      [](const PerEngine& engine) -> const auto& { return engine.inter_token; });
  histograms(
      "vllm:e2e_request_latency_seconds", "From a request's arrival at vllmd to its end.",
      kEndToEndBuckets, [](const PerEngine& engine) -> const auto& { return engine.end_to_end; });
  header(out, "vllmd_engine_requests_in_flight", "gauge",
         "Generation requests vllmd sent to each engine and not yet ended.");
  for (const engine::EngineLoad& load : loads) {
    out << "vllmd_engine_requests_in_flight{engine=\"" << load.rank << "\"} "
        << load.requests_in_flight << "\n";
  }
  header(out, "vllmd_engine_load_score", "gauge",
         "Each engine's load as vllmd balances on it (lower takes the next request).");
  for (const engine::EngineLoad& load : loads) {
    out << "vllmd_engine_load_score{engine=\"" << load.rank << "\"} " << engine::load_score(load)
        << "\n";
  }
  header(out, "vllmd_generation_aborts_total", "counter",
         "Engine requests that ended aborted, by cause.");
  for (std::size_t i = 1; i < aborts_.size(); ++i) {
    out << "vllmd_generation_aborts_total{cause=\"" << api::kAbortCauseNames[i] << "\"} "
        << aborts_[i] << "\n";
  }
}

}  // namespace vllmd::daemon
