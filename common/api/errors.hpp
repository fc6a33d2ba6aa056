#pragma once
// The error model shared by vllmd and vllmctl: every failure is an HTTP status plus an
// OpenAI-shaped JSON body (docs/http-api.md §4), and maps to one vllmctl exit code.

#include <optional>
#include <string>
#include <string_view>

namespace vllmd::api {

struct ApiError {
  int status = 500;
  std::string type;  // "invalid_request_error", "authentication_error", "server_error"
  std::string code;  // "invalid_request_error", "json_parse_error", "engine_unavailable", ...
  std::string message;
  std::optional<std::string> param;

  // {"error":{"message":...,"type":...,"param":...|null,"code":...}}
  std::string body() const;
};

ApiError invalid_request(std::string message, std::optional<std::string> param = std::nullopt);
ApiError json_parse_error(std::string message);
ApiError unauthorized(std::string message);
ApiError forbidden(std::string message);  // 403: the peer's address is not allowed
ApiError payload_too_large(std::string message);
ApiError not_found();
ApiError method_not_allowed();
ApiError server_error(std::string message);
ApiError engine_unavailable(std::string message);
ApiError engine_timeout(std::string message);
ApiError conflict(std::string message);              // 409: a session owned by another client
ApiError weights_asleep_error(std::string message);  // 409: a weight update on sleeping weights
ApiError invalid_configuration(std::string message);

// The connection layer's errors (malformed or stalled requests, limits): the same shape.
ApiError bad_request(std::string message);                 // 400: malformed HTTP or framing
ApiError request_timeout(std::string message);             // 408
ApiError expectation_failed(std::string message);          // 417
ApiError header_too_large(std::string message);            // 431
ApiError not_implemented(std::string message);             // 501
ApiError server_busy(std::string message);                 // 503: connection limits
ApiError http_version_not_supported(std::string message);  // 505
// The error for one of the statuses above (or 413), as the HTTP parser reports them.
ApiError http_error(int status, std::string message);

// vllmctl exit codes (docs/product.md §4.5): part of the CLI's interface. They are sysexits.h
// values; vllmd (docs/product.md §3.4) and vllm-ref-engine exit with the same ones.
namespace exit_code {
inline constexpr int kOk = 0;
inline constexpr int kUsage = 64;
inline constexpr int kRejected = 65;      // 400, 413
inline constexpr int kNoInput = 66;       // input file missing or unreadable
inline constexpr int kUnavailable = 69;   // connect failure, 503 (and 404: no such route here)
inline constexpr int kEngineFailed = 70;  // 500
inline constexpr int kTimeout = 75;       // 504, client timeout, 409 (retry later)
inline constexpr int kUnauthorized = 77;  // 401, 403
inline constexpr int kConfig = 78;
}  // namespace exit_code

int exit_code_for_status(int http_status);
// As exit_code_for_status, but an error's code can be more precise than its status.
int exit_code_for(int http_status, std::string_view error_code);

}  // namespace vllmd::api
