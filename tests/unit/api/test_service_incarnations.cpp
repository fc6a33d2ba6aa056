// A weight-update session belongs to the engine incarnations it started on: a rank restarted
// during it loses the session, nothing is committed, and the survivors' sessions are closed
// (docs/http-api.md §7.3, §7.4).

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/unit/api/service_fixture.hpp"

using namespace vllmd::test;

namespace {

const std::string kRank0Lost =
    "engine rank 0 restarted during the weight-update session (rank 0: incarnation 1, now 2); "
    "nothing was committed";

Request update_body() { return {R"({"update_info":{"names":["w"]}})"}; }

bool never_sent(const FakeEngines& engines, const std::string& name) {
  for (const RecordedCall& call : engines.calls()) {
    if (call.name() == name) return false;
  }
  return true;
}

// After a lost session: nothing committed, no session, and the next one opens on every rank.
void check_recovered(ServiceFixture& f) {
  CHECK(never_sent(f.engines, "set_weight_version"));
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"default"})");
  CHECK(f.run(Operation::kSessionStatus).body == R"({"open":false,"version_current":false})");
  const std::size_t next = f.engines.call_count();
  CHECK(f.run(Operation::kStartWeightUpdate).status == 200);
  REQUIRE(f.engines.call_count() == next + 1);
  CHECK(f.engines.call(next).options.incarnations == Incarnations{2, 1});
  CHECK(f.engines.call(next).refused.empty());
}

}  // namespace

TEST_CASE("a rank restarted mid-session: the next call gets 503 naming it, survivors closed") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  REQUIRE(f.run(Operation::kUpdateWeights, update_body()).status == 200);
  f.engines.restart(0);
  const std::size_t before = f.engines.call_count();
  Response lost;
  SUBCASE("finish with a version") {
    lost = f.run(Operation::kFinishWeightUpdate, {R"({"weight_version":"step-42"})"});
  }
  SUBCASE("update") { lost = f.run(Operation::kUpdateWeights, update_body()); }
  // Not sent on: rank 1 would refuse it ("already active") while the new rank 0 took it.
  SUBCASE("another start") { lost = f.run(Operation::kStartWeightUpdate); }
  CHECK(lost.status == 503);
  CHECK(error_member(lost, "code") == "engine_unavailable");
  CHECK(error_message(lost) == kRank0Lost + ", and the session was closed on engine rank 1");
  // The new rank 0 never hears of the session; rank 1's is closed without a version.
  REQUIRE(f.engines.call_count() == before + 1);
  const RecordedCall close = f.engines.call(before);
  CHECK(close.args_json == kFinishArgs);
  CHECK(close.ranks == Ranks{1});
  CHECK(close.options.incarnations == Incarnations{1, 1});
  check_recovered(f);
}

TEST_CASE("a rank restarted while the others finish commits nothing") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  f.engines.set_responder(holding("finish_weight_update"));
  const Answer finish = f.send(Operation::kFinishWeightUpdate, {R"({"weight_version":"step-42"})"});
  const std::size_t id = f.engines.call_count() - 1;
  f.engines.answer(id, 0, nil());  // rank 0 finished, then a new process took its place
  f.engines.restart(0);
  f.engines.set_responder(succeeding());
  f.engines.answer(id, 1, nil());
  REQUIRE(finish.answered());
  CHECK(finish->status == 503);
  // Every rank finished: no session is left to close.
  CHECK(error_message(*finish) == kRank0Lost);
  CHECK(f.engines.names() == Names{"start_weight_update", "finish_weight_update"});
  CHECK(never_sent(f.engines, "set_weight_version"));
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"default"})");
}

TEST_CASE("an update that lost a rank to a restart closes the survivors' sessions") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  f.engines.set_responder(holding("update_weights"));
  const Answer update = f.send(Operation::kUpdateWeights, update_body());
  const std::size_t id = f.engines.call_count() - 1;
  f.engines.restart(0);  // the client fails the old process's pending call
  f.engines.set_responder(succeeding());
  f.engines.answer(id, 0, unavailable("engine rank 0 restarted", true));
  CHECK_FALSE(update.answered());  // rank 1 is still updating
  f.engines.answer(id, 1, nil());
  REQUIRE(update.answered());
  CHECK(update->status == 503);
  CHECK(error_message(*update) == kRank0Lost + ", and the session was closed on engine rank 1");
  REQUIRE(f.engines.call_count() == id + 2);
  CHECK(f.engines.call(id + 1).ranks == Ranks{1});
  CHECK(f.engines.call(id + 1).args_json == kFinishArgs);
  check_recovered(f);
}

TEST_CASE("every restarted rank is named, with its incarnations") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  f.engines.restart(1);
  f.engines.restart(1);
  f.engines.restart(0);
  const Response lost = f.run(Operation::kFinishWeightUpdate);
  CHECK(lost.status == 503);
  CHECK(error_message(lost) ==
        "engine ranks 0, 1 restarted during the weight-update session (rank 0: incarnation 1, "
        "now 2, rank 1: incarnation 1, now 3); nothing was committed");
  CHECK(f.engines.names() == Names{"start_weight_update"});  // no survivor to close
}

TEST_CASE("session calls carry the incarnations the session started on") {
  ServiceFixture f(2);
  f.engines.restart(1);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  REQUIRE(f.run(Operation::kUpdateWeights, update_body()).status == 200);
  REQUIRE(f.run(Operation::kFinishWeightUpdate, {R"({"weight_version":"v"})"}).status == 200);
  const std::vector<RecordedCall> calls = f.engines.calls();
  REQUIRE(calls.size() == 4);
  for (const RecordedCall& call : calls) {
    CAPTURE(call.name());
    CHECK(call.options.incarnations == Incarnations{1, 2});
    CHECK(call.options.timeout_marks_dead);  // a lifecycle call
  }
  // Init is no part of a session: any incarnation.
  REQUIRE(f.run(Operation::kInitWeightTransfer, {R"({"init_info":{}})"}).status == 200);
  CHECK(f.engines.calls().back().options.incarnations.empty());
}
