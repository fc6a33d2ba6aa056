#pragma once
// One API call as the service's handlers see it, and the response they answer it with.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/api/request.hpp"
#include "common/wire/json_to_msgpack.hpp"

namespace vllmd::api {

struct Route;

struct Response {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  double engine_seconds = 0;  // time spent waiting for engines
};

// Every call ends in exactly one call of its Done, from whatever thread finished it (the
// caller's, an engine IO thread's or the executor's): it must not block.
using Done = std::function<void(Response)>;

struct Call {
  const Route* route = nullptr;
  Query query;
  std::string body;                    // raw; released once transcoded
  std::optional<std::string> session;  // the client's Vllmd-Session id (valid; none: nullopt)

  // The body member the route names, validated (before the call may queue or reach engines).
  std::optional<wire::Transcoded> document;  // the body, as msgpack
  std::string_view value;                    // the member's msgpack bytes, inside `document`
  std::optional<std::string> text;           // a string member (a version)
  std::string engine_args = "\x90";          // from the query (Route::engine_args); [] if none
};
using CallPtr = std::shared_ptr<Call>;

}  // namespace vllmd::api
