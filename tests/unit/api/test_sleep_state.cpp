// SleepStates (common/api/sleep_state.cpp): what vllmd believes sleeps follows vLLM's
// executor rules, and a restarted engine is awake.

#include <doctest/doctest.h>

#include <vector>

#include "common/api/sleep_state.hpp"

using vllmd::api::kKvCacheTag;
using vllmd::api::kNoTag;
using vllmd::api::kWeightsTag;
using vllmd::api::SleepStates;
using Ranks = std::vector<int>;

TEST_CASE("a sleep at level 1 or 2 puts both tags to sleep; level 0 none") {
  SleepStates states;
  states.slept(0, 1, 0);
  CHECK(states.tags(0, 1) == kNoTag);
  states.slept(0, 1, 2);
  states.slept(1, 1, 1);
  CHECK(states.weights_asleep({1, 1}) == Ranks{0, 1});
  CHECK(states.level(0, 1) == 2);
  // Already asleep: vLLM's executor changes nothing (the level stays).
  states.slept(0, 1, 1);
  CHECK(states.level(0, 1) == 2);
}

TEST_CASE("wakes: named tags, all, and a tag that is not asleep") {
  SleepStates states;
  states.slept(0, 1, 1);
  states.woke(0, 1, kWeightsTag, false);
  CHECK(states.tags(0, 1) == kKvCacheTag);
  CHECK(states.weights_asleep({1}).empty());
  // weights is not asleep any more: vLLM wakes nothing.
  states.woke(0, 1, kWeightsTag | kKvCacheTag, false);
  CHECK(states.tags(0, 1) == kKvCacheTag);
  // The engine's own "fully awake" settles it.
  states.woke(0, 1, kWeightsTag, true);
  CHECK(states.tags(0, 1) == kNoTag);
  states.slept(0, 1, 1);
  states.woke(0, 1, std::nullopt, false);
  CHECK(states.tags(0, 1) == kNoTag);
}

TEST_CASE("release_kv_cache_memory sleeps the KV cache only") {
  SleepStates states;
  states.released_kv_cache(0, 1);
  CHECK(states.tags(0, 1) == kKvCacheTag);
  CHECK(states.weights_asleep({1}).empty());
}

TEST_CASE("another incarnation is awake") {
  SleepStates states;
  states.slept(0, 1, 1);
  CHECK(states.weights_asleep({2}).empty());
  CHECK(states.tags(0, 2) == kNoTag);
  // A wake answered by the new process does not touch what the old one held.
  states.woke(0, 2, std::nullopt, true);
  CHECK(states.tags(0, 1) == (kWeightsTag | kKvCacheTag));
}
