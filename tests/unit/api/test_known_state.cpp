// KnownState (common/api/known_state.*): per-engine version and pause state, written under
// the sequence numbers of the calls they came from, and reseeded when an engine is admitted
// again.

#include <doctest/doctest.h>

#include "common/api/known_state.hpp"

using vllmd::api::KnownState;
using vllmd::engine::EngineStatus;

namespace {
std::vector<EngineStatus> engines(std::initializer_list<std::uint64_t> admissions) {
  std::vector<EngineStatus> statuses;
  int rank = 0;
  for (const std::uint64_t count : admissions) {
    EngineStatus status;
    status.rank = rank++;
    status.admissions = count;
    statuses.push_back(status);
  }
  return statuses;
}
}  // namespace

TEST_CASE("a newly admitted engine is at 'default' and not paused, for sure") {
  KnownState known;
  known.sync(engines({1, 1}));
  CHECK(known.version().value() == "default");
  CHECK_FALSE(known.paused());
  CHECK(known.version_certain());
  CHECK(known.paused_certain());
}

TEST_CASE("versions per engine; a disagreement is reported with every rank") {
  KnownState known;
  known.sync(engines({1, 1}));
  known.set_version_all(known.next_sequence(), "step-3");
  CHECK(known.version().value() == "step-3");
  known.set_version(1, known.next_sequence(), "step-4");
  REQUIRE_FALSE(known.version());
  CHECK(known.version().error() ==
        "engines disagree on the weight version: rank 0 'step-3', rank 1 'step-4'");
}

TEST_CASE("a call that may change a value makes it uncertain until something as new is known") {
  KnownState known;
  known.sync(engines({1}));
  const auto set = known.next_sequence();
  known.changing_version(set);
  CHECK_FALSE(known.version_certain());
  known.set_version_all(set, "step-1");  // the set succeeded
  CHECK(known.version_certain());
  CHECK(known.version().value() == "step-1");

  const auto failed = known.next_sequence();
  known.changing_version(failed);  // and fails: nothing written
  CHECK_FALSE(known.version_certain());
  const auto read = known.next_sequence();
  known.set_version(0, read, "step-1");  // a read sent after it tells the truth
  CHECK(known.version_certain());
}

TEST_CASE("an answer to an older call never overwrites a newer one") {
  KnownState known;
  known.sync(engines({1}));
  const auto failed_set = known.next_sequence();
  known.changing_version(failed_set);
  const auto read = known.next_sequence();  // a read is sent while the state is uncertain
  const auto newer_set = known.next_sequence();
  known.changing_version(newer_set);
  known.set_version_all(newer_set, "step-5");  // the newer set succeeds first
  known.set_version(0, read, "step-4");        // then the read's answer arrives
  CHECK(known.version().value() == "step-5");
  CHECK(known.version_certain());
}

TEST_CASE("a restarted engine forgets, and late answers about its predecessor are dropped") {
  KnownState known;
  known.sync(engines({1, 1}));
  const auto before = known.next_sequence();
  known.set_version_all(known.next_sequence(), "step-9");
  known.set_paused_all(known.next_sequence(), true);
  known.sync(engines({1, 2}));  // rank 1 restarted
  CHECK(known.version().error().find("rank 1 'default'") != std::string::npos);
  known.set_version(1, before, "step-8");  // sent to the old process
  CHECK(known.version().error().find("rank 1 'default'") != std::string::npos);
  CHECK(known.paused());  // rank 0 still paused
  known.set_paused(0, known.next_sequence(), false);
  CHECK_FALSE(known.paused());
}
