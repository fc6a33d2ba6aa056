#pragma once
// /metrics for generation, with vLLM's names and labels (`engine`, `model_name`), as vLLM's
// Python server exports them, so dashboards built for vLLM read vllmd: requests running and
// waiting (the engines' scheduler stats), prompt and generation token counters, requests by
// finished reason, and the time-to-first-token, inter-token and end-to-end latency histograms.
// Beside them vllmd's own: each engine's requests in flight and load score, and aborts by
// cause. Every figure is per engine request (a choice of an answer with n > 1 counts once).

#include <array>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/api/generation_stats.hpp"
#include "common/engine/engine_requests.hpp"

namespace vllmd::daemon {

class GenerationMetrics {
 public:
  // vLLM's buckets, seconds; +Inf is implied.
  static constexpr std::array<double, 22> kFirstTokenBuckets = {
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  static constexpr std::array<double, 21> kEndToEndBuckets = {
      0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
      30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  // vLLM's finished_reason label values.
  static constexpr std::array<std::string_view, 5> kFinishedReasons = {"stop", "length", "abort",
                                                                       "repetition", "error"};

  // An answer ended: each of its engine requests.
  void record(const std::vector<api::ChoiceStats>& choices);
  // `loads`: the engines' as the engine client last saw them.
  void write(std::ostream& out, const std::vector<engine::EngineLoad>& loads,
             std::string_view model_name) const;

 private:
  template <std::size_t N> struct Histogram {
    std::array<std::uint64_t, N + 1> buckets{};  // non-cumulative; +Inf last
    std::uint64_t count = 0;
    double sum = 0;
    void observe(const std::array<double, N>& bounds, double value);
  };
  struct PerEngine {
    std::uint64_t prompt_tokens = 0;
    std::uint64_t generation_tokens = 0;
    std::array<std::uint64_t, kFinishedReasons.size()> finished{};
    Histogram<kFirstTokenBuckets.size()> first_token;
    Histogram<api::kInterTokenBuckets.size()> inter_token;
    Histogram<kEndToEndBuckets.size()> end_to_end;
  };
  mutable std::mutex mutex_;
  std::map<int, PerEngine> engines_;  // by DP rank
  std::array<std::uint64_t, api::kAbortCauseNames.size()> aborts_{};
};

}  // namespace vllmd::daemon
