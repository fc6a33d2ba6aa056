// WeightSyncService's /collective_rpc (common/api/rpc.cpp): every engine's list of per-worker
// results, concatenated in rank order with the values as they are (vLLM's Rust frontend).

#include <doctest/doctest.h>

#include "tests/unit/api/service_fixture.hpp"

using namespace vllmd::test;

namespace {

Reply msgpack_reply(std::string bytes) { return Reply(std::move(bytes)); }

}  // namespace

TEST_CASE("collective_rpc concatenates the engines' lists and passes values through") {
  ServiceFixture f(2);
  f.engines.set_responder([](const RecordedCall&, int rank) -> std::optional<Reply> {
    // rank 0: [{"a": 1}] (one worker); rank 1: [2, true] (two workers).
    if (rank == 0)
      return msgpack_reply(
          "\x91\x81\xa1"
          "a\x01");
    return msgpack_reply("\x92\x02\xc3");
  });
  const Response response =
      f.run(Operation::kCollectiveRpc, {R"({"method":"echo_args_kwargs","timeout":2})"});
  CHECK(response.status == 200);
  CHECK(response.body == R"({"results":[{"a":1},2,true]})");
  REQUIRE(f.engines.call_count() == 1);
  CHECK(f.engines.call(0).method == "collective_rpc");
  CHECK(f.engines.call(0).args_json == R"(["echo_args_kwargs",2.0,[],{}])");
  CHECK(f.engines.call(0).ranks == Ranks{0, 1});
}

TEST_CASE("a bad collective_rpc body is a 400 that reaches no engine") {
  ServiceFixture f(1);
  const Response response = f.run(Operation::kCollectiveRpc, {R"({"args":[]})"});
  CHECK(response.status == 400);
  CHECK(error_message(response) == "Missing 'method' in request body");
  CHECK(error_member(response, "param") == "method");
  CHECK(f.run(Operation::kCollectiveRpc, {"[1]"}).status == 400);
  CHECK(f.engines.call_count() == 0);
}

TEST_CASE("collective_rpc is a lifecycle call: another client's session refuses it") {
  ServiceFixture f(1);
  REQUIRE(f.run(Operation::kStartWeightUpdate, {"", "trainer-a"}).status == 200);
  CHECK(f.run(Operation::kCollectiveRpc, {R"({"method":"m"})", "trainer-b"}).status == 409);
  CHECK(f.engines.call_count() == 1);
}
