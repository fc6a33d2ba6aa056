#include "common/api/known_state.hpp"

#include <algorithm>

namespace vllmd::api {

std::uint64_t KnownState::next_sequence() {
  std::lock_guard lock(mutex_);
  return ++sequence_;
}

void KnownState::sync(const std::vector<engine::EngineStatus>& engines) {
  std::lock_guard lock(mutex_);
  engines_.resize(engines.size());
  for (std::size_t i = 0; i < engines.size(); ++i) {
    Engine& known = engines_[i];
    if (known.incarnation == engines[i].admissions) continue;
    // A new process: what older calls find out about the previous one no longer applies.
    const std::uint64_t now = ++sequence_;
    known = Engine{engines[i].admissions, {"default", now, 0}, {false, now, 0}};
  }
}

void KnownState::changing_version(std::uint64_t sequence) {
  std::lock_guard lock(mutex_);
  for (Engine& known : engines_)
    known.version.changing = std::max(known.version.changing, sequence);
}

void KnownState::changing_paused(std::uint64_t sequence) {
  std::lock_guard lock(mutex_);
  for (Engine& known : engines_) known.paused.changing = std::max(known.paused.changing, sequence);
}

void KnownState::set_version(int rank, std::uint64_t sequence, const std::string& version) {
  std::lock_guard lock(mutex_);
  if (rank >= 0 && static_cast<std::size_t>(rank) < engines_.size()) {
    engines_[static_cast<std::size_t>(rank)].version.write(sequence, version);
  }
}

void KnownState::set_version_all(std::uint64_t sequence, const std::string& version) {
  std::lock_guard lock(mutex_);
  for (Engine& known : engines_) known.version.write(sequence, version);
}

void KnownState::set_paused(int rank, std::uint64_t sequence, bool paused) {
  std::lock_guard lock(mutex_);
  if (rank >= 0 && static_cast<std::size_t>(rank) < engines_.size()) {
    engines_[static_cast<std::size_t>(rank)].paused.write(sequence, paused);
  }
}

void KnownState::set_paused_all(std::uint64_t sequence, bool paused) {
  std::lock_guard lock(mutex_);
  for (Engine& known : engines_) known.paused.write(sequence, paused);
}

bool KnownState::version_certain() const {
  std::lock_guard lock(mutex_);
  return std::all_of(engines_.begin(), engines_.end(),
                     [](const Engine& known) { return known.version.certain(); });
}

bool KnownState::paused_certain() const {
  std::lock_guard lock(mutex_);
  return std::all_of(engines_.begin(), engines_.end(),
                     [](const Engine& known) { return known.paused.certain(); });
}

tl::expected<std::string, std::string> KnownState::version() const {
  std::lock_guard lock(mutex_);
  if (engines_.empty()) return std::string("default");
  const std::string& first = engines_.front().version.value;
  const bool agree = std::all_of(engines_.begin(), engines_.end(),
                                 [&](const Engine& known) { return known.version.value == first; });
  if (agree) return first;
  std::string seen;  // built only for the error: reads call this on every request
  for (std::size_t rank = 0; rank < engines_.size(); ++rank) {
    if (!seen.empty()) seen += ", ";
    seen += "rank " + std::to_string(rank) + " '" + engines_[rank].version.value + "'";
  }
  return tl::unexpected("engines disagree on the weight version: " + seen);
}

bool KnownState::paused() const {
  std::lock_guard lock(mutex_);
  return std::any_of(engines_.begin(), engines_.end(),
                     [](const Engine& known) { return known.paused.value; });
}

}  // namespace vllmd::api
