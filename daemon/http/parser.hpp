#pragma once
// vllmd's HTTP/1.1 request parser (RFC 9112): the request line, the header fields and the
// body framing of every request, strict by design. Anything a second parser (a proxy in
// front of vllmd, a client library) could read differently is refused: several or invalid
// Content-Length values, Content-Length with Transfer-Encoding, a last transfer coding other
// than chunked, obs-fold, bare LF, NUL/CR in fields, versions other than 1.0 and 1.1.
// Nothing here touches a socket: bytes in, a parsed head or body bytes out (and fuzzed so).

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

namespace vllmd::daemon::http {

// Why a request cannot be served, as the status to answer with. The connection is closed
// after every one of these: its framing can no longer be trusted.
struct ParseError {
  int status = 400;  // 400, 413, 417, 431, 501 or 505
  std::string message;
};

struct Field {
  std::string_view name;
  std::string_view value;  // without surrounding whitespace
};

enum class BodyFraming { kNone, kLength, kChunked };

// The fields whose meaning the server needs, recognized once while parsing.
enum class KnownField {
  kHost,
  kContentLength,
  kTransferEncoding,
  kConnection,
  kExpect,
  kAuthorization,
  kCount
};

struct RequestHead {
  std::string_view method;
  std::string_view target;  // as sent: origin form ("/path?query") or absolute form
  int minor_version = 1;    // HTTP/1.<minor>
  std::vector<Field> fields;

  BodyFraming framing = BodyFraming::kNone;
  std::uint64_t content_length = 0;  // with kLength
  bool keep_alive = true;            // from the version and Connection
  bool expect_continue = false;      // Expect: 100-continue (HTTP/1.1)

  // The first value of a field (names compare case-insensitively), or empty.
  std::string_view field(std::string_view name) const;
  std::string_view field(KnownField name) const;
  // How many fields have this name.
  std::size_t count_named(std::string_view name) const;
  std::size_t count(KnownField name) const { return known_count[static_cast<std::size_t>(name)]; }

  // Per known field: how many, and the first one's index in `fields`.
  std::array<std::uint8_t, static_cast<std::size_t>(KnownField::kCount)> known_count{};
  std::array<std::uint8_t, static_cast<std::size_t>(KnownField::kCount)> known_first{};
  bool has_body() const { return framing != BodyFraming::kNone; }
};

// Where the head ends in `bytes`: the offset just past its blank line, or npos while it is
// incomplete. A bare-LF blank line counts too, so that such a request is refused rather than
// waited for. Empty lines before the request line (RFC 9112 section 2.2) are skipped.
// `from`: bytes before it were searched already (pass where the last search stopped).
std::size_t find_head_end(std::string_view bytes, std::size_t from = 0);

// Parses a complete head (as delimited by find_head_end). The views point into `head`.
tl::expected<RequestHead, ParseError> parse_head(std::string_view head);

// The chunked transfer coding, decoded incrementally: feed bytes as they arrive.
class ChunkedDecoder {
 public:
  enum class Status { kNeedMore, kDone, kError };

  // `max_body`: 413 once the decoded body would exceed it. `max_trailers`: bytes of trailer
  // fields accepted (431 beyond).
  ChunkedDecoder(std::uint64_t max_body, std::size_t max_trailers)
      : max_body_(max_body), max_trailers_(max_trailers) {}

  // Decodes from `in`, appending chunk data to `out`; `consumed` says how many bytes of `in`
  // were used (all of them unless the body ended inside `in`: the rest is the next request).
  Status feed(std::string_view in, std::size_t& consumed, std::string& out);
  const ParseError& error() const { return error_; }
  std::uint64_t decoded() const { return decoded_; }

 private:
  enum class State { kSize, kExtension, kSizeEnd, kData, kDataCr, kDataLf, kTrailer, kDone };
  Status fail(int status, std::string message);
  Status on_byte(char c);  // in any state but kData
  Status on_size_byte(char c);
  Status on_extension_byte(char c);
  Status on_size_line_end();
  Status on_data_end_byte(char c);
  Status on_trailer_byte(char c);
  Status on_trailer_line();
  std::size_t take_data(std::string_view in, std::string& out);  // bytes taken

  std::uint64_t max_body_;
  std::size_t max_trailers_;
  State state_ = State::kSize;
  std::uint64_t chunk_size_ = 0;
  int size_digits_ = 0;
  std::size_t extension_bytes_ = 0;
  std::uint64_t remaining_ = 0;  // of the current chunk's data
  std::uint64_t decoded_ = 0;
  std::string trailer_line_;
  std::size_t trailer_bytes_ = 0;
  ParseError error_;
  bool failed_ = false;
};

}  // namespace vllmd::daemon::http
