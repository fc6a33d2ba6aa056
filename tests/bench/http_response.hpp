#pragma once
// An HTTP/1.1 response parser for the load generator: just enough to find where a response
// ends (Content-Length, chunked, or read-until-close) and its status, over a buffer that
// fills as bytes arrive. The responses measured are small, so it re-parses from the start on
// each call rather than keeping state.

#include <cctype>
#include <charconv>
#include <cstddef>
#include <string_view>

namespace vllmd::bench {

struct ParsedResponse {
  enum class State { kIncomplete, kComplete, kError } state = State::kIncomplete;
  int status = 0;
  std::size_t length = 0;    // bytes of the whole response, when complete
  bool close = false;        // the server closes the connection after this response
  bool until_close = false;  // no length: the body runs until the connection closes
};

namespace detail {

inline bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

inline std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

inline bool contains_token(std::string_view list, std::string_view token) {
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    if (iequals(trim(list.substr(0, comma)), token)) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

// Where the chunked body starting at `pos` ends (after the trailers), or npos when it is not
// all there yet; `error` is set when it is malformed.
inline std::size_t chunked_end(std::string_view data, std::size_t pos, bool& error) {
  for (;;) {
    const std::size_t line_end = data.find("\r\n", pos);
    if (line_end == std::string_view::npos) return std::string_view::npos;
    std::string_view size_text = data.substr(pos, line_end - pos);
    size_text = trim(size_text.substr(0, size_text.find(';')));  // chunk extensions
    std::size_t size = 0;
    const auto [end, ec] =
        std::from_chars(size_text.data(), size_text.data() + size_text.size(), size, 16);
    if (ec != std::errc() || end != size_text.data() + size_text.size() || size_text.empty()) {
      error = true;
      return std::string_view::npos;
    }
    pos = line_end + 2;
    if (size == 0) {
      // Trailer lines, then an empty line.
      for (;;) {
        const std::size_t trailer_end = data.find("\r\n", pos);
        if (trailer_end == std::string_view::npos) return std::string_view::npos;
        if (trailer_end == pos) return pos + 2;
        pos = trailer_end + 2;
      }
    }
    if (data.size() < pos + size + 2) return std::string_view::npos;
    if (data.substr(pos + size, 2) != "\r\n") {
      error = true;
      return std::string_view::npos;
    }
    pos += size + 2;
  }
}

}  // namespace detail

// Parses the response at the start of `data`. `eof`: the peer closed the connection, which
// completes a response delimited by the close.
inline ParsedResponse parse_response(std::string_view data, bool eof) {
  using detail::iequals;
  ParsedResponse result;
  const std::size_t head_end = data.find("\r\n\r\n");
  if (head_end == std::string_view::npos) {
    if (eof) result.state = ParsedResponse::State::kError;
    return result;
  }
  // Status line: HTTP/1.x SP 3DIGIT SP reason
  const std::size_t line_end = data.find("\r\n");
  const std::string_view status_line = data.substr(0, line_end);
  if (!status_line.starts_with("HTTP/1.") || status_line.size() < 12 || status_line[8] != ' ') {
    result.state = ParsedResponse::State::kError;
    return result;
  }
  const bool http10 = status_line[7] == '0';
  const auto [status_end, status_ec] =
      std::from_chars(status_line.data() + 9, status_line.data() + 12, result.status);
  if (status_ec != std::errc() || status_end != status_line.data() + 12) {
    result.state = ParsedResponse::State::kError;
    return result;
  }

  bool chunked = false;
  bool has_length = false;
  bool keep_alive = false;
  std::size_t content_length = 0;
  std::size_t pos = line_end + 2;
  while (pos < head_end) {
    const std::size_t end = data.find("\r\n", pos);
    const std::string_view line = data.substr(pos, end - pos);
    pos = end + 2;
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = detail::trim(line.substr(colon + 1));
    if (iequals(name, "content-length")) {
      const auto [end_ptr, ec] =
          std::from_chars(value.data(), value.data() + value.size(), content_length);
      if (ec != std::errc() || end_ptr != value.data() + value.size()) {
        result.state = ParsedResponse::State::kError;
        return result;
      }
      has_length = true;
    } else if (iequals(name, "transfer-encoding")) {
      chunked = detail::contains_token(value, "chunked");
    } else if (iequals(name, "connection")) {
      if (detail::contains_token(value, "close")) result.close = true;
      if (detail::contains_token(value, "keep-alive")) keep_alive = true;
    }
  }
  if (http10 && !keep_alive) result.close = true;

  const std::size_t body = head_end + 4;
  // No body by definition: 1xx, 204, 304 (this client never sends HEAD).
  const bool no_body = result.status < 200 || result.status == 204 || result.status == 304;
  if (no_body) {
    result.length = body;
  } else if (chunked) {
    bool error = false;
    const std::size_t end = detail::chunked_end(data, body, error);
    if (error) result.state = ParsedResponse::State::kError;
    if (error || end == std::string_view::npos) {
      if (eof) result.state = ParsedResponse::State::kError;
      return result;
    }
    result.length = end;
  } else if (has_length) {
    if (data.size() < body + content_length) {
      if (eof) result.state = ParsedResponse::State::kError;
      return result;
    }
    result.length = body + content_length;
  } else {
    result.until_close = true;
    result.close = true;
    if (!eof) return result;
    result.length = data.size();
  }
  result.state = ParsedResponse::State::kComplete;
  return result;
}

}  // namespace vllmd::bench
