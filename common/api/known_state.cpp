#include "common/api/known_state.hpp"

#include <algorithm>

namespace vllmd::api {

void KnownState::sync(const std::vector<engine::EngineStatus>& engines) {
  std::lock_guard lock(mutex_);
  engines_.resize(engines.size());
  for (std::size_t i = 0; i < engines.size(); ++i) {
    if (engines_[i].admissions != engines[i].admissions) {
      engines_[i] = Known{engines[i].admissions, "default", false, true, true};
    }
  }
}

void KnownState::set_version(int rank, const std::string& version) {
  std::lock_guard lock(mutex_);
  if (rank >= 0 && static_cast<std::size_t>(rank) < engines_.size()) {
    engines_[rank].version = version;
    engines_[rank].version_known = true;
  }
}

void KnownState::set_version_all(const std::string& version) {
  std::lock_guard lock(mutex_);
  for (Known& known : engines_) {
    known.version = version;
    known.version_known = true;
  }
}

void KnownState::set_paused(int rank, bool paused) {
  std::lock_guard lock(mutex_);
  if (rank >= 0 && static_cast<std::size_t>(rank) < engines_.size()) {
    engines_[rank].paused = paused;
    engines_[rank].paused_known = true;
  }
}

void KnownState::set_paused_all(bool paused) {
  std::lock_guard lock(mutex_);
  for (Known& known : engines_) {
    known.paused = paused;
    known.paused_known = true;
  }
}

void KnownState::forget_version() {
  std::lock_guard lock(mutex_);
  for (Known& known : engines_) known.version_known = false;
}

void KnownState::forget_paused() {
  std::lock_guard lock(mutex_);
  for (Known& known : engines_) known.paused_known = false;
}

bool KnownState::version_certain() const {
  std::lock_guard lock(mutex_);
  return std::all_of(engines_.begin(), engines_.end(),
                     [](const Known& known) { return known.version_known; });
}

bool KnownState::paused_certain() const {
  std::lock_guard lock(mutex_);
  return std::all_of(engines_.begin(), engines_.end(),
                     [](const Known& known) { return known.paused_known; });
}

tl::expected<std::string, std::string> KnownState::version() const {
  std::lock_guard lock(mutex_);
  if (engines_.empty()) return std::string("default");
  const bool agree = std::all_of(engines_.begin(), engines_.end(), [this](const Known& known) {
    return known.version == engines_.front().version;
  });
  if (agree) return engines_.front().version;
  std::string seen;  // built only for the error: reads call this on every request
  for (std::size_t rank = 0; rank < engines_.size(); ++rank) {
    if (!seen.empty()) seen += ", ";
    seen += "rank " + std::to_string(rank) + " '" + engines_[rank].version + "'";
  }
  return tl::unexpected("engines disagree on the weight version: " + seen);
}

bool KnownState::paused() const {
  std::lock_guard lock(mutex_);
  for (const Known& known : engines_) {
    if (known.paused) return true;
  }
  return false;
}

}  // namespace vllmd::api
