#include "common/api/sleep_state.hpp"

namespace vllmd::api {

unsigned tag_bits(const std::vector<std::string>& tags) {
  unsigned bits = kNoTag;
  for (const std::string& tag : tags) {
    if (tag == "weights") bits |= kWeightsTag;
    if (tag == "kv_cache") bits |= kKvCacheTag;
  }
  return bits;
}

const SleepStates::Asleep* SleepStates::find(int rank, std::uint64_t incarnation) const {
  const auto found = ranks_.find(rank);
  if (found == ranks_.end() || found->second.incarnation != incarnation) return nullptr;
  if (found->second.tags == kNoTag) return nullptr;
  return &found->second;
}

void SleepStates::slept(int rank, std::uint64_t incarnation, int level) {
  std::lock_guard lock(mutex_);
  if (level < 1 || find(rank, incarnation) != nullptr) return;
  ranks_[rank] = {incarnation, kAllTags, level};
}

void SleepStates::released_kv_cache(int rank, std::uint64_t incarnation) {
  std::lock_guard lock(mutex_);
  if (const Asleep* asleep = find(rank, incarnation)) {
    ranks_[rank].tags = asleep->tags | kKvCacheTag;
    return;
  }
  ranks_[rank] = {incarnation, kKvCacheTag, 0};
}

void SleepStates::woke(int rank, std::uint64_t incarnation, const std::optional<unsigned>& tags,
                       bool fully_awake) {
  std::lock_guard lock(mutex_);
  const Asleep* asleep = find(rank, incarnation);
  if (asleep == nullptr) return;
  if (fully_awake || !tags) {
    ranks_.erase(rank);
    return;
  }
  if ((*tags & ~asleep->tags) != 0) return;  // a tag that is not asleep: nothing woke
  ranks_[rank].tags = asleep->tags & ~*tags;
}

std::vector<int> SleepStates::weights_asleep(const std::vector<std::uint64_t>& incarnations) const {
  std::lock_guard lock(mutex_);
  std::vector<int> ranks;
  for (std::size_t rank = 0; rank < incarnations.size(); ++rank) {
    const Asleep* asleep = find(static_cast<int>(rank), incarnations[rank]);
    if (asleep != nullptr && (asleep->tags & kWeightsTag) != 0)
      ranks.push_back(static_cast<int>(rank));
  }
  return ranks;
}

int SleepStates::level(int rank, std::uint64_t incarnation) const {
  std::lock_guard lock(mutex_);
  const Asleep* asleep = find(rank, incarnation);
  return asleep == nullptr ? 0 : asleep->level;
}

unsigned SleepStates::tags(int rank, std::uint64_t incarnation) const {
  std::lock_guard lock(mutex_);
  const Asleep* asleep = find(rank, incarnation);
  return asleep == nullptr ? kNoTag : asleep->tags;
}

}  // namespace vllmd::api
