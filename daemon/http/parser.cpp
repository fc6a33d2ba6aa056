#include "daemon/http/parser.hpp"

#include <algorithm>
#include <array>
#include <optional>

#include "common/util/text.hpp"

namespace vllmd::daemon::http {

namespace {

constexpr std::size_t kMaxFields = 100;

// tchar (RFC 9110 section 5.6.2): the characters of methods, field names and codings.
constexpr std::array<bool, 256> kTokenChars = [] {
  std::array<bool, 256> table{};
  for (int c = '0'; c <= '9'; ++c) table[c] = true;
  for (int c = 'a'; c <= 'z'; ++c) table[c] = true;
  for (int c = 'A'; c <= 'Z'; ++c) table[c] = true;
  for (const char c : std::string_view("!#$%&'*+-.^_`|~"))
    table[static_cast<unsigned char>(c)] = true;
  return table;
}();

bool is_token(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return kTokenChars[static_cast<unsigned char>(c)];
  });
}

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool same_text(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return lower(x) == lower(y); });
}

bool starts_with_text(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && same_text(text.substr(0, prefix.size()), prefix);
}

// Which known field a name is, if any: by length first, so most names cost one compare.
std::optional<KnownField> classify(std::string_view name) {
  switch (name.size()) {
    case 4: return same_text(name, "host") ? std::optional(KnownField::kHost) : std::nullopt;
    case 6: return same_text(name, "expect") ? std::optional(KnownField::kExpect) : std::nullopt;
    case 10:
      return same_text(name, "connection") ? std::optional(KnownField::kConnection) : std::nullopt;
    case 13:
      return same_text(name, "authorization") ? std::optional(KnownField::kAuthorization)
                                              : std::nullopt;
    case 14:
      return same_text(name, "content-length") ? std::optional(KnownField::kContentLength)
                                               : std::nullopt;
    case 17:
      return same_text(name, "transfer-encoding") ? std::optional(KnownField::kTransferEncoding)
                                                  : std::nullopt;
    default: return std::nullopt;
  }
}

tl::unexpected<ParseError> refuse(int status, std::string message) {
  return tl::unexpected(ParseError{status, std::move(message)});
}

// A field value may hold visible bytes, spaces, tabs and obs-text, never NUL, CR, LF or
// other controls: those are how fields get split differently by different parsers.
constexpr std::array<bool, 256> kValueChars = [] {
  std::array<bool, 256> table{};
  for (int c = 0x20; c < 0x100; ++c) table[c] = c != 0x7f;
  table['\t'] = true;
  return table;
}();

bool is_field_value(std::string_view value) {
  for (const char c : value) {
    if (!kValueChars[static_cast<unsigned char>(c)]) return false;
  }
  return true;
}

// One field line without its CRLF: name ":" OWS value OWS.
tl::expected<Field, ParseError> parse_field(std::string_view line) {
  if (line.front() == ' ' || line.front() == '\t') {
    return refuse(400, "a header line starts with whitespace (obs-fold is not accepted)");
  }
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return refuse(400, "a header line has no colon");
  const std::string_view name = line.substr(0, colon);
  if (!is_token(name)) {
    return refuse(400,
                  "a header name is empty or holds a character not allowed there "
                  "(whitespace before the colon, a control byte, ...)");
  }
  const std::string_view value = util::trim_blanks(line.substr(colon + 1));
  if (!is_field_value(value)) {
    return refuse(400, "header " + std::string(name) + " holds a control byte");
  }
  return Field{name, value};
}

std::size_t skip_empty_lines(std::string_view bytes) {
  std::size_t start = 0;
  while (bytes.substr(start, 2) == "\r\n") start += 2;
  return start;
}

tl::expected<void, ParseError> parse_request_line(std::string_view line, RequestHead& head) {
  const std::size_t first = line.find(' ');
  const std::size_t second = first == std::string_view::npos ? first : line.find(' ', first + 1);
  if (second == std::string_view::npos) return refuse(400, "malformed request line");
  head.method = line.substr(0, first);
  head.target = line.substr(first + 1, second - first - 1);
  const std::string_view version = line.substr(second + 1);
  if (!is_token(head.method)) return refuse(400, "malformed request method");
  const bool visible = std::all_of(head.target.begin(), head.target.end(),
                                   [](char c) { return c > ' ' && c < 0x7f; });
  if (head.target.empty() || !visible) return refuse(400, "malformed request target");
  if (head.target.front() != '/' && !starts_with_text(head.target, "http://") &&
      !starts_with_text(head.target, "https://")) {
    return refuse(400, "the request target must be a path (or an absolute http URL)");
  }
  const bool digits = version.size() == 8 && version.substr(0, 5) == "HTTP/" && version[5] >= '0' &&
                      version[5] <= '9' && version[6] == '.' && version[7] >= '0' &&
                      version[7] <= '9';
  if (!digits) return refuse(400, "malformed HTTP version");
  if (version[5] != '1' || version[7] > '1') {
    return refuse(505,
                  std::string(version) + " is not supported: vllmd speaks HTTP/1.1 and HTTP/1.0");
  }
  head.minor_version = version[7] - '0';
  return {};
}

tl::expected<void, ParseError> parse_content_length(RequestHead& head) {
  const std::size_t lengths = head.count(KnownField::kContentLength);
  if (lengths == 0) return {};
  if (lengths > 1) return refuse(400, "several Content-Length headers");
  const std::string_view text = head.field(KnownField::kContentLength);
  const bool digits =
      !text.empty() && text.size() <= 18 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) return refuse(400, "Content-Length '" + std::string(text) + "' is not a length");
  std::uint64_t length = 0;
  for (const char c : text) length = length * 10 + static_cast<std::uint64_t>(c - '0');
  head.content_length = length;
  head.framing = length > 0 ? BodyFraming::kLength : BodyFraming::kNone;
  return {};
}

tl::expected<void, ParseError> parse_transfer_encoding(RequestHead& head) {
  if (head.count(KnownField::kTransferEncoding) == 0) return {};
  std::vector<std::string_view> codings;
  for (const Field& field : head.fields) {
    if (!same_text(field.name, "transfer-encoding")) continue;
    for (const std::string_view coding : util::split_list(field.value)) codings.push_back(coding);
  }
  if (head.count(KnownField::kContentLength) > 0) {
    return refuse(400, "Content-Length together with Transfer-Encoding");
  }
  if (head.minor_version == 0) return refuse(400, "Transfer-Encoding in an HTTP/1.0 request");
  if (codings.empty() || !same_text(codings.back(), "chunked")) {
    return refuse(400, "the last transfer coding must be chunked");
  }
  for (std::size_t i = 0; i + 1 < codings.size(); ++i) {
    if (same_text(codings[i], "chunked")) return refuse(400, "chunked applied more than once");
    return refuse(501, "transfer coding '" + std::string(codings[i]) + "' is not supported");
  }
  head.framing = BodyFraming::kChunked;
  return {};
}

tl::expected<void, ParseError> parse_connection_facts(RequestHead& head) {
  const std::size_t hosts = head.count(KnownField::kHost);
  if (hosts > 1) return refuse(400, "several Host headers");
  if (hosts == 0 && head.minor_version == 1) return refuse(400, "HTTP/1.1 request without Host");
  head.keep_alive = head.minor_version == 1;
  if (head.count(KnownField::kConnection) == 0) return {};
  for (const Field& field : head.fields) {
    if (!same_text(field.name, "connection")) continue;
    for (const std::string_view option : util::split_list(field.value)) {
      if (same_text(option, "close")) {
        head.keep_alive = false;
        return {};  // close wins
      }
      if (same_text(option, "keep-alive")) head.keep_alive = true;
    }
  }
  return {};
}

tl::expected<void, ParseError> parse_expect(RequestHead& head) {
  if (head.count(KnownField::kExpect) == 0) return {};
  const std::string_view expectation = head.field(KnownField::kExpect);
  if (head.count(KnownField::kExpect) > 1 || !same_text(expectation, "100-continue")) {
    return refuse(417, "Expect: " + std::string(expectation) + " is not supported");
  }
  head.expect_continue = head.minor_version == 1;
  return {};
}

}  // namespace

std::string_view RequestHead::field(std::string_view name) const {
  for (const Field& entry : fields) {
    if (same_text(entry.name, name)) return entry.value;
  }
  return {};
}

std::size_t RequestHead::count_named(std::string_view name) const {
  return static_cast<std::size_t>(
      std::count_if(fields.begin(), fields.end(),
                    [&](const Field& entry) { return same_text(entry.name, name); }));
}

std::string_view RequestHead::field(KnownField name) const {
  const auto index = static_cast<std::size_t>(name);
  return known_count[index] == 0 ? std::string_view() : fields[known_first[index]].value;
}

std::size_t find_head_end(std::string_view bytes, std::size_t from) {
  const std::size_t start = std::max(skip_empty_lines(bytes), from);
  for (std::size_t lf = bytes.find('\n', start); lf != std::string_view::npos;
       lf = bytes.find('\n', lf + 1)) {
    if (lf + 1 < bytes.size() && bytes[lf + 1] == '\n') return lf + 2;
    if (lf + 2 < bytes.size() && bytes[lf + 1] == '\r' && bytes[lf + 2] == '\n') return lf + 3;
  }
  return std::string_view::npos;
}

tl::expected<RequestHead, ParseError> parse_head(std::string_view head) {
  RequestHead parsed;
  parsed.fields.reserve(16);
  std::size_t at = skip_empty_lines(head);
  bool request_line = true;
  for (;;) {
    const std::size_t lf = head.find('\n', at);
    if (lf == std::string_view::npos) return refuse(400, "incomplete request head");
    if (lf == at || head[lf - 1] != '\r') return refuse(400, "a line ends in a bare LF");
    const std::string_view line = head.substr(at, lf - 1 - at);
    at = lf + 1;
    if (request_line) {
      if (auto ok = parse_request_line(line, parsed); !ok) return tl::unexpected(ok.error());
      request_line = false;
      continue;
    }
    if (line.empty()) break;
    auto field = parse_field(line);  // a bare CR is a control byte: refused there
    if (!field) return tl::unexpected(field.error());
    if (parsed.fields.size() == kMaxFields) {
      return refuse(431, "more than " + std::to_string(kMaxFields) + " header fields");
    }
    if (const auto known = classify(field->name)) {
      const auto index = static_cast<std::size_t>(*known);
      if (parsed.known_count[index]++ == 0) {
        parsed.known_first[index] = static_cast<std::uint8_t>(parsed.fields.size());
      }
    }
    parsed.fields.push_back(*field);
  }
  for (auto step :
       {parse_connection_facts, parse_content_length, parse_transfer_encoding, parse_expect}) {
    if (auto ok = step(parsed); !ok) return tl::unexpected(ok.error());
  }
  return parsed;
}

// ---------------------------------------------------------------------------------------------

ChunkedDecoder::Status ChunkedDecoder::fail(int status, std::string message) {
  error_ = ParseError{status, std::move(message)};
  state_ = State::kDone;
  failed_ = true;
  return Status::kError;
}

ChunkedDecoder::Status ChunkedDecoder::on_size_line_end() {
  if (chunk_size_ == 0) {
    state_ = State::kTrailer;
    return Status::kNeedMore;
  }
  if (chunk_size_ > max_body_ - decoded_) {
    return fail(413, "request body exceeds the limit of " + std::to_string(max_body_) + " bytes");
  }
  remaining_ = chunk_size_;
  chunk_size_ = 0;
  size_digits_ = 0;
  extension_bytes_ = 0;
  state_ = State::kData;
  return Status::kNeedMore;
}

ChunkedDecoder::Status ChunkedDecoder::on_trailer_line() {
  if (trailer_line_.empty() || trailer_line_.back() != '\r') {
    return fail(400, "a trailer line ends in a bare LF");
  }
  trailer_line_.pop_back();
  if (trailer_line_.empty()) {
    state_ = State::kDone;
    return Status::kDone;
  }
  if (trailer_line_.find('\r') != std::string::npos)
    return fail(400, "a trailer line holds a bare CR");
  if (auto field = parse_field(trailer_line_); !field) {
    return fail(field.error().status, field.error().message);
  }
  trailer_line_.clear();
  return Status::kNeedMore;
}

ChunkedDecoder::Status ChunkedDecoder::on_size_byte(char c) {
  const int digit = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
  if (digit >= 0) {
    if (++size_digits_ > 16) return fail(400, "chunk size has more than 16 hex digits");
    chunk_size_ = chunk_size_ * 16 + static_cast<std::uint64_t>(digit);
  } else if (size_digits_ == 0) {
    return fail(400, "chunk size is not a hexadecimal number");
  } else if (c == ';' || c == ' ' || c == '\t') {
    state_ = State::kExtension;
  } else if (c == '\r') {
    state_ = State::kSizeEnd;
  } else {
    return fail(400, "malformed chunk size");
  }
  return Status::kNeedMore;
}

ChunkedDecoder::Status ChunkedDecoder::on_extension_byte(char c) {
  if (c == '\r') {
    state_ = State::kSizeEnd;
  } else if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
    return fail(400, "a chunk extension holds a control byte");
  } else if (++extension_bytes_ > 4096) {
    return fail(400, "chunk extension longer than 4096 bytes");
  }
  return Status::kNeedMore;
}

// The CRLF after a chunk's data.
ChunkedDecoder::Status ChunkedDecoder::on_data_end_byte(char c) {
  if (c != (state_ == State::kDataCr ? '\r' : '\n')) {
    return fail(400, "chunk data longer than its declared size");
  }
  state_ = state_ == State::kDataCr ? State::kDataLf : State::kSize;
  return Status::kNeedMore;
}

ChunkedDecoder::Status ChunkedDecoder::on_trailer_byte(char c) {
  if (c == '\n') return on_trailer_line();
  if (++trailer_bytes_ > max_trailers_) {
    return fail(431, "trailer fields longer than " + std::to_string(max_trailers_) + " bytes");
  }
  trailer_line_.push_back(c);
  return Status::kNeedMore;
}

ChunkedDecoder::Status ChunkedDecoder::on_byte(char c) {
  switch (state_) {
    case State::kSize: return on_size_byte(c);
    case State::kExtension: return on_extension_byte(c);
    case State::kSizeEnd:
      if (c != '\n') return fail(400, "a chunk size line does not end in CRLF");
      return on_size_line_end();
    case State::kDataCr:
    case State::kDataLf: return on_data_end_byte(c);
    case State::kTrailer: return on_trailer_byte(c);
    case State::kData:
    case State::kDone: break;
  }
  return Status::kNeedMore;
}

std::size_t ChunkedDecoder::take_data(std::string_view in, std::string& out) {
  const auto take = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, in.size()));
  out.append(in.data(), take);
  remaining_ -= take;
  decoded_ += take;
  if (remaining_ == 0) state_ = State::kDataCr;
  return take;
}

ChunkedDecoder::Status ChunkedDecoder::feed(std::string_view in, std::size_t& consumed,
                                            std::string& out) {
  consumed = 0;
  if (failed_) return Status::kError;
  std::size_t i = 0;
  while (i < in.size() && state_ != State::kDone) {
    if (state_ == State::kData) {
      i += take_data(in.substr(i), out);
      continue;
    }
    if (on_byte(in[i++]) == Status::kError) return Status::kError;
  }
  consumed = i;
  return state_ == State::kDone ? Status::kDone : Status::kNeedMore;
}

}  // namespace vllmd::daemon::http
