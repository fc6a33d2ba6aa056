#pragma once
// Next-token choice from a model's raw logits, as vLLM's sampler makes it: greedy (argmax,
// the lowest id on ties) when the temperature is 0, else temperature, min-p, top-k and top-p
// in that order and a draw from the request's own random stream, reproducible for a seed.
// And the logprob rows vLLM returns: the log-softmax of the raw logits (raw_logprobs).

#include <cstdint>
#include <span>
#include <vector>

namespace vllmd::reference {

struct SamplingSettings {
  double temperature = 1.0;
  double top_p = 1.0;
  std::int64_t top_k = 0;  // 0 or -1: every token
  double min_p = 0.0;
  bool greedy() const { return temperature < 1e-5; }  // vLLM's _SAMPLING_EPS
};

// splitmix64: a stream that is the same on every platform, one per request.
class RandomStream {
 public:
  explicit RandomStream(std::uint64_t seed = 0) : state_(seed) {}
  std::uint64_t next();
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)

 private:
  std::uint64_t state_;
};

// Picks a token from `logits`, never one of `banned` (min_tokens masks the stop ids).
// `scratch` is reused across calls.
std::int64_t sample_token(std::span<const double> logits, const SamplingSettings& settings,
                          std::span<const std::int64_t> banned, RandomStream& random,
                          std::vector<double>& scratch);

// The `k` ids with the highest logprobs, highest first, the lower id first on ties.
void top_ids(std::span<const double> logprobs, std::size_t k, std::vector<std::int64_t>& ids);

// vLLM's rank of a token: 1 + how many tokens have a strictly higher logprob.
std::int64_t rank_of(std::span<const double> logprobs, std::int64_t token);

}  // namespace vllmd::reference
