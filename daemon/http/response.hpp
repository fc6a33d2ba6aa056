#pragma once
// The one response writer: every status vllmd sends, from the routes and from the connection
// layer alike, is serialized here, and every error carries the API's OpenAI-shaped body.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/api/errors.hpp"

namespace vllmd::daemon::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;     // besides Date, Server, Content-Type, Content-Length, Connection
  bool close = false;  // end the connection after this response
};

Response error_response(const api::ApiError& error);

std::string_view reason_phrase(int status);

// Status line, headers and body. `keep_alive` false adds `Connection: close`.
std::string serialize(const Response& response, bool keep_alive);

// The head of a streamed response: chunked for HTTP/1.1, else delimited by closing.
std::string serialize_stream_head(int status, std::string_view content_type, const Headers& headers,
                                  bool keep_alive, bool chunked);
// One chunk of a chunked body ("<size hex>\r\n<data>\r\n"), framed in place; empty data is
// written as nothing.
std::string chunk(std::string data);
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";
inline constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

}  // namespace vllmd::daemon::http
