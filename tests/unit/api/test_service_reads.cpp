// /weight_info and /is_paused through WeightSyncService (docs/http-api.md §5.3): answered from
// known state while it is certain or a call is in flight, asked of the engines after a call
// that may have changed it failed, and never pinned to an answer older than what is known
// (the sequence numbers of common/api/known_state.*).

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/unit/api/service_fixture.hpp"

using namespace vllmd::test;
using vllmd::api::route_for;
using vllmd::engine::EngineState;

namespace {

Request new_version(const std::string& version) { return {json_member("new_version", version)}; }

// set_weight_version fails on `rank`; everything else succeeds.
FakeEngines::Responder set_fails_on(int rank) {
  return [rank, succeed = succeeding()](const RecordedCall& call, int to) -> std::optional<Reply> {
    if (call.method == "set_weight_version" && to == rank) return failed("boom");
    return succeed(call, to);
  };
}

bool answers_at_once(ServiceFixture& f, Operation operation) {
  return f.service.answers_at_once(route_for(operation));
}

}  // namespace

TEST_CASE("reads answer from known state while it is certain, without an engine call") {
  ServiceFixture f(2);
  CHECK(answers_at_once(f, Operation::kWeightInfo));
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"default"})");
  CHECK(f.run(Operation::kIsPaused).body == R"({"is_paused":false})");
  const Response set = f.run(Operation::kUpdateWeightVersion, new_version("step-3"));
  CHECK(set.status == 200);
  CHECK(set.body == R"({"success":true,"new_version":"step-3"})");
  REQUIRE(f.run(Operation::kPause, {"", std::nullopt, "mode=wait&clear_cache=false"}).status ==
          200);
  CHECK(f.engines.call(1).args_json == R"(["wait",false])");
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"step-3"})");
  CHECK(f.run(Operation::kIsPaused).body == R"({"is_paused":true})");
  CHECK(f.engines.names() == Names{"set_weight_version", "pause_scheduler"});
}

TEST_CASE("after a set_weight_version that failed, reads ask the engines until they know") {
  ServiceFixture f(2);
  f.engines.set_responder(set_fails_on(1));
  const Response set = f.run(Operation::kUpdateWeightVersion, new_version("step-1"));
  CHECK(set.status == 500);
  CHECK(error_message(set) == "failed to call set_weight_version: engine rank 1: boom");
  CHECK_FALSE(answers_at_once(f, Operation::kWeightInfo));
  CHECK(answers_at_once(f, Operation::kIsPaused));  // the pause state is not in doubt
  SUBCASE("the engines disagree: reported, and asked again next time") {
    f.engines.set_responder([](const RecordedCall&, int rank) -> std::optional<Reply> {
      return string_reply(rank == 0 ? "step-1" : "default");
    });
    const Response info = f.run(Operation::kWeightInfo);
    CHECK(info.status == 500);
    CHECK(error_message(info) ==
          "engines disagree on the weight version: rank 0 'step-1', rank 1 "
          "'default'");
    CHECK(f.engines.names(1) == Names{"get_weight_version"});
    CHECK_FALSE(answers_at_once(f, Operation::kWeightInfo));
  }
  SUBCASE("they agree: known again") {
    f.engines.set_responder(succeeding("step-1"));
    CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"step-1"})");
    CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"step-1"})");
    CHECK(f.engines.names(1) == Names{"get_weight_version"});  // asked once
    CHECK(f.engines.call(1).ranks == std::vector<int>{0, 1});
  }
  SUBCASE("an engine answers something other than a string") {
    f.engines.set_responder([](const RecordedCall&, int rank) -> std::optional<Reply> {
      return rank == 1 ? bool_reply(true) : string_reply("step-1");
    });
    const Response info = f.run(Operation::kWeightInfo);
    CHECK(info.status == 500);
    CHECK(error_message(info) ==
          "failed to call get_weight_version: engine rank 1 returned a non-string version");
  }
}

TEST_CASE("an older read answered after a newer set_weight_version does not pin its version") {
  ServiceFixture f(1);
  f.engines.set_responder(set_fails_on(0));
  REQUIRE(f.run(Operation::kUpdateWeightVersion, new_version("v1")).status == 500);
  f.engines.set_responder(holding("get_weight_version"));
  const Answer read = f.send(Operation::kWeightInfo);  // sent while the version is in doubt
  const std::size_t id = f.engines.call_count() - 1;
  REQUIRE(f.engines.call(id).method == "get_weight_version");
  // Reads are not serialized: a newer set goes out (and succeeds) meanwhile.
  REQUIRE(f.run(Operation::kUpdateWeightVersion, new_version("v2")).status == 200);
  f.engines.answer(id, 0, string_reply("v1"));  // what the engine held when the read came
  CHECK(read->body == R"({"weight_version":"v1"})");
  CHECK(answers_at_once(f, Operation::kWeightInfo));
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"v2"})");
  CHECK(f.engines.call_count() == id + 2);  // known: not asked again
}

TEST_CASE("while an engine call is in flight, reads answer from known state at once") {
  ServiceFixture f(1);
  f.engines.set_responder(set_fails_on(0));
  REQUIRE(f.run(Operation::kUpdateWeightVersion, new_version("v1")).status == 500);
  REQUIRE_FALSE(answers_at_once(f, Operation::kWeightInfo));
  f.engines.set_responder(holding("update_weights"));
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  const Answer update = f.send(Operation::kUpdateWeights, {R"({"update_info":{}})"});
  // The engine would answer a query only after the update: none is sent.
  CHECK(answers_at_once(f, Operation::kWeightInfo));
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"default"})");
  CHECK(f.engines.names(1) == Names{"start_weight_update", "update_weights"});
  f.engines.answer_all(f.engines.call_count() - 1, nil());
  CHECK(update->status == 200);
  CHECK_FALSE(answers_at_once(f, Operation::kWeightInfo));  // in doubt again
}

TEST_CASE("after a failed pause, is_paused asks the engines once") {
  ServiceFixture f(1);
  f.engines.set_responder([](const RecordedCall& call, int) -> std::optional<Reply> {
    if (call.method == "pause_scheduler") return failed("boom");
    return call.method == "is_scheduler_paused" ? bool_reply(false) : nil();
  });
  const Response pause = f.run(Operation::kPause);
  CHECK(pause.status == 500);
  CHECK(error_message(pause) ==
        "failed to call pause_scheduler: boom; generation may still be "
        "running where the call did not succeed");
  CHECK(f.engines.call(0).args_json == R"(["abort",true])");
  CHECK(f.run(Operation::kIsPaused).body == R"({"is_paused":false})");
  CHECK(f.run(Operation::kIsPaused).body == R"({"is_paused":false})");
  CHECK(f.engines.names() == Names{"pause_scheduler", "is_scheduler_paused"});
}

TEST_CASE("a restarted engine is known to hold 'default' again") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kUpdateWeightVersion, new_version("step-7")).status == 200);
  f.engines.restart(0);
  const Response info = f.run(Operation::kWeightInfo);
  CHECK(info.status == 500);
  CHECK(error_message(info) ==
        "engines disagree on the weight version: rank 0 'default', rank 1 'step-7'");
  CHECK(f.engines.names() == Names{"set_weight_version"});  // known, not asked
}

TEST_CASE("reads answer 503 naming every engine that is not ready, and ask none") {
  ServiceFixture f(3);
  f.engines.set_state(0, EngineState::kHandshaking);
  f.engines.set_state(2, EngineState::kDead, "a lifecycle call timed out");
  for (const Operation read : {Operation::kWeightInfo, Operation::kIsPaused, Operation::kHealth}) {
    const Response response = f.run(read);
    CHECK(response.status == 503);
    CHECK(error_member(response, "code") == "engine_unavailable");
    CHECK(error_message(response) ==
          "engine rank 0 is loading; engine rank 2 is dead (a lifecycle call timed out)");
  }
  CHECK(f.engines.call_count() == 0);
}

TEST_CASE("a resume that could not reach an engine is delivered once it is ready again") {
  ServiceFixture f(2);
  f.engines.set_state(1, EngineState::kDead, "a lifecycle call timed out");
  const Response resume = f.run(Operation::kResume);
  CHECK(resume.status == 503);
  CHECK(error_message(resume) ==
        "failed to call resume_scheduler: engine rank 1 is dead (a lifecycle call timed out); "
        "generation may still be "
        "paused on engine rank 1: vllmd resumes it as soon as it answers again");
  CHECK(f.engines.call(0).refused == std::vector<int>{1});
  f.engines.set_state(1, EngineState::kReady);
  REQUIRE(f.engines.call_count() == 2);
  CHECK(f.engines.call(1).method == "resume_scheduler");
  CHECK(f.engines.call(1).ranks == std::vector<int>{1});
  f.engines.set_state(1, EngineState::kReady);  // delivered: not again
  CHECK(f.engines.call_count() == 2);
}
