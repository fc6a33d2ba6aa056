// WeightSyncService's sleep mode (common/api/sleep.cpp): /sleep, /wake_up and
// /release_kv_cache_memory are lifecycle calls with vLLM's engine arguments, checked before
// any engine sees them; /is_sleeping needs every engine to agree; and while weights sleep a
// weight update is a 409 that reaches no engine.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/unit/api/service_fixture.hpp"

using namespace vllmd::test;

namespace {

// Every call succeeds; wake_up answers `fully_awake`, is_sleeping answers `asleep` by rank.
FakeEngines::Responder sleepy(bool fully_awake, const std::vector<bool>& asleep = {}) {
  return [=, succeed = succeeding()](const RecordedCall& call, int rank) -> std::optional<Reply> {
    if (call.method == "wake_up") return bool_reply(fully_awake);
    if (call.method == "is_sleeping") {
      return bool_reply(asleep.at(static_cast<std::size_t>(rank)));
    }
    return succeed(call, rank);
  };
}

Request query(std::string text, std::optional<std::string> session = std::nullopt) {
  return {"", std::move(session), std::move(text)};
}

constexpr Operation kWeightUpdates[] = {Operation::kStartWeightUpdate, Operation::kUpdateWeights,
                                        Operation::kFinishWeightUpdate};

std::string update_body(Operation operation) {
  return operation == Operation::kUpdateWeights ? R"({"update_info":{}})" : "";
}

}  // namespace

TEST_CASE("sleep sends [level, mode] with vLLM's defaults and answers the level") {
  ServiceFixture f(2);
  const Response response = f.run(Operation::kSleep);
  CHECK(response.status == 200);
  CHECK(response.body == R"({"status":"sleeping","level":1})");
  REQUIRE(f.engines.call_count() == 1);
  CHECK(f.engines.call(0).method == "sleep");
  CHECK(f.engines.call(0).args_json == R"([1,"abort"])");
  CHECK(f.engines.call(0).ranks == Ranks{0, 1});

  f.engines.set_responder(sleepy(true));
  CHECK(f.run(Operation::kWakeUp).status == 200);
  CHECK(f.run(Operation::kSleep, query("level=2&mode=wait")).body ==
        R"({"status":"sleeping","level":2})");
  CHECK(f.engines.call(2).args_json == R"([2,"wait"])");
}

TEST_CASE("a bad level or mode is a 400 naming it, and reaches no engine") {
  ServiceFixture f(2);
  for (const auto& bad :
       {std::pair{"level=invalid", "query.level"}, std::pair{"level=-1", "query.level"},
        std::pair{"level=3", "query.level"}, std::pair{"level=", "query.level"},
        std::pair{"mode=invalid", "query.mode"}}) {
    const std::string text = bad.first;
    CAPTURE(text);
    const Response response = f.run(Operation::kSleep, query(text));
    CHECK(response.status == 400);
    CHECK(error_member(response, "param") == bad.second);
  }
  const Response tag = f.run(Operation::kWakeUp, query("tags=weight"));
  CHECK(tag.status == 400);
  CHECK(error_member(tag, "param") == "query.tags");
  CHECK(f.engines.call_count() == 0);
}

TEST_CASE("wake_up sends the repeated tags key only, and says whether all is awake") {
  ServiceFixture f(2);
  f.engines.set_responder(sleepy(false));
  const Response partial =
      f.run(Operation::kWakeUp, query("tags=weights&tags%5B%5D=ignored&tags=kv_cache"));
  CHECK(partial.status == 200);
  CHECK(partial.body == R"({"status":"sleeping","tags_woken":["weights","kv_cache"]})");
  CHECK(f.engines.call(0).method == "wake_up");
  CHECK(f.engines.call(0).args_json == R"([["weights","kv_cache"]])");

  f.engines.set_responder(sleepy(true));
  const Response full = f.run(Operation::kWakeUp);
  CHECK(full.body == R"({"status":"awake","tags_woken":null})");
  CHECK(f.engines.call(1).args_json == "[null]");
}

TEST_CASE("a weight update while the weights sleep is a 409 that reaches no engine") {
  ServiceFixture f(2);
  f.engines.set_responder(sleepy(false));
  REQUIRE(f.run(Operation::kSleep).status == 200);
  const std::size_t before = f.engines.call_count();
  for (const Operation operation : kWeightUpdates) {
    const Response response = f.run(operation, {update_body(operation)});
    CHECK(response.status == 409);
    CHECK(error_member(response, "code") == "weights_asleep");
    CHECK(error_message(response) ==
          "the model weights are asleep on engine ranks 0, 1 (sleep level 1): POST "
          "/wake_up?tags=weights before a weight update");
  }
  CHECK(f.engines.call_count() == before);
  // The colocated order: wake the weights only, then update.
  REQUIRE(f.run(Operation::kWakeUp, query("tags=weights")).status == 200);
  CHECK(f.run(Operation::kStartWeightUpdate).status == 200);
}

TEST_CASE("sleep level 0 only pauses: updates go on") {
  ServiceFixture f(1);
  REQUIRE(f.run(Operation::kSleep, query("level=0")).status == 200);
  CHECK(f.run(Operation::kStartWeightUpdate).status == 200);
}

TEST_CASE("a restarted engine is awake") {
  ServiceFixture f(2);
  REQUIRE(f.run(Operation::kSleep).status == 200);
  f.engines.restart(0);
  const Response response = f.run(Operation::kStartWeightUpdate);
  CHECK(response.status == 409);
  CHECK(error_message(response).find("on engine rank 1 ") != std::string::npos);
  f.engines.restart(1);
  CHECK(f.run(Operation::kStartWeightUpdate).status == 200);
}

TEST_CASE("a sleep one engine refused leaves the others asleep, and says so") {
  ServiceFixture f(2);
  f.engines.set_responder([succeed = succeeding()](const RecordedCall& call, int rank) {
    if (call.method == "sleep" && rank == 1) {
      return std::optional<Reply>(failed("Call to sleep method failed: boom", true));
    }
    return succeed(call, rank);
  });
  const Response response = f.run(Operation::kSleep);
  CHECK(response.status == 500);
  CHECK(error_message(response).find("asleep on engine rank 0: POST /wake_up wakes them") !=
        std::string::npos);
  const Response update = f.run(Operation::kStartWeightUpdate);
  CHECK(update.status == 409);
  CHECK(error_message(update).find("on engine rank 0 ") != std::string::npos);
}

TEST_CASE("no sleep while a weight-update session is open, nor in another client's session") {
  ServiceFixture f(1);
  REQUIRE(f.run(Operation::kStartWeightUpdate, {"", "trainer-a"}).status == 200);
  const std::size_t before = f.engines.call_count();
  const Response own = f.run(Operation::kSleep, query("", "trainer-a"));
  CHECK(own.status == 409);
  CHECK(error_message(own).find("weight-update session is open") != std::string::npos);
  CHECK(f.run(Operation::kWakeUp, query("", "trainer-b")).status == 409);
  CHECK(f.run(Operation::kReleaseKvCacheMemory, query("", "trainer-b")).status == 409);
  CHECK(f.engines.call_count() == before);
  // A level-0 sleep is a pause: the owner may.
  CHECK(f.run(Operation::kSleep, query("level=0", "trainer-a")).status == 200);
}

TEST_CASE("is_sleeping answers only when every engine agrees") {
  ServiceFixture f(2);
  f.engines.set_responder(sleepy(true, {true, true}));
  const Response agreed = f.run(Operation::kIsSleeping);
  CHECK(agreed.status == 200);
  CHECK(agreed.body == R"({"is_sleeping":true})");
  CHECK(f.engines.call(0).args_json == "[]");
  f.engines.set_responder(sleepy(true, {false, true}));
  const Response split = f.run(Operation::kIsSleeping);
  CHECK(split.status == 500);
  CHECK(error_message(split) ==
        "failed to call is_sleeping: the engines disagree (engine rank 0: false, engine rank 1: "
        "true)");
}

TEST_CASE("release_kv_cache_memory answers its status, or the engine's refusal") {
  ServiceFixture f(1);
  const Response released = f.run(Operation::kReleaseKvCacheMemory);
  CHECK(released.status == 200);
  CHECK(released.body == R"({"status":"kv_cache_released"})");
  CHECK(f.engines.call(0).method == "release_kv_cache_memory");
  CHECK(f.engines.call(0).args_json == "[]");
  // The KV cache alone sleeps: weight updates go on.
  CHECK(f.run(Operation::kStartWeightUpdate).status == 200);

  ServiceFixture g(1);
  g.engines.set_responder([](const RecordedCall&, int) {
    return std::optional<Reply>(failed(
        "Call to release_kv_cache_memory method failed: release_kv_cache_memory() requires a "
        "completed pause first",
        true));
  });
  const Response refused = g.run(Operation::kReleaseKvCacheMemory);
  CHECK(refused.status == 500);
  CHECK(error_message(refused).find("requires a completed pause first") != std::string::npos);
}
