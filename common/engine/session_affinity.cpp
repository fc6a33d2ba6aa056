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
    const int rank = place(session, engines, least_loaded);
    sessions_.emplace(std::string(session), Placement{rank, now});
    if (sessions_.size() > capacity_) forget_least_recent();
    return rank;
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

int SessionAffinity::place(std::string_view session, std::span<const Candidate> engines,
                           int least_loaded) {
  // Among the ready engines as lightly loaded as the least, the session's hash picks: new
  // sessions that come one at a time to idle engines spread over all of them, rather than all
  // settling on the first, where their later turns would meet.
  const std::int64_t best = engines[static_cast<std::size_t>(least_loaded)].score;
  std::size_t ties = 0;
  for (const Candidate& engine : engines) ties += engine.ready && engine.score == best ? 1 : 0;
  std::size_t pick = Hash{}(session) % ties;
  for (std::size_t rank = 0; rank < engines.size(); ++rank) {
    if (!engines[rank].ready || engines[rank].score != best) continue;
    if (pick-- == 0) return static_cast<int>(rank);
  }
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
