#pragma once
// Session affinity (X-Session-ID): the requests of one session go to one data-parallel engine,
// so that a multi-turn rollout finds its prefix in that engine's cache. A new session goes to
// the least loaded engine (its hash picks among equally loaded ones). A session stays while
// its engine is ready and not far more loaded than the least loaded one (more than
// `imbalance` above its load score); then it moves to the least loaded and says why. The
// table is bounded: past `capacity` sessions the least recently used half is forgotten (a
// forgotten session is placed afresh, as a new one). IO thread only, like the rest of the
// engine client's state.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

namespace vllmd::engine {

class SessionAffinity {
 public:
  struct Candidate {
    bool ready = false;
    std::int64_t score = 0;  // load_score: lower is less loaded
  };

  explicit SessionAffinity(std::int64_t imbalance, std::size_t capacity = kDefaultCapacity)
      : imbalance_(imbalance), capacity_(capacity) {}

  // The rank for a request of `session`, `engines` indexed by rank and `least_loaded` the rank
  // a request without a session would go to (ready). `moved` says why when the session left
  // its engine (empty otherwise).
  int choose(std::string_view session, std::span<const Candidate> engines, int least_loaded,
             std::string& moved);

  std::size_t size() const { return sessions_.size(); }

  static constexpr std::size_t kDefaultCapacity = std::size_t{1} << 16;

 private:
  struct Placement {
    int rank = 0;
    std::uint64_t used = 0;  // the choice that last used it: least recently used goes first
  };
  // A new session's rank.
  int place(std::string_view session, std::span<const Candidate> engines, int least_loaded);
  void forget_least_recent();

  std::int64_t imbalance_;
  std::size_t capacity_;
  std::uint64_t choices_ = 0;
  struct Hash {
    using is_transparent = void;  // looked up by the header's string_view
    std::size_t operator()(std::string_view text) const {
      return std::hash<std::string_view>{}(text);
    }
  };
  std::unordered_map<std::string, Placement, Hash, std::equal_to<>> sessions_;
};

}  // namespace vllmd::engine
