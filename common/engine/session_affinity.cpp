#include "common/engine/session_affinity.hpp"

#include <algorithm>
#include <vector>

namespace vllmd::engine {

int SessionAffinity::choose(std::string_view session, std::span<const Candidate> engines,
                            int least_loaded, std::string& moved) {
  moved.clear();
  if (session.empty()) return least_loaded;
  const std::uint64_t now = ++choices_;
  auto found = sessions_.find(session);
  if (found == sessions_.end()) {
    sessions_.emplace(std::string(session), Placement{least_loaded, now});
    if (sessions_.size() > capacity_) forget_least_recent();
    return least_loaded;
  }
  Placement& placement = found->second;
  placement.used = now;
  const auto mine = static_cast<std::size_t>(placement.rank);
  const std::int64_t best = engines[static_cast<std::size_t>(least_loaded)].score;
  if (mine < engines.size() && engines[mine].ready && engines[mine].score - best <= imbalance_) {
    return placement.rank;
  }
  if (mine >= engines.size() || !engines[mine].ready) {
    moved = "engine rank " + std::to_string(placement.rank) + " is not ready";
  } else {
    moved = "engine rank " + std::to_string(placement.rank) + " is loaded " +
            std::to_string(engines[mine].score - best) + " above rank " +
            std::to_string(least_loaded) + " (engine.session_imbalance " +
            std::to_string(imbalance_) + ")";
  }
  placement.rank = least_loaded;
  return least_loaded;
}

void SessionAffinity::forget_least_recent() {
  std::vector<std::uint64_t> uses;
  uses.reserve(sessions_.size());
  for (const auto& [session, placement] : sessions_) uses.push_back(placement.used);
  const auto middle = uses.begin() + static_cast<std::ptrdiff_t>(uses.size() / 2);
  std::nth_element(uses.begin(), middle, uses.end());
  const std::uint64_t keep_from = *middle;
  std::erase_if(sessions_,
                [keep_from](const auto& entry) { return entry.second.used < keep_from; });
}

}  // namespace vllmd::engine
