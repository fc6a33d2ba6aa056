#include "daemon/http/response.hpp"

#include <ctime>

namespace vllmd::daemon::http {

namespace {

// "Sun, 29 Nov 2026 12:00:00 GMT", formatted once per second per thread.
std::string_view http_date() {
  thread_local std::time_t formatted_at = 0;
  thread_local char text[40] = {};
  const std::time_t now = std::time(nullptr);
  if (now != formatted_at) {
    std::tm utc{};
    gmtime_r(&now, &utc);
    std::strftime(text, sizeof text, "%a, %d %b %Y %H:%M:%S GMT", &utc);
    formatted_at = now;
  }
  return text;
}

void append_head(std::string& out, int status, const Headers& headers, bool keep_alive) {
  out.append("HTTP/1.1 ").append(std::to_string(status)).append(" ");
  out.append(reason_phrase(status)).append("\r\nDate: ").append(http_date());
  out.append("\r\nServer: vllmd\r\n");
  for (const auto& [name, value] : headers)
    out.append(name).append(": ").append(value).append("\r\n");
  if (!keep_alive) out.append("Connection: close\r\n");
}

}  // namespace

Response error_response(const api::ApiError& error) {
  Response response;
  response.status = error.status;
  response.body = error.body();
  return response;
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return status < 400 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

std::string serialize(const Response& response, bool keep_alive) {
  std::string out;
  out.reserve(response.body.size() + 192);
  append_head(out, response.status, response.headers, keep_alive);
  out.append("Content-Type: ").append(response.content_type);
  out.append("\r\nContent-Length: ").append(std::to_string(response.body.size()));
  out.append("\r\n\r\n").append(response.body);
  return out;
}

std::string serialize_stream_head(int status, std::string_view content_type, const Headers& headers,
                                  bool keep_alive, bool chunked) {
  std::string out;
  append_head(out, status, headers, keep_alive && chunked);
  out.append("Content-Type: ").append(content_type).append("\r\n");
  if (chunked) out.append("Transfer-Encoding: chunked\r\n");
  out.append("\r\n");
  return out;
}

std::string chunk(std::string data) {
  if (data.empty()) return data;
  static constexpr char kHex[] = "0123456789abcdef";
  char line[2 * sizeof(std::size_t) + 2];  // the size in hex, then CRLF
  char* end = line + sizeof line;
  char* at = end;
  *--at = '\n';
  *--at = '\r';
  for (std::size_t size = data.size(); size != 0; size >>= 4) {
    *--at = kHex[size & 0xf];
  }
  // In place: a producer that left room in its string pays a move, not an allocation.
  data.insert(0, at, static_cast<std::size_t>(end - at));
  data.append("\r\n");
  return data;
}

}  // namespace vllmd::daemon::http
