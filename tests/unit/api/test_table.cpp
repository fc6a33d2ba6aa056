// The API table (common/api/table.*): one row per route, consistent with itself.

#include <doctest/doctest.h>

#include "common/api/table.hpp"

using namespace vllmd::api;

TEST_CASE("the API table: unique paths, dev gating, the always-on routes") {
  for (const Route& route : routes()) {
    CAPTURE(route.path);
    CHECK(find_route(route.path) == &route);
    CHECK(&route_for(route.operation) == &route);
    const bool always_on = route.path == "/health" || route.path == "/version" ||
                           route.path == "/metrics" || route.path == "/reload" ||
                           route.path == "/v1/models" || route.path == "/inference/v1/generate" ||
                           route.path == "/v1/completions";
    CHECK(route.dev_only == !always_on);
    CHECK((route.method == "GET" || route.method == "POST"));
    if (!route.worker_method.empty()) CHECK(route.engine_method == "collective_rpc");
  }
  CHECK(find_route("/v1/update_weights") == nullptr);
}
