#pragma once
// Calls into a ReferenceCore with JSON in and JSON out, for its unit tests.

#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "common/reference/core.hpp"
#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::reference::testing {

inline std::string msgpack_of(std::string_view json) {
  auto transcoded = vllmd::wire::json_to_msgpack(json);
  REQUIRE(transcoded);
  return transcoded->msgpack.str();
}

// The value as JSON, or "error: <message>".
inline std::string call(ReferenceCore& core, std::string_view method, std::string_view args_json) {
  auto result = core.call(method, msgpack_of(args_json));
  if (!result) return "error: " + result.error();
  auto json = vllmd::wire::msgpack_to_json(*result);
  REQUIRE(json);
  return *json;
}

inline std::string rpc(ReferenceCore& core, std::string_view worker_method,
                       std::string_view kwargs_json = "{}") {
  return call(core, "collective_rpc",
              "[\"" + std::string(worker_method) + "\",null,[]," + std::string(kwargs_json) + "]");
}

inline std::string error(std::string_view message) { return "error: " + std::string(message); }

}  // namespace vllmd::reference::testing
