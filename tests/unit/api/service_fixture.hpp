#pragma once
// The real WeightSyncService over FakeEngines, driven as the daemon's router drives it
// (daemon/router.cpp): a Call built from the API table row, handed to handle() with a Done.

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/api/service.hpp"
#include "common/api/table.hpp"
#include "tests/unit/api/fake_engines.hpp"

// Vectors in failure messages, as [a, b] (doctest shows {?} otherwise).
namespace doctest {
template <typename T> struct StringMaker<std::vector<T>> {
  static String convert(const std::vector<T>& values) {
    String out = "[";
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (i > 0) out += ", ";
      out += toString(values[i]);
    }
    return out + "]";
  }
};
}  // namespace doctest

namespace vllmd::test {

using api::Operation;
using api::Response;
using Ranks = std::vector<int>;
using Incarnations = std::vector<std::uint64_t>;
using Names = std::vector<std::string>;

// The args of the finish that closes a session without a version (collective_rpc's four).
inline constexpr std::string_view kFinishArgs = R"(["finish_weight_update",null,[],{}])";

// The response to one call, once its Done ran (maybe after handle() returned).
struct Answer {
  std::shared_ptr<std::optional<Response>> response = std::make_shared<std::optional<Response>>();
  bool answered() const { return response->has_value(); }
  const Response& operator*() const {
    REQUIRE(answered());
    return **response;
  }
  const Response* operator->() const { return &**this; }
};

struct Request {
  // A constructor, so that `{body}` and `{body, session}` stay warning-free.
  Request(std::string request_body = {}, std::optional<std::string> session_id = std::nullopt,
          std::string query_text = {})
      : body(std::move(request_body)), session(std::move(session_id)),
        query(std::move(query_text)) {}

  std::string body;
  std::optional<std::string> session;  // the Vllmd-Session id
  std::string query;
};

// An error response's members ("message", "code", "type"), or "" when it has none.
std::string error_member(const Response& response, std::string_view member);
inline std::string error_message(const Response& response) {
  return error_member(response, "message");
}

// Every call succeeds with nil, except the reads: get_weight_version answers `version`,
// is_scheduler_paused false.
FakeEngines::Responder succeeding(const std::string& version = "default");
// The same, but calls named `held` (RecordedCall::name) stay pending, for the test to answer.
FakeEngines::Responder holding(const std::string& held, const std::string& version = "default");

// `ranks` fake engines answering succeeding(), their state changes told to the service as the
// daemon tells it the client's (on_engine_state), and the service without an executor: a
// queued lifecycle call starts on the thread that finished the one before it.
struct ServiceFixture {
  explicit ServiceFixture(int ranks = 1, api::ServiceOptions options = {});
  ~ServiceFixture();

  // Handles the call; the answer may still be to come.
  Answer send(Operation operation, Request request = {});
  // Handles the call, which must have been answered by the time handle() returned.
  Response run(Operation operation, Request request = {});

  FakeEngines engines;
  api::WeightSyncService service;
};

// {"weight_version": "<version>"} and the like.
std::string json_member(std::string_view key, std::string_view text);

}  // namespace vllmd::test
