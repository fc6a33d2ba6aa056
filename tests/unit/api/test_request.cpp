// Request validation (common/api/request.*): the 400s of docs/http-api.md §3, and the byte
// ranges handed to the engine unchanged.

#include <doctest/doctest.h>

#include "common/api/request.hpp"
#include "common/api/table.hpp"
#include "common/wire/msgpack_to_json.hpp"

using namespace vllmd::api;

namespace {

ApiError body_error(std::string_view body) {
  auto parsed = parse_object_body(body);
  REQUIRE_FALSE(parsed);
  return parsed.error();
}

vllmd::wire::Transcoded body(std::string_view json) {
  auto parsed = parse_object_body(json);
  REQUIRE(parsed);
  return std::move(*parsed);
}

std::string json_of(std::string_view msgpack) {
  return vllmd::wire::msgpack_to_json(msgpack).value();
}

// A route's body member, as the service checks it before anything reaches an engine.
tl::expected<MemberValue, ApiError> member(Operation operation,
                                           const vllmd::wire::Transcoded& document) {
  return member_value(route_for(operation), document);
}
auto init_info(const vllmd::wire::Transcoded& document) {
  return member(Operation::kInitWeightTransfer, document).map([](auto m) { return m.value; });
}
auto update_info(const vllmd::wire::Transcoded& document) {
  return member(Operation::kUpdateWeights, document).map([](auto m) { return m.value; });
}
auto finish_version(const vllmd::wire::Transcoded& document) {
  return member(Operation::kFinishWeightUpdate, document).map([](auto m) { return m.text; });
}
auto new_version(const vllmd::wire::Transcoded& document) {
  return member(Operation::kUpdateWeightVersion, document).map([](auto m) { return m.text; });
}

}  // namespace

TEST_CASE("the body must be a JSON object") {
  const ApiError invalid = body_error("{\"init_info\": ");
  CHECK(invalid.status == 400);
  CHECK(invalid.code == "json_parse_error");
  CHECK(invalid.message.find("at byte 14") != std::string::npos);
  for (const char* not_object : {"[]", "\"x\"", "5", "null", "[{}]"}) {
    CAPTURE(not_object);
    const ApiError error = body_error(not_object);
    CHECK(error.code == "invalid_request_error");
    CHECK(error.message == "Request body must be a JSON object");
    CHECK_FALSE(error.param);
  }
}

TEST_CASE("init_info must be an object, passed through as it came") {
  for (const char* bad :
       {"{}", R"({"init_info":null})", R"({"init_info":[]})", R"({"init_info":"x"})"}) {
    CAPTURE(bad);
    auto info = init_info(body(bad));
    REQUIRE_FALSE(info);
    CHECK(info.error().message == "'init_info' must be a JSON object");
    CHECK(info.error().param == "init_info");
  }
  const auto document =
      body(R"({"init_info":{"master_port":29500,"big":18446744073709551615,"f":0.5}})");
  auto info = init_info(document);
  REQUIRE(info);
  CHECK(json_of(*info) == R"({"master_port":29500,"big":18446744073709551615,"f":0.5})");
}

TEST_CASE("update_info: an object or a list of objects") {
  for (const char* bad : {"{}", R"({"update_info":null})", R"({"update_info":"x"})",
                          R"({"update_info":[1]})", R"({"update_info":[{},1]})"}) {
    CAPTURE(bad);
    auto info = update_info(body(bad));
    REQUIRE_FALSE(info);
    CHECK(info.error().message ==
          "'update_info' must be a JSON object or a list of per-worker JSON objects");
    CHECK(info.error().param == "update_info");
  }
  const auto list = body(R"({"update_info":[{"names":["a"]},{"names":["b"]}]})");
  CHECK(json_of(update_info(list).value()) == R"([{"names":["a"]},{"names":["b"]}])");
  CHECK(update_info(body(R"({"update_info":[]})")));  // an empty per-worker list is a list
}

TEST_CASE("versions: finish's optional weight_version, update_weight_version's new_version") {
  CHECK(finish_version(body("{}")).value() == std::nullopt);
  CHECK(finish_version(body(R"({"weight_version":null})")).value() == std::nullopt);
  CHECK(finish_version(body(R"({"weight_version":"step-42"})")).value() == "step-42");
  auto bad = finish_version(body(R"({"weight_version":5})"));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().param == "weight_version");

  CHECK(new_version(body(R"({"new_version":"v2"})")).value() == "v2");
  // As vLLM words it: the route's name, not the member's.
  CHECK(new_version(body("{}")).error().message == "Invalid 'update_weight_version' request body");
  for (const char* invalid : {"{}", R"({"new_version":7})", R"({"new_version":null})"}) {
    CAPTURE(invalid);
    auto error = new_version(body(invalid));
    REQUIRE_FALSE(error);
    CHECK(error.error().param == "new_version");
  }
}

TEST_CASE("query parameters") {
  const Query query = parse_query("mode=wait&clear_cache=False&x=%41b+c&flag");
  CHECK(*query_value(query, "x") == "Ab c");
  CHECK(*query_value(query, "flag") == "");
  CHECK(pause_mode(query).value() == "wait");
  CHECK(pause_mode({}).value() == "abort");
  CHECK(query_bool(query, "clear_cache", true).value() == false);
  CHECK(query_bool({}, "include_dp", true).value() == true);
  for (const char* yes : {"true", "1", "yes", "on", "TRUE"}) {
    CHECK(query_bool({{"b", yes}}, "b", false).value());
  }
  auto bad_mode = pause_mode({{"mode", "later"}});
  REQUIRE_FALSE(bad_mode);
  CHECK(bad_mode.error().param == "mode");
  auto bad_bool = query_bool({{"include_dp", "maybe"}}, "include_dp", true);
  REQUIRE_FALSE(bad_bool);
  CHECK(bad_bool.error().param == "include_dp");
}
