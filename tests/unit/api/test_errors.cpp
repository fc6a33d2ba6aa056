// The error model (common/api/errors.*): the exact body shape and the exit-code table.

#include <doctest/doctest.h>

#include "common/api/errors.hpp"

using namespace vllmd::api;

TEST_CASE("error bodies have the OpenAI shape of the Rust frontend") {
  CHECK(
      invalid_request("'update_info' must be a JSON object", "update_info").body() ==
      R"({"error":{"message":"'update_info' must be a JSON object","type":"invalid_request_error",)"
      R"("param":"update_info","code":"invalid_request_error"}})");
  CHECK(json_parse_error("bad \"json\"").body() ==
        R"({"error":{"message":"bad \"json\"","type":"invalid_request_error","param":null,)"
        R"("code":"json_parse_error"}})");
  CHECK(unauthorized("x").status == 401);
  CHECK(unauthorized("x").type == "authentication_error");
  CHECK(forbidden("nope").body() ==
        R"({"error":{"message":"nope","type":"authentication_error","param":null,)"
        R"("code":"forbidden"}})");
  CHECK(forbidden("x").status == 403);
  CHECK(exit_code_for_status(forbidden("x").status) == exit_code::kUnauthorized);
  CHECK(payload_too_large("x").code == "payload_too_large");
  CHECK(server_error("x").status == 500);
  CHECK(engine_unavailable("x").code == "engine_unavailable");
  CHECK(engine_unavailable("x").status == 503);
  CHECK(engine_timeout("x").status == 504);
  CHECK(engine_timeout("x").type == "server_error");
}

TEST_CASE("HTTP status to vllmctl exit code") {
  CHECK(exit_code_for_status(200) == 0);
  CHECK(exit_code_for_status(400) == 65);
  CHECK(exit_code_for_status(413) == 65);
  CHECK(exit_code_for_status(401) == 77);
  CHECK(exit_code_for_status(403) == 77);
  CHECK(exit_code_for_status(503) == 69);
  CHECK(exit_code_for_status(500) == 70);
  CHECK(exit_code_for_status(504) == 75);
}

TEST_CASE("an invalid configuration maps to 78 whatever its status") {
  const ApiError error = invalid_configuration("reload failed: server.port: must be ...");
  CHECK(error.status == 400);
  CHECK(error.code == "invalid_configuration");
  CHECK(exit_code_for(error.status, error.code) == 78);
  CHECK(exit_code_for(400, "invalid_request_error") == 65);
  CHECK(exit_code_for(503, "") == 69);
}
