// The reference engine's sampler: greedy ties, the min_tokens ban, top-k/top-p/min-p, seeded
// reproducibility, and logprob ranks as vLLM counts them.

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "common/reference/llama.hpp"
#include "common/reference/sampler.hpp"

using namespace vllmd::reference;

TEST_SUITE("reference_sampler") {
  TEST_CASE("greedy is the argmax with the lowest id on ties, never a banned id") {
    const std::vector<double> logits{0.5, 2.0, 2.0, -1.0};
    SamplingSettings greedy;
    greedy.temperature = 0;
    RandomStream random(1);
    std::vector<double> scratch;
    CHECK(sample_token(logits, greedy, {}, random, scratch) == 1);
    const std::vector<std::int64_t> banned{1};
    CHECK(sample_token(logits, greedy, banned, random, scratch) == 2);
  }

  TEST_CASE("top-k 1, a tiny top-p and min-p 1 all leave only the most likely token") {
    const std::vector<double> logits{0.1, 0.3, 3.0, 0.2, 2.9};
    std::vector<double> scratch;
    for (int variant = 0; variant < 3; ++variant) {
      SamplingSettings settings;
      if (variant == 0) settings.top_k = 1;
      if (variant == 1) settings.top_p = 0.01;
      if (variant == 2) settings.min_p = 1.0;
      RandomStream random(7);
      for (int draw = 0; draw < 200; ++draw) {
        CAPTURE(variant);
        REQUIRE(sample_token(logits, settings, {}, random, scratch) == 2);
      }
    }
  }

  TEST_CASE("top-k 2 draws only the two most likely, in proportion to their probabilities") {
    const std::vector<double> logits{0.0, std::log(3.0), -5.0, std::log(1.0)};
    SamplingSettings settings;
    settings.top_k = 2;
    RandomStream random(3);
    std::vector<double> scratch;
    int ones = 0;
    constexpr int kDraws = 20000;
    for (int draw = 0; draw < kDraws; ++draw) {
      const std::int64_t token = sample_token(logits, settings, {}, random, scratch);
      REQUIRE((token == 1 || token == 0));  // id 3 ties id 0 and loses it: the lower id stays
      ones += token == 1 ? 1 : 0;
    }
    CHECK(std::abs(ones / static_cast<double>(kDraws) - 0.75) < 0.02);
  }

  TEST_CASE("the same seed draws the same tokens; another seed others") {
    std::vector<double> logits(64);
    for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<double>(i));
    SamplingSettings settings;
    settings.temperature = 1.3;
    std::vector<double> scratch;
    const auto draws = [&](std::uint64_t seed) {
      RandomStream random(seed);
      std::vector<std::int64_t> tokens;
      tokens.reserve(32);
      for (int i = 0; i < 32; ++i)
        tokens.push_back(sample_token(logits, settings, {}, random, scratch));
      return tokens;
    };
    CHECK(draws(11) == draws(11));
    CHECK(draws(11) != draws(12));
  }

  TEST_CASE("logprobs are the log-softmax of the raw logits; ranks count strictly higher ones") {
    const std::vector<double> logits{1.0, 3.0, 3.0, 0.0};
    std::vector<double> logprobs(4);
    log_softmax(logits, logprobs);
    double total = 0;
    for (double value : logprobs) total += std::exp(value);
    CHECK(total == doctest::Approx(1.0).epsilon(1e-12));
    CHECK(logprobs[1] - logprobs[0] == doctest::Approx(2.0).epsilon(1e-12));
    CHECK(rank_of(logprobs, 1) == 1);
    CHECK(rank_of(logprobs, 2) == 1);
    CHECK(rank_of(logprobs, 0) == 3);
    std::vector<std::int64_t> ids;
    top_ids(logprobs, 3, ids);
    CHECK(ids == std::vector<std::int64_t>{1, 2, 0});
  }
}
