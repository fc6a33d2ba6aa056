#pragma once
// What each engine request of a generation tells /metrics when it ends: vLLM's request-level
// metrics (tokens, finished reason, time to first token, inter-token latency, end-to-end
// latency, by engine) and why vllmd aborted it. A Rollout keeps these as it goes, with no lock
// and no allocation per token, and hands them over once, with its answer.

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace vllmd::api {

// Why vllmd stopped a request before its engine finished it.
enum class AbortCause : std::uint8_t {
  kNone,
  kEngine,         // the engine ended it with "abort" (a pause with mode=abort)
  kClientGone,     // the client hung up
  kSlowReader,     // the client read too slowly: cut
  kAbortRequests,  // POST /abort_requests
  kShutdown,       // vllmd stopping
  kChoiceFailed,   // another choice of its answer failed
};
inline constexpr std::array<std::string_view, 7> kAbortCauseNames = {
    "none", "engine", "client_gone", "slow_reader", "abort_requests", "shutdown", "choice_failed"};
inline std::string_view abort_cause_name(AbortCause cause) {
  return kAbortCauseNames[static_cast<std::size_t>(cause)];
}

// vLLM's inter-token latency buckets, seconds; +Inf is implied.
inline constexpr std::array<double, 19> kInterTokenBuckets = {
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};

// Gaps between a request's outputs, binned as they come.
struct InterTokenLatency {
  std::array<std::uint32_t, kInterTokenBuckets.size() + 1> buckets{};  // non-cumulative; +Inf last
  std::uint32_t count = 0;
  double sum = 0;
  void observe(double seconds) {
    std::size_t i = 0;
    while (i < kInterTokenBuckets.size() && seconds > kInterTokenBuckets[i]) ++i;
    ++buckets[i];
    ++count;
    sum += seconds;
  }
};

struct ChoiceStats {
  int engine = -1;  // the DP rank that took it; -1: none did (refused)
  std::int64_t prompt_tokens = 0;
  std::int64_t generation_tokens = 0;
  // vLLM's finished_reason label: stop, length, abort, repetition, error.
  std::string_view finished_reason;
  AbortCause abort_cause = AbortCause::kNone;
  std::optional<double> first_token_seconds;
  double e2e_seconds = 0;
  InterTokenLatency inter_token;
};

}  // namespace vllmd::api
