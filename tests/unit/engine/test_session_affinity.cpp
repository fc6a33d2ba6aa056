// Session affinity (common/engine/session_affinity.*): where a session's requests go, when it
// moves and why, and the bound on how many sessions are remembered.

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "common/engine/session_affinity.hpp"

using vllmd::engine::SessionAffinity;
using Candidate = SessionAffinity::Candidate;

TEST_CASE("a session stays on its engine within the imbalance and moves past it") {
  SessionAffinity sessions(/*imbalance=*/4);
  std::string moved;
  std::vector<Candidate> engines{{true, 1}, {true, 0}};
  CHECK(sessions.choose("a", engines, 1, moved) == 1);  // new: the least loaded
  CHECK(moved.empty());
  engines = {{true, 0}, {true, 4}};  // 4 above the least loaded: stays
  CHECK(sessions.choose("a", engines, 0, moved) == 1);
  CHECK(moved.empty());
  engines = {{true, 0}, {true, 5}};  // 5 above: moves, and says why
  CHECK(sessions.choose("a", engines, 0, moved) == 0);
  CHECK(moved == "engine rank 1 is loaded 5 above rank 0 (engine.session_imbalance 4)");
  // It stays where it moved to.
  engines = {{true, 3}, {true, 0}};
  CHECK(sessions.choose("a", engines, 1, moved) == 0);
  CHECK(moved.empty());
}

TEST_CASE("new sessions spread over equally loaded engines, each by its own hash") {
  SessionAffinity sessions(/*imbalance=*/4);
  std::string moved;
  const std::vector<Candidate> idle{{true, 0}, {false, 0}, {true, 0}, {true, 3}};
  std::set<int> used;
  for (int i = 0; i < 32; ++i) {
    const std::string session = "s" + std::to_string(i);
    const int rank = sessions.choose(session, idle, 0, moved);
    CHECK((rank == 0 || rank == 2));  // ready and least loaded only
    used.insert(rank);
    CHECK(sessions.choose(session, idle, 0, moved) == rank);  // and then it stays
  }
  CHECK(used == std::set<int>{0, 2});
}

TEST_CASE("an engine that is not ready loses its sessions; no session means the least loaded") {
  SessionAffinity sessions(100);
  std::string moved;
  std::vector<Candidate> engines{{true, 9}, {true, 0}};
  CHECK(sessions.choose("b", engines, 1, moved) == 1);
  engines = {{true, 9}, {false, 0}};
  CHECK(sessions.choose("b", engines, 0, moved) == 0);
  CHECK(moved == "engine rank 1 is not ready");
  CHECK(sessions.choose("", engines, 0, moved) == 0);
  CHECK(sessions.size() == 1);  // the empty session is none
}

TEST_CASE("past its capacity the table forgets the least recently used half") {
  SessionAffinity sessions(0, /*capacity=*/8);
  std::string moved;
  const std::vector<Candidate> even{{true, 0}, {true, 1}};
  const std::vector<Candidate> odd{{true, 1}, {true, 0}};
  for (int i = 0; i < 8; ++i) {
    CHECK(sessions.choose("s" + std::to_string(i), i % 2 == 0 ? even : odd, i % 2, moved) == i % 2);
  }
  CHECK(sessions.choose("s0", even, 0, moved) == 0);  // s0 is now the most recently used
  CHECK(sessions.choose("s8", even, 0, moved) == 0);  // the 9th: half are forgotten
  CHECK(sessions.size() <= 5);
  CHECK(sessions.size() >= 4);
  // s0 was kept: it stays on rank 0 although rank 1 is as loaded (imbalance 0 allows equal).
  const std::vector<Candidate> level{{true, 0}, {true, 0}};
  CHECK(sessions.choose("s0", level, 1, moved) == 0);
  // s1, among the oldest, was forgotten: placed afresh on the least loaded, with no move.
  CHECK(sessions.choose("s1", level, 0, moved) == 0);
  CHECK(moved.empty());
}
