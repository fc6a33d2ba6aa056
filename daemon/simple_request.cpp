#include "daemon/simple_request.hpp"

#include <algorithm>
#include <cctype>

namespace vllmd::daemon {

namespace {

bool same_name(std::string_view name, std::string_view lower) {
  return name.size() == lower.size() &&
         std::equal(name.begin(), name.end(), lower.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == b;
         });
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// Visible ASCII only: a target or method with control bytes, spaces or 8-bit bytes is Poco's.
bool is_token(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c > ' ' && c < 0x7f;
  });
}

}  // namespace

std::optional<SimpleRequest> parse_simple_request(std::string_view header) {
  const std::size_t line_end = header.find("\r\n");
  if (line_end == std::string_view::npos) return std::nullopt;
  const std::string_view line = header.substr(0, line_end);
  const std::size_t first = line.find(' ');
  if (first == std::string_view::npos) return std::nullopt;
  const std::size_t second = line.find(' ', first + 1);
  if (second == std::string_view::npos) return std::nullopt;
  SimpleRequest request;
  request.method = line.substr(0, first);
  request.target = line.substr(first + 1, second - first - 1);
  const std::string_view version = line.substr(second + 1);
  if (!is_token(request.method) || !is_token(request.target) ||
      (version != "HTTP/1.1" && version != "HTTP/1.0")) {
    return std::nullopt;
  }
  request.keep_alive = version == "HTTP/1.1";
  for (std::size_t at = line_end + 2; at < header.size();) {
    const std::size_t end = header.find("\r\n", at);
    if (end == std::string_view::npos) return std::nullopt;  // no blank line
    if (end == at) return request;                           // the blank line
    const std::string_view field = header.substr(at, end - at);
    at = end + 2;
    const std::size_t colon = field.find(':');
    if (colon == std::string_view::npos || !is_token(field.substr(0, colon))) {
      return std::nullopt;  // folded, malformed or control bytes in the name
    }
    const std::string_view name = field.substr(0, colon);
    const std::string_view value = trim(field.substr(colon + 1));
    if (same_name(name, "content-length") || same_name(name, "transfer-encoding") ||
        same_name(name, "expect")) {
      return std::nullopt;
    }
    if (same_name(name, "authorization")) {
      if (!request.authorization.empty()) return std::nullopt;
      request.authorization = value;
    } else if (same_name(name, "connection")) {
      if (same_name(value, "close")) {
        request.keep_alive = false;
      } else if (same_name(value, "keep-alive")) {
        request.keep_alive = true;
      } else {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;  // no blank line
}

}  // namespace vllmd::daemon
