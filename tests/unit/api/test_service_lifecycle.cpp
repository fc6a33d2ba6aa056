// WeightSyncService's lifecycle over fake engines (common/api/lifecycle.cpp): the version is
// committed last, only after every rank finished, and a call that failed on some ranks leaves
// no rank in a session (docs/http-api.md §5.1, §7.4).

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tests/unit/api/service_fixture.hpp"

using namespace vllmd::test;

namespace {

const std::string kSessionClosed = R"({"open":false,"version_current":true})";
const std::string kRpcFailed = "Call to collective_rpc method failed";

Request version_body(const std::string& version) {
  return {json_member("weight_version", version)};
}
Request new_version(const std::string& version) { return {json_member("new_version", version)}; }
Request update_body() { return {R"({"update_info":{"names":["w"]}})"}; }

// Fails the first call named `name` on `rank` with `reply`; everything else succeeds.
FakeEngines::Responder first_fails(const std::string& name, int rank, const Reply& reply) {
  auto failures = std::make_shared<int>(0);
  return [=, succeed = succeeding()](const RecordedCall& call, int to) -> std::optional<Reply> {
    if (call.name() == name && to == rank && (*failures)++ == 0) return reply;
    return succeed(call, to);
  };
}

std::size_t count_of(const FakeEngines& engines, const std::string& name) {
  const Names names = engines.names();
  return static_cast<std::size_t>(std::count(names.begin(), names.end(), name));
}

}  // namespace

TEST_CASE("finish commits the version only after every rank's finish succeeded") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  f.engines.set_responder(holding("finish_weight_update"));
  const Answer finish = f.send(Operation::kFinishWeightUpdate, version_body("step-1"));
  const std::size_t id = f.engines.call_count() - 1;
  REQUIRE(f.engines.call(id).name() == "finish_weight_update");
  CHECK(f.engines.call(id).args_json == kFinishArgs);  // the version is not the finish's
  f.engines.answer(id, 1, nil());
  CHECK_FALSE(finish.answered());
  CHECK(f.engines.names() == Names{"start_weight_update", "finish_weight_update"});
  f.engines.answer(id, 0, nil());
  REQUIRE(finish.answered());
  CHECK(finish->status == 200);
  CHECK(finish->body == R"({"message":"Weight update finished"})");
  REQUIRE(f.engines.call_count() == id + 2);
  const RecordedCall set = f.engines.call(id + 1);
  CHECK(set.method == "set_weight_version");
  CHECK(set.args_json == R"(["step-1"])");
  CHECK(set.args == "\x91\xa6step-1");  // ["step-1"]: a fixarray of one fixstr
  CHECK(set.ranks == Ranks{0, 1});
  CHECK(set.options.incarnations == Incarnations{1, 1});  // those that held the session
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"step-1"})");
  CHECK(f.engines.call_count() == id + 2);  // known, not asked
}

TEST_CASE("a finish failed on one rank commits nothing and leaves no rank in a session") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kUpdateWeightVersion, new_version("step-0")).status == 200);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  f.engines.set_responder(first_fails("finish_weight_update", 1, failed(kRpcFailed)));
  const Response finish = f.run(Operation::kFinishWeightUpdate, version_body("step-1"));
  CHECK(finish.status == 500);
  CHECK(error_member(finish, "code") == "server_error");
  CHECK(error_message(finish) ==
        "failed to call finish_weight_update: engine rank 1: " + kRpcFailed +
            "; nothing was committed; engine rank 0 finished, and the session was closed on "
            "engine rank 1");
  CHECK(f.engines.names() == Names{"set_weight_version", "start_weight_update",
                                   "finish_weight_update", "finish_weight_update"});
  // vLLM keeps a session whose finish failed open: vllmd closes it, on that rank only.
  const RecordedCall close = f.engines.call(3);
  CHECK(close.ranks == Ranks{1});
  CHECK(close.args_json == kFinishArgs);
  CHECK(close.options.incarnations == Incarnations{1, 1});
  CHECK(count_of(f.engines, "set_weight_version") == 1);  // step-0's only
  CHECK(f.run(Operation::kSessionStatus).body == kSessionClosed);
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"step-0"})");
  CHECK(f.engines.call_count() == 4);
  CHECK(f.run(Operation::kStartWeightUpdate).status == 200);
  CHECK(f.engines.call(4).ranks == Ranks{0, 1});
}

TEST_CASE("a finish refused for want of a session is not closed again") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  const std::string refused = "finish_weight_update called without a matching start_weight_update";
  f.engines.set_responder(first_fails("finish_weight_update", 1, failed(refused)));
  const Response finish = f.run(Operation::kFinishWeightUpdate, version_body("v1"));
  CHECK(finish.status == 500);
  CHECK(error_message(finish) == "failed to call finish_weight_update: engine rank 1: " + refused +
                                     "; nothing was committed; engine rank 0 finished, and no "
                                     "session was left open");
  CHECK(f.engines.names() == Names{"start_weight_update", "finish_weight_update"});
}

TEST_CASE("a set_weight_version that failed after a good finish is named as such") {
  ServiceFixture f(1);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  SUBCASE("the engine refused it") {
    f.engines.set_responder(first_fails("set_weight_version", 0, failed("boom")));
    const Response finish = f.run(Operation::kFinishWeightUpdate, version_body("step-1"));
    CHECK(finish.status == 500);
    CHECK(error_message(finish) == "failed to call set_weight_version: boom");
  }
  SUBCASE("its answer was lost: it may have been applied") {
    const std::string late = "engine rank 0 did not answer set_weight_version within 30 s";
    f.engines.set_responder(first_fails("set_weight_version", 0, timed_out(late)));
    const Response finish = f.run(Operation::kFinishWeightUpdate, version_body("step-1"));
    CHECK(finish.status == 504);
    CHECK(error_member(finish, "code") == "engine_timeout");
    CHECK(error_message(finish) ==
          "failed to call set_weight_version: " + late +
              "; the version may have been applied on engine rank 0 before its answer was lost: "
              "GET /weight_info tells");
  }
  CHECK(f.engines.names() ==
        Names{"start_weight_update", "finish_weight_update", "set_weight_version"});
  CHECK(f.run(Operation::kSessionStatus).body == kSessionClosed);
  // Only the engines know now.
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"default"})");
  CHECK(f.engines.names(3) == Names{"get_weight_version"});
}

TEST_CASE("an update failed on one rank closes the session on every rank") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  f.engines.set_responder(first_fails("update_weights", 0, failed(kRpcFailed)));
  const Response update = f.run(Operation::kUpdateWeights, update_body());
  CHECK(update.status == 500);
  CHECK(error_message(update) == "failed to call update_weights: engine rank 0: " + kRpcFailed +
                                     "; nothing was committed, and the session was closed on "
                                     "engine ranks 0, 1");
  CHECK(f.engines.call(1).args_json ==
        R"(["update_weights",null,[],{"update_info":{"names":["w"]}}])");
  REQUIRE(f.engines.names() ==
          Names{"start_weight_update", "update_weights", "finish_weight_update"});
  CHECK(f.engines.call(2).ranks == Ranks{0, 1});
  CHECK(f.engines.call(2).args_json == kFinishArgs);
  // The weights changed on rank 1 and no version names them.
  CHECK(f.run(Operation::kSessionStatus).body == R"({"open":false,"version_current":false})");
  CHECK(f.run(Operation::kStartWeightUpdate).status == 200);
}

TEST_CASE("a start failed on one rank closes the session where it did start") {
  ServiceFixture f(2);
  f.engines.set_responder(first_fails("start_weight_update", 1, failed(kRpcFailed)));
  const Response start = f.run(Operation::kStartWeightUpdate);
  CHECK(start.status == 500);
  CHECK(error_message(start) == "failed to call start_weight_update: engine rank 1: " + kRpcFailed +
                                    "; no session was opened: the session was closed on engine "
                                    "rank 0");
  REQUIRE(f.engines.names() == Names{"start_weight_update", "finish_weight_update"});
  CHECK(f.engines.call(1).ranks == Ranks{0});
  CHECK(f.run(Operation::kSessionStatus).body == kSessionClosed);
}

TEST_CASE("a start refused during an open session closes nothing, even where its answer was lost") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);  // anonymous: anyone may go on
  // Rank 0's answer to the second start is lost. It cannot have opened anything there: rank 0
  // holds the open session, as rank 1 does, which refuses. Closing rank 0 "where it may have
  // started" would close that session there alone.
  f.engines.set_responder(
      [succeed = succeeding()](const RecordedCall& call, int rank) -> std::optional<Reply> {
        if (call.name() != "start_weight_update") return succeed(call, rank);
        if (rank == 0) return timed_out("engine rank 0 did not answer start_weight_update");
        return failed("start_weight_update called while a weight update is already active.");
      });
  CHECK(f.run(Operation::kStartWeightUpdate).status == 504);
  CHECK(f.engines.names(1) == Names{"start_weight_update"});
  // The session goes on, on both ranks.
  CHECK(f.run(Operation::kUpdateWeights, update_body()).status == 200);
  CHECK(f.run(Operation::kFinishWeightUpdate, version_body("v1")).status == 200);
}

TEST_CASE("a rank unreachable when its session was closed is closed once it answers again") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  f.engines.set_state(0, vllmd::engine::EngineState::kDisconnected);
  const Response update = f.run(Operation::kUpdateWeights, update_body());
  CHECK(update.status == 503);
  CHECK(error_message(update) ==
        "failed to call update_weights: engine rank 0 is disconnected; nothing was committed, "
        "and the session was closed on engine rank 1; engine rank 0 may still hold it (engine "
        "rank 0 is disconnected); vllmd closes it when the rank answers again");
  REQUIRE(f.engines.call_count() == 3);
  CHECK(f.engines.call(1).refused == Ranks{0});
  CHECK(f.engines.call(2).refused == Ranks{0});  // the close could not reach it either
  SUBCASE("the same process answers again: its session is closed, before any start") {
    f.engines.set_state(0, vllmd::engine::EngineState::kReady);
    REQUIRE(f.engines.call_count() == 4);
    CHECK(f.engines.call(3).name() == "finish_weight_update");
    CHECK(f.engines.call(3).ranks == Ranks{0});
    CHECK(f.engines.call(3).options.incarnations == Incarnations{1, 1});
    CHECK(f.run(Operation::kStartWeightUpdate).status == 200);
    CHECK(f.engines.names(4) == Names{"start_weight_update"});  // closed once only
  }
  SUBCASE("a start while it is still unreachable: 503, and no rank is sent the start") {
    // Found by the chaos test: sent on, the start reached rank 0 once it was back (between
    // the close's turn and the send) and was refused there alone, "already active".
    const Response start = f.run(Operation::kStartWeightUpdate);
    CHECK(start.status == 503);
    CHECK(error_member(start, "code") == "engine_unavailable");
    CHECK(error_message(start) ==
          "failed to call start_weight_update: engine rank 0 may still hold a weight-update "
          "session that vllmd could not close (unreachable); vllmd closes it when the rank "
          "answers again; no session was opened");
    CHECK(f.engines.call_count() == 3);
    f.engines.set_state(0, vllmd::engine::EngineState::kReady);
    CHECK(f.engines.names(3) == Names{"finish_weight_update"});
    CHECK(f.run(Operation::kStartWeightUpdate).status == 200);
  }
  SUBCASE("a new process holds no session: nothing to close") {
    f.engines.restart(0);
    CHECK(f.engines.call_count() == 3);
    CHECK(f.run(Operation::kStartWeightUpdate).status == 200);
    CHECK(f.engines.names(3) == Names{"start_weight_update"});
    CHECK(f.engines.call(3).options.incarnations == Incarnations{2, 1});
  }
}

TEST_CASE("lifecycle calls run one at a time, in arrival order") {
  ServiceFixture f(1);
  f.engines.set_responder(holding("start_weight_update"));
  const Answer start = f.send(Operation::kStartWeightUpdate);
  const Answer update = f.send(Operation::kUpdateWeights, update_body());
  const Answer finish = f.send(Operation::kFinishWeightUpdate, version_body("v"));
  CHECK(f.engines.names() == Names{"start_weight_update"});  // the others wait their turn
  // A bad request is refused at once, without waiting or reaching an engine.
  CHECK(f.run(Operation::kUpdateWeights, {R"({"update_info":5})"}).status == 400);
  f.engines.answer(0, 0, nil());
  CHECK(start->status == 200);
  CHECK(update->status == 200);
  CHECK(finish->status == 200);
  CHECK(f.engines.names() == Names{"start_weight_update", "update_weights", "finish_weight_update",
                                   "set_weight_version"});
}
