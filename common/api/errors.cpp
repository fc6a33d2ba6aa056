#include "common/api/errors.hpp"

#include "common/wire/json_text.hpp"

namespace vllmd::api {

std::string ApiError::body() const {
  std::string out = "{\"error\":{\"message\":";
  wire::append_json_string(out, message);
  out += ",\"type\":";
  wire::append_json_string(out, type);
  out += ",\"param\":";
  if (param) {
    wire::append_json_string(out, *param);
  } else {
    out += "null";
  }
  out += ",\"code\":";
  wire::append_json_string(out, code);
  out += "}}";
  return out;
}

namespace {
ApiError make(int status, std::string type, std::string code, std::string message,
              std::optional<std::string> param = std::nullopt) {
  return ApiError{status, std::move(type), std::move(code), std::move(message), std::move(param)};
}
}  // namespace

ApiError invalid_request(std::string message, std::optional<std::string> param) {
  return make(400, "invalid_request_error", "invalid_request_error", std::move(message),
              std::move(param));
}
ApiError json_parse_error(std::string message) {
  return make(400, "invalid_request_error", "json_parse_error", std::move(message));
}
ApiError unauthorized(std::string message) {
  return make(401, "authentication_error", "unauthorized", std::move(message));
}
ApiError forbidden(std::string message) {
  return make(403, "authentication_error", "forbidden", std::move(message));
}
ApiError payload_too_large(std::string message) {
  return make(413, "invalid_request_error", "payload_too_large", std::move(message));
}
ApiError not_found() { return make(404, "invalid_request_error", "not_found", "Not Found"); }
ApiError method_not_allowed() {
  return make(405, "invalid_request_error", "method_not_allowed", "Method Not Allowed");
}
ApiError server_error(std::string message) {
  return make(500, "server_error", "server_error", std::move(message));
}
ApiError engine_unavailable(std::string message) {
  return make(503, "server_error", "engine_unavailable", std::move(message));
}
ApiError engine_timeout(std::string message) {
  return make(504, "server_error", "engine_timeout", std::move(message));
}

ApiError conflict(std::string message) {
  return make(409, "conflict", "conflict", std::move(message));
}
ApiError weights_asleep_error(std::string message) {
  return make(409, "conflict", "weights_asleep", std::move(message));
}

ApiError invalid_configuration(std::string message) {
  return make(400, "invalid_request_error", "invalid_configuration", std::move(message));
}

ApiError bad_request(std::string message) {
  return make(400, "invalid_request_error", "bad_request", std::move(message));
}
ApiError request_timeout(std::string message) {
  return make(408, "invalid_request_error", "request_timeout", std::move(message));
}
ApiError expectation_failed(std::string message) {
  return make(417, "invalid_request_error", "expectation_failed", std::move(message));
}
ApiError header_too_large(std::string message) {
  return make(431, "invalid_request_error", "header_too_large", std::move(message));
}
ApiError not_implemented(std::string message) {
  return make(501, "invalid_request_error", "not_implemented", std::move(message));
}
ApiError server_busy(std::string message) {
  return make(503, "server_error", "server_busy", std::move(message));
}
ApiError http_version_not_supported(std::string message) {
  return make(505, "invalid_request_error", "http_version_not_supported", std::move(message));
}

ApiError http_error(int status, std::string message) {
  switch (status) {
    case 408: return request_timeout(std::move(message));
    case 413: return payload_too_large(std::move(message));
    case 417: return expectation_failed(std::move(message));
    case 431: return header_too_large(std::move(message));
    case 501: return not_implemented(std::move(message));
    case 503: return server_busy(std::move(message));
    case 505: return http_version_not_supported(std::move(message));
    default: return bad_request(std::move(message));
  }
}

int exit_code_for(int http_status, std::string_view error_code) {
  if (error_code == "invalid_configuration") return exit_code::kConfig;
  return exit_code_for_status(http_status);
}

int exit_code_for_status(int http_status) {
  if (http_status >= 200 && http_status < 300) return exit_code::kOk;
  switch (http_status) {
    case 400:
    case 413:
    case 417:
    case 431:
    case 505: return exit_code::kRejected;
    case 408:
    case 409: return exit_code::kTimeout;
    case 401:
    case 403: return exit_code::kUnauthorized;
    case 404:
    case 503: return exit_code::kUnavailable;
    case 504: return exit_code::kTimeout;
    default: return exit_code::kEngineFailed;
  }
}

}  // namespace vllmd::api
