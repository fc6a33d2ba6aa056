// WeightSyncService's engine commands (common/api/engine_commands.cpp): the cache resets go to
// every engine with vLLM's arguments, validated before any is sent, their results merged as
// vLLM's Rust frontend merges them.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/unit/api/service_fixture.hpp"

using namespace vllmd::test;

namespace {

// Every engine succeeds; reset_prefix_cache answers `reset_on_rank0` on rank 0, true elsewhere.
FakeEngines::Responder prefix_reset(bool reset_on_rank0) {
  return [=, succeed = succeeding()](const RecordedCall& call, int rank) -> std::optional<Reply> {
    if (call.method == "reset_prefix_cache") return bool_reply(rank == 0 ? reset_on_rank0 : true);
    return succeed(call, rank);
  };
}

}  // namespace

TEST_CASE("reset_mm_cache and reset_encoder_cache reach every engine without arguments") {
  for (const auto& route : {std::pair{Operation::kResetMmCache, "reset_mm_cache"},
                            std::pair{Operation::kResetEncoderCache, "reset_encoder_cache"}}) {
    const Operation operation = route.first;
    const std::string method = route.second;
    CAPTURE(method);
    ServiceFixture f(2);
    const Response response = f.run(operation);
    CHECK(response.status == 200);
    CHECK(response.body.empty());  // both vLLM frontends answer with an empty body
    REQUIRE(f.engines.call_count() == 1);
    CHECK(f.engines.call(0).method == method);
    CHECK(f.engines.call(0).args == "\x90");  // []
    CHECK(f.engines.call(0).ranks == Ranks{0, 1});
  }
}

TEST_CASE("an engine's failure to reset a cache is a 500 naming the rank") {
  ServiceFixture f(2);
  f.engines.set_responder([succeed = succeeding()](const RecordedCall& call, int rank) {
    if (rank == 1) return std::optional<Reply>(failed("Call to reset_mm_cache method failed: x"));
    return succeed(call, rank);
  });
  const Response response = f.run(Operation::kResetMmCache);
  CHECK(response.status == 500);
  CHECK(error_message(response).find("rank 1") != std::string::npos);
}

TEST_CASE("reset_prefix_cache sends the query's booleans in vLLM's order, Python's True too") {
  ServiceFixture f(1);
  f.engines.set_responder(prefix_reset(true));
  const Response response =
      f.run(Operation::kResetPrefixCache, {"", std::nullopt, "reset_running_requests=True"});
  CHECK(response.status == 200);
  CHECK(response.body == R"({"success":true})");
  REQUIRE(f.engines.call_count() == 1);
  CHECK(f.engines.call(0).method == "reset_prefix_cache");
  CHECK(f.engines.call(0).args_json == "[true,false]");
  CHECK(f.engines.call(0).args == "\x92\xc3\xc2");

  CHECK(f.run(Operation::kResetPrefixCache, {"", std::nullopt, "reset_external=true"}).status ==
        200);
  CHECK(f.engines.call(1).args_json == "[false,true]");
  CHECK(f.run(Operation::kResetPrefixCache).status == 200);
  CHECK(f.engines.call(2).args_json == "[false,false]");
}

TEST_CASE("a reset_prefix_cache flag that is not a boolean is a 400 and reaches no engine") {
  ServiceFixture f(2);
  const Response response =
      f.run(Operation::kResetPrefixCache, {"", std::nullopt, "reset_running_requests=maybe"});
  CHECK(response.status == 400);
  CHECK(error_member(response, "param") == "reset_running_requests");
  CHECK(f.engines.call_count() == 0);
}

TEST_CASE("reset_prefix_cache succeeds only when every engine reset, and false is still a 200") {
  ServiceFixture f(2);
  f.engines.set_responder(prefix_reset(false));
  const Response declined = f.run(Operation::kResetPrefixCache);
  CHECK(declined.status == 200);
  CHECK(declined.body == R"({"success":false})");
  f.engines.set_responder(prefix_reset(true));
  CHECK(f.run(Operation::kResetPrefixCache).body == R"({"success":true})");
}
