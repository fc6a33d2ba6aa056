// Owned weight-update sessions through WeightSyncService (docs/http-api.md §7.1, §7.2, §7.5):
// a start with a Vllmd-Session id makes the session that client's (409 for anyone else),
// one without makes it anonymous, an idle owner loses it, and GET /weight_update_session
// shows it.

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/api/service_fixture.hpp"

using namespace vllmd::test;

namespace {

const std::string kConflict =
    "a weight-update session owned by another client is open (it sent another Vllmd-Session "
    "id); wait for it to finish, or for it to go idle for server.session_idle_timeout";
const std::string kUpdate = R"({"update_info":{"names":["w"]}})";

Request as(std::optional<std::string> session, std::string body = "") {
  return {std::move(body), std::move(session)};
}

void check_conflict(const Response& response) {
  CHECK(response.status == 409);
  CHECK(error_member(response, "code") == "conflict");
  CHECK(error_member(response, "type") == "conflict");
  CHECK(error_message(response) == kConflict);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("an owned session: another id or none gets 409 and reaches no engine") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kStartWeightUpdate, as("trainer-a")).status == 200);
  const std::size_t started = f.engines.call_count();
  check_conflict(f.run(Operation::kUpdateWeights, as("trainer-b", kUpdate)));
  check_conflict(f.run(Operation::kUpdateWeights, as(std::nullopt, kUpdate)));
  check_conflict(
      f.run(Operation::kFinishWeightUpdate, as(std::nullopt, R"({"weight_version":"b"})")));
  check_conflict(f.run(Operation::kStartWeightUpdate, as("trainer-b")));
  check_conflict(f.run(Operation::kStartDraftWeightUpdate));
  CHECK(f.engines.call_count() == started);
  // Init and the version label are no part of a session.
  CHECK(f.run(Operation::kInitWeightTransfer, as("trainer-b", R"({"init_info":{}})")).status ==
        200);
  CHECK(f.run(Operation::kUpdateWeightVersion, as("trainer-b", R"({"new_version":"x"})")).status ==
        200);
  CHECK(f.run(Operation::kUpdateWeights, as("trainer-a", kUpdate)).status == 200);
  CHECK(f.run(Operation::kFinishWeightUpdate, as("trainer-a", R"({"weight_version":"a-1"})"))
            .status == 200);
  CHECK(f.run(Operation::kWeightInfo).body == R"({"weight_version":"a-1"})");
  CHECK(f.engines.names(started) == Names{"init_weight_transfer_engine", "set_weight_version",
                                          "update_weights", "finish_weight_update",
                                          "set_weight_version"});
  // Closed: anyone may open the next one.
  CHECK(f.run(Operation::kStartWeightUpdate, as("trainer-b")).status == 200);
}

TEST_CASE("a session opened without an id is anonymous: anyone may continue it") {
  ServiceFixture f(1);
  REQUIRE(f.run(Operation::kStartWeightUpdate).status == 200);
  CHECK(f.run(Operation::kUpdateWeights, as(std::nullopt, kUpdate)).status == 200);
  CHECK(f.run(Operation::kUpdateWeights, as("someone", kUpdate)).status == 200);
  CHECK(f.run(Operation::kFinishWeightUpdate, as("someone-else")).status == 200);
  CHECK(f.engines.names() ==
        Names{"start_weight_update", "update_weights", "update_weights", "finish_weight_update"});
}

TEST_CASE("an owned session idle past session_idle_timeout becomes anonymous") {
  vllmd::api::ServiceOptions options;
  options.session_idle_timeout = std::chrono::milliseconds(200);
  ServiceFixture f(1, options);
  REQUIRE(f.run(Operation::kStartWeightUpdate, as("crashed")).status == 200);
  check_conflict(f.run(Operation::kFinishWeightUpdate));
  CHECK(contains(f.run(Operation::kSessionStatus).body, R"("open":true,"owned":true)"));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  CHECK(contains(f.run(Operation::kSessionStatus).body, R"("open":true,"owned":false)"));
  CHECK(f.run(Operation::kFinishWeightUpdate).status == 200);
  CHECK(f.engines.names() == Names{"start_weight_update", "finish_weight_update"});
}

TEST_CASE("an owner's calls keep its session from going idle") {
  vllmd::api::ServiceOptions options;
  options.session_idle_timeout = std::chrono::milliseconds(600);
  ServiceFixture f(1, options);
  REQUIRE(f.run(Operation::kStartWeightUpdate, as("t")).status == 200);
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    REQUIRE(f.run(Operation::kUpdateWeights, as("t", kUpdate)).status == 200);
  }
  // 750 ms since the start, none since the last update: still owned.
  check_conflict(f.run(Operation::kFinishWeightUpdate));
}

TEST_CASE("GET /weight_update_session shows the session") {
  ServiceFixture f(2);
  f.engines.restart(1);
  const Response none = f.run(Operation::kSessionStatus);
  CHECK(none.status == 200);
  CHECK(none.body == R"({"open":false,"version_current":true})");
  REQUIRE(f.run(Operation::kStartWeightUpdate, as("t")).status == 200);
  REQUIRE(f.run(Operation::kUpdateWeights, as("t", kUpdate)).status == 200);
  const std::string open = f.run(Operation::kSessionStatus).body;
  CHECK(contains(open, R"({"open":true,"owned":true,"draft":false,"age_seconds":)"));
  CHECK(contains(open, R"(,"idle_seconds":)"));
  CHECK(contains(open, R"(,"updates":1,"engine_incarnations":[1,2],"version_current":false})"));
  CHECK(f.engines.names() == Names{"start_weight_update", "update_weights"});  // asks no engine
  // Finished without a version: the weights changed and no version names them yet.
  REQUIRE(f.run(Operation::kFinishWeightUpdate, as("t")).status == 200);
  CHECK(f.run(Operation::kSessionStatus).body == R"({"open":false,"version_current":false})");
  REQUIRE(f.run(Operation::kUpdateWeightVersion, {R"({"new_version":"v"})"}).status == 200);
  CHECK(f.run(Operation::kSessionStatus).body == R"({"open":false,"version_current":true})");
  // A draft session, anonymous.
  REQUIRE(f.run(Operation::kStartDraftWeightUpdate).status == 200);
  CHECK(
      contains(f.run(Operation::kSessionStatus).body, R"("open":true,"owned":false,"draft":true)"));
  CHECK(contains(f.run(Operation::kSessionStatus).body, R"("updates":0,)"));
}
