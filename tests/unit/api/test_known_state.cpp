// KnownState (common/api/known_state.*): per-engine version and pause state, reseeded when an
// engine is admitted again.

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

TEST_CASE("a newly admitted engine is at 'default' and not paused") {
  KnownState known;
  known.sync(engines({1, 1}));
  CHECK(known.version().value() == "default");
  CHECK_FALSE(known.paused());
}

TEST_CASE("versions per engine; a disagreement is reported with every rank") {
  KnownState known;
  known.sync(engines({1, 1}));
  known.set_version_all("step-3");
  CHECK(known.version().value() == "step-3");
  known.set_version(1, "step-4");
  REQUIRE_FALSE(known.version());
  CHECK(known.version().error() ==
        "engines disagree on the weight version: rank 0 'step-3', rank 1 'step-4'");
}

TEST_CASE("a restarted engine forgets; the others keep what they hold") {
  KnownState known;
  known.sync(engines({1, 1}));
  known.set_version_all("step-9");
  known.set_paused_all(true);
  known.sync(engines({1, 2}));  // rank 1 restarted
  CHECK(known.version().error().find("rank 1 'default'") != std::string::npos);
  CHECK(known.paused());  // rank 0 still paused
  known.set_paused(0, false);
  CHECK_FALSE(known.paused());
}
