#include "common/reference/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace vllmd::reference {

namespace {

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

bool banned_id(std::span<const std::int64_t> banned, std::size_t id) {
  return std::find(banned.begin(), banned.end(), static_cast<std::int64_t>(id)) != banned.end();
}

std::int64_t argmax(std::span<const double> logits, std::span<const std::int64_t> banned) {
  std::int64_t best = -1;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (banned_id(banned, i)) continue;
    if (best < 0 || logits[i] > logits[static_cast<std::size_t>(best)]) {
      best = static_cast<std::int64_t>(i);  // strictly greater: the lowest id wins ties
    }
  }
  return std::max<std::int64_t>(best, 0);
}

// Zeroes the probabilities outside the k largest (ties: lower ids kept first).
void keep_top_k(std::vector<double>& probs, std::size_t k) {
  if (k == 0 || k >= probs.size()) return;
  std::vector<std::size_t> order(probs.size());
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                   [&](std::size_t a, std::size_t b) {
                     return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
                   });
  for (auto it = order.begin() + static_cast<std::ptrdiff_t>(k); it != order.end(); ++it) {
    probs[*it] = 0;
  }
}

// vLLM's top-p: drops the least likely tokens whose total stays within 1 - p, so the kept
// ones are the smallest set (from the top) whose mass reaches p; at least one stays.
void keep_top_p(std::vector<double>& probs, double p) {
  if (p >= 1.0) return;
  std::vector<std::size_t> order(probs.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return probs[a] != probs[b] ? probs[a] < probs[b] : a > b;  // ascending
  });
  const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  double dropped = 0;
  for (std::size_t i = 0; i + 1 < order.size(); ++i) {
    dropped += probs[order[i]] / total;
    if (dropped > 1.0 - p) break;
    probs[order[i]] = 0;
  }
}

}  // namespace

std::uint64_t RandomStream::next() {
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::int64_t sample_token(std::span<const double> logits, const SamplingSettings& settings,
                          std::span<const std::int64_t> banned, RandomStream& random,
                          std::vector<double>& scratch) {
  if (settings.greedy()) return argmax(logits, banned);
  // Softmax of logits / temperature, the banned ids at probability 0.
  std::vector<double>& probs = scratch;
  probs.assign(logits.size(), 0.0);
  double top = kMinusInfinity;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (!banned_id(banned, i)) top = std::max(top, logits[i] / settings.temperature);
  }
  if (top == kMinusInfinity) return argmax(logits, {});
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (!banned_id(banned, i)) probs[i] = std::exp(logits[i] / settings.temperature - top);
  }
  if (settings.min_p > 0) {
    // The most likely token has the unnormalised probability exp(0) = 1.
    for (double& prob : probs) {
      if (prob < settings.min_p) prob = 0;
    }
  }
  if (settings.top_k > 0) keep_top_k(probs, static_cast<std::size_t>(settings.top_k));
  keep_top_p(probs, settings.top_p);

  const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
  double target = random.uniform() * total;
  std::int64_t last = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    last = static_cast<std::int64_t>(i);
    target -= probs[i];
    if (target < 0) return last;
  }
  return last;  // rounding left a sliver: the last token with any mass
}

void top_ids(std::span<const double> logprobs, std::size_t k, std::vector<std::int64_t>& ids) {
  k = std::min(k, logprobs.size());
  if (k == 0) {  // logprobs=0: the sampled token's alone, no pass over the vocabulary
    ids.clear();
    return;
  }
  ids.resize(logprobs.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&](std::int64_t a, std::int64_t b) {
                      const double la = logprobs[static_cast<std::size_t>(a)];
                      const double lb = logprobs[static_cast<std::size_t>(b)];
                      return la != lb ? la > lb : a < b;
                    });
  ids.resize(k);
}

std::int64_t rank_of(std::span<const double> logprobs, std::int64_t token) {
  const double own = logprobs[static_cast<std::size_t>(token)];
  return 1 +
         std::count_if(logprobs.begin(), logprobs.end(), [&](double value) { return value > own; });
}

}  // namespace vllmd::reference
