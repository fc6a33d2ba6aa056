// ReferenceEngine's parallel layout: PP x TP x PCP workers per engine.

#include <doctest/doctest.h>

#include <string>

#include "tests/unit/engine/reference_frontend.hpp"

using namespace std::chrono_literals;
using namespace vllmd::test;

namespace {

// One integer field of a registration frame.
std::int64_t registered(const std::string& frame,
                        std::optional<std::int64_t> wire::Registration::*field) {
  auto registration = wire::decode_registration(frame);
  REQUIRE(registration);
  REQUIRE((*registration).*field);
  return *((*registration).*field);
}

}  // namespace

TEST_SUITE("reference_engine_dp") {
  TEST_CASE("workers per engine and world_size are PP x TP x PCP") {
    ConnectedEngine test([](auto& options) {
      options.pipeline_parallel_size = 2;
      options.tensor_parallel_size = 2;
    });
    CHECK(registered(test.registration, &wire::Registration::world_size) == 4);
    CHECK(registered(test.registration, &wire::Registration::tensor_parallel_size) == 2);
    CHECK(registered(test.registration, &wire::Registration::pipeline_parallel_size) == 2);
    test.frontend.call(1, "collective_rpc", R"(["start_weight_update",null,[],{}])");
    CHECK(json(test.frontend.reply().value_msgpack) == "[null,null,null,null]");
  }

  TEST_CASE("prefill context parallelism counts in world_size, and refuses DP") {
    ConnectedEngine pcp([](auto& options) { options.prefill_context_parallel_size = 2; });
    CHECK(registered(pcp.registration, &wire::Registration::world_size) == 2);

    Frontend frontend;
    auto options = options_for(frontend);
    options.prefill_context_parallel_size = 2;
    options.data_parallel_size = 2;
    ReferenceEngine engine(options);
    engine.start();
    REQUIRE(wait_until_stopped(engine));
    CHECK(engine.error() == "PCP does not support data parallelism yet.");
  }
}
