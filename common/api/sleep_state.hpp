#pragma once
// What vllmd knows of the engines' sleep mode: by rank, which of vLLM's CuMem tags ("weights",
// "kv_cache") are asleep, for the engine incarnation that slept (a restarted engine is
// awake). Where a call's outcome is unknown (sent, no answer) the tags count as asleep: the
// weight-update guard must never let an update reach sleeping weights (vllm#57853), and a
// wake_up, harmless on an awake engine, clears them.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace vllmd::api {

enum SleepTag : unsigned { kNoTag = 0, kWeightsTag = 1, kKvCacheTag = 2, kAllTags = 3 };

class SleepStates {
 public:
  // A sleep at `level` (1-2) was (or may have been) applied: as vLLM's executor, an engine
  // already asleep changes nothing.
  void slept(int rank, std::uint64_t incarnation, int level);
  // release_kv_cache_memory succeeded.
  void released_kv_cache(int rank, std::uint64_t incarnation);
  // A wake_up answered: `fully_awake` as the engine returned it; `tags` as named (nullopt:
  // all). vLLM wakes nothing when a named tag is not asleep.
  void woke(int rank, std::uint64_t incarnation, const std::optional<unsigned>& tags,
            bool fully_awake);

  // The ranks, among these incarnations (by rank), whose weights are or may be asleep.
  std::vector<int> weights_asleep(const std::vector<std::uint64_t>& incarnations) const;
  // The level of the sleep that put rank's weights to sleep (0: awake), for messages/metrics.
  int level(int rank, std::uint64_t incarnation) const;
  unsigned tags(int rank, std::uint64_t incarnation) const;

 private:
  struct Asleep {
    std::uint64_t incarnation = 0;
    unsigned tags = kNoTag;
    int level = 0;
  };
  const Asleep* find(int rank, std::uint64_t incarnation) const;  // under mutex_

  mutable std::mutex mutex_;
  std::map<int, Asleep> ranks_;
};

// "weights" -> kWeightsTag, "kv_cache" -> kKvCacheTag, "scheduling" -> kNoTag.
unsigned tag_bits(const std::vector<std::string>& tags);

}  // namespace vllmd::api
