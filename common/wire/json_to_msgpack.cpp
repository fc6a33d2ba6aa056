#include "common/wire/json_to_msgpack.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define VLLMD_HAVE_AVX2_SCAN 1
#endif

#include "common/util/memory.hpp"

namespace vllmd::wire {

std::string_view kind_name(JsonKind kind) {
  switch (kind) {
    case JsonKind::kNull: return "null";
    case JsonKind::kBool: return "boolean";
    case JsonKind::kInteger: return "integer";
    case JsonKind::kFloat: return "number";
    case JsonKind::kString: return "string";
    case JsonKind::kArray: return "array";
    case JsonKind::kObject: return "object";
  }
  return "value";
}

std::string JsonError::describe() const { return message + " at byte " + std::to_string(offset); }

const TopLevelMember* Transcoded::find(std::string_view key) const {
  const TopLevelMember* found = nullptr;
  for (const TopLevelMember& member : members) {
    if (member.key == key) found = &member;
  }
  return found;
}

namespace {

// A container whose header outgrew the bytes placed for it when moving its body was not worth
// it: the final sweep inserts the missing bytes.
struct Deferred {
  std::size_t slot;   // where the header starts
  int placed;         // header bytes in the output now
  std::size_t count;  // elements, final
  bool map;
};

void store_be(char* out, std::uint64_t value, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    out[i] = static_cast<char>(value & 0xff);
    value >>= 8;
  }
}

// Writes a header (type byte + big-endian length) and returns its size.
int write_header(char* out, std::uint8_t type, std::uint64_t value, int bytes) {
  out[0] = static_cast<char>(type);
  store_be(out + 1, value, bytes);
  return 1 + bytes;
}

int str_header_size(std::size_t length) {
  if (length < 32) return 1;
  if (length < 0x100) return 2;
  if (length < 0x10000) return 3;
  return 5;
}

int write_str_header(char* out, std::size_t length) {
  if (length < 32) {
    out[0] = static_cast<char>(0xa0 | length);
    return 1;
  }
  if (length < 0x100) return write_header(out, 0xd9, length, 1);
  if (length < 0x10000) return write_header(out, 0xda, length, 2);
  return write_header(out, 0xdb, length, 4);
}

int container_header_size(std::size_t count) {
  if (count < 16) return 1;
  if (count < 0x10000) return 3;
  return 5;
}

int write_container_header(char* out, bool map, std::size_t count) {
  if (count < 16) {
    out[0] = static_cast<char>((map ? 0x80 : 0x90) | count);
    return 1;
  }
  if (count < 0x10000) return write_header(out, map ? 0xde : 0xdc, count, 2);
  return write_header(out, map ? 0xdf : 0xdd, count, 4);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Length of the valid UTF-8 sequence starting at s (first byte >= 0x80), or 0.
std::size_t utf8_sequence(const unsigned char* s, const unsigned char* end) {
  auto cont = [&](std::size_t i, unsigned char lo = 0x80, unsigned char hi = 0xbf) {
    return s + i < end && s[i] >= lo && s[i] <= hi;
  };
  const unsigned char c = s[0];
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c == 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
  if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
  if (c == 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xf1 && c <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

// String scanning: skip_plain(s, end) returns the first byte at or after s that needs a look
// (a quote, a backslash, a control byte or a byte >= 0x80), or, when none is found, the point
// where fewer than 16 bytes are left; the caller goes on byte by byte from there.
#if defined(__SSE2__)
// Bit i set when byte i of the 16 at s needs a look. The compare is signed: bytes >= 0x80 are
// negative, so they stop the scan like control bytes.
unsigned special_mask16(const char* s) {
  const __m128i chunk = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(chunk, _mm_set1_epi8('"')),
                                                    _mm_cmpeq_epi8(chunk, _mm_set1_epi8('\\'))),
                                       _mm_cmplt_epi8(chunk, _mm_set1_epi8(0x20)));
  return static_cast<unsigned>(_mm_movemask_epi8(special));
}

const char* skip_plain_sse2(const char* s, const char* end) {
  while (end - s >= 16) {
    const unsigned mask = special_mask16(s);
    if (mask != 0) return s + __builtin_ctz(mask);
    s += 16;
  }
  return s;
}
#else
const char* skip_plain_sse2(const char* s, const char*) { return s; }
#endif

#if defined(VLLMD_HAVE_AVX2_SCAN)
// The same 32 bytes at a time; chosen at run time, so the binary still runs without AVX2.
__attribute__((target("avx2"))) const char* skip_plain_avx2(const char* s, const char* end) {
  const __m256i quote = _mm256_set1_epi8('"');
  const __m256i backslash = _mm256_set1_epi8('\\');
  const __m256i control = _mm256_set1_epi8(0x20);
  while (end - s >= 32) {
    const __m256i chunk = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i special = _mm256_or_si256(
        _mm256_or_si256(_mm256_cmpeq_epi8(chunk, quote), _mm256_cmpeq_epi8(chunk, backslash)),
        _mm256_cmpgt_epi8(control, chunk));
    const auto mask = static_cast<unsigned>(_mm256_movemask_epi8(special));
    if (mask != 0) return s + __builtin_ctz(mask);
    s += 32;
  }
  return skip_plain_sse2(s, end);
}
#endif

using SkipPlain = const char* (*)(const char*, const char*);

SkipPlain pick_skip_plain() {
#if defined(VLLMD_HAVE_AVX2_SCAN)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return skip_plain_avx2;
#endif
  return skip_plain_sse2;
}

const char* skip_plain(const char* s, const char* end) {
#if defined(__SSE2__)
  // Keys and short values mostly end within 16 bytes: no indirect call for them.
  if (end - s >= 16) {
    const unsigned mask = special_mask16(s);
    if (mask != 0) return s + __builtin_ctz(mask);
    s += 16;
  }
#endif
  static const SkipPlain kWidest = pick_skip_plain();
  return kWidest(s, end);
}

char* put_utf8(char* out, std::uint32_t code) {
  if (code < 0x80) {
    *out++ = static_cast<char>(code);
  } else if (code < 0x800) {
    *out++ = static_cast<char>(0xc0 | (code >> 6));
    *out++ = static_cast<char>(0x80 | (code & 0x3f));
  } else if (code < 0x10000) {
    *out++ = static_cast<char>(0xe0 | (code >> 12));
    *out++ = static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    *out++ = static_cast<char>(0x80 | (code & 0x3f));
  } else {
    *out++ = static_cast<char>(0xf0 | (code >> 18));
    *out++ = static_cast<char>(0x80 | ((code >> 12) & 0x3f));
    *out++ = static_cast<char>(0x80 | ((code >> 6) & 0x3f));
    *out++ = static_cast<char>(0x80 | (code & 0x3f));
  }
  return out;
}

class Transcoder {
 public:
  Transcoder(std::string_view json, const TranscodeLimits& limits, Transcoded& result)
      : begin_(json.data()), p_(json.data()), end_(json.data() + json.size()), limits_(limits),
        result_(result), out_(result.msgpack) {}

  void run() {
    // Typical bodies are mostly long strings, whose msgpack is no longer than their JSON.
    const std::size_t capacity = static_cast<std::size_t>(end_ - begin_) + 64;
    out_.reserve(capacity);
    util::advise_huge_pages(out_.data(), capacity);
    move_budget_ = capacity / 8 + (64 << 10);
    skip_whitespace();
    if (p_ == end_) fail("Expecting value: empty body");
    result_.root = parse_value(1);
    skip_whitespace();
    if (p_ != end_) fail("Extra data after the JSON value");
    insert_deferred();
  }

 private:
  [[noreturn]] void fail(const char* message) const { fail_at(p_, message); }
  [[noreturn]] void fail_at(const char* where, const char* message) const {
    throw JsonError{static_cast<std::size_t>(where - begin_), message};
  }

  void skip_whitespace() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  JsonKind parse_value(std::size_t depth) {
    if (p_ == end_) fail("Expecting value");
    switch (*p_) {
      case '{': return parse_container(depth, true);
      case '[': return parse_container(depth, false);
      case '"': parse_string(); return JsonKind::kString;
      case 't': parse_literal("true", '\xc3'); return JsonKind::kBool;
      case 'f': parse_literal("false", '\xc2'); return JsonKind::kBool;
      case 'n': parse_literal("null", '\xc0'); return JsonKind::kNull;
      default:
        if (*p_ == '-' || is_digit(*p_)) return parse_number();
        fail("Expecting value");
    }
  }

  void parse_literal(std::string_view word, char encoded) {
    if (static_cast<std::size_t>(end_ - p_) < word.size() ||
        std::memcmp(p_, word.data(), word.size()) != 0) {
      fail("Expecting value");
    }
    p_ += word.size();
    out_.push_back(encoded);
  }

  JsonKind parse_container(std::size_t depth, bool is_object) {
    if (depth > limits_.max_depth) fail("Nesting too deep");
    // The header is placed at its narrowest (1 byte) and widened as the count crosses 16 and
    // 65536, when moving the body is cheap (see widen): no sweep over the output is needed.
    const std::size_t slot = out_.size();
    out_.push_back('\0');
    int placed = 1;

    std::size_t count = 0;
    bool all_objects = true;
    ++p_;
    skip_whitespace();
    if (p_ != end_ && *p_ == (is_object ? '}' : ']')) {
      ++p_;
    } else {
      do {
        if (count == 15 || count == 0xffff) placed = widen(slot, placed, depth == 1 && is_object);
        TopLevelMember* member = is_object ? parse_key(depth) : nullptr;
        const JsonKind kind = parse_element(depth, member);
        all_objects = all_objects && kind == JsonKind::kObject;
        ++count;
      } while (another_element(is_object));
    }
    place_header(slot, placed, count, is_object);
    last_array_all_objects_ = !is_object && all_objects;
    return is_object ? JsonKind::kObject : JsonKind::kArray;
  }

  // An object member's key and its ':'; the member to record when at the top level.
  TopLevelMember* parse_key(std::size_t depth) {
    if (p_ == end_ || *p_ != '"') fail("Expecting property name enclosed in double quotes");
    const std::size_t key_begin = out_.size();
    parse_string();
    TopLevelMember* member = depth == 1 ? &record_member(key_begin) : nullptr;
    skip_whitespace();
    if (p_ == end_ || *p_ != ':') fail("Expecting ':' delimiter");
    ++p_;
    skip_whitespace();
    return member;
  }

  // An array element or member value; a top-level member learns where it lies.
  JsonKind parse_element(std::size_t depth, TopLevelMember* member) {
    const std::size_t value_begin = out_.size();
    const JsonKind kind = parse_value(depth + 1);
    if (member != nullptr) {
      member->kind = kind;
      member->begin = value_begin;
      member->end = out_.size();
      member->all_elements_objects = kind == JsonKind::kArray && last_array_all_objects_;
    }
    return kind;
  }

  // After an element: true past a ',', false past the closing bracket.
  bool another_element(bool is_object) {
    skip_whitespace();
    const char* expected =
        is_object ? "Expecting ',' delimiter or '}'" : "Expecting ',' delimiter or ']'";
    if (p_ == end_) fail(expected);
    if (*p_ == ',') {
      ++p_;
      skip_whitespace();
      return true;
    }
    if (*p_ == (is_object ? '}' : ']')) {
      ++p_;
      return false;
    }
    fail(expected);
  }

  // Writes the container's header now when the bytes placed fit it, or defers it.
  void place_header(std::size_t slot, int placed, std::size_t count, bool is_object) {
    if (count > std::numeric_limits<std::uint32_t>::max()) fail("Container too large");
    if (placed == container_header_size(count)) {
      write_container_header(out_.data() + slot, is_object, count);
    } else {
      deferred_.push_back({slot, placed, count, is_object});
    }
  }

  // Makes room for a header 2 bytes wider by moving the body so far (the first 15 or 65535
  // elements) right; returns the header bytes now placed. A global budget bounds the bytes moved
  // (nesting could otherwise move the same bytes once per level): past it, and from then on,
  // widening is left to insert_deferred, so no body holding a deferred header ever moves.
  int widen(std::size_t slot, int placed, bool top_level) {
    const std::size_t body = slot + static_cast<std::size_t>(placed);
    const std::size_t length = out_.size() - body;
    if (!deferring_ && length <= move_budget_) {
      move_budget_ -= length;
      char* data = out_.grow(2) - out_.size();
      std::memmove(data + body + 2, data + body, length);
      out_.resize(out_.size() + 2);
      if (top_level) {
        for (TopLevelMember& member : result_.members) {
          member.begin += 2;
          member.end += 2;
        }
      }
      return placed + 2;
    }
    deferring_ = true;
    return placed;
  }

  TopLevelMember& record_member(std::size_t key_begin) {
    TopLevelMember& member = result_.members.emplace_back();
    const char* key = out_.data() + key_begin;
    const auto type = static_cast<unsigned char>(*key);
    std::size_t header = 1;
    if (type == 0xd9) header = 2;
    if (type == 0xda) header = 3;
    if (type == 0xdb) header = 5;
    member.key.assign(key + header, out_.size() - key_begin - header);
    return member;
  }

  // Finds the closing quote; notes escapes and validates UTF-8 on the way.
  const char* scan_string(bool& escaped) {
    const char* s = p_;
    for (;;) {
      s = skip_plain(s, end_);
      if (s == end_) fail_at(p_ - 1, "Unterminated string starting");
      const auto c = static_cast<unsigned char>(*s);
      if (c == '"') return s;
      if (c == '\\') {
        escaped = true;
        if (end_ - s < 2) fail_at(p_ - 1, "Unterminated string starting");
        s += 2;
      } else if (c < 0x20) {
        fail_at(s, "Invalid control character in string");
      } else if (c >= 0x80) {
        const std::size_t length = utf8_sequence(reinterpret_cast<const unsigned char*>(s),
                                                 reinterpret_cast<const unsigned char*>(end_));
        if (length == 0) fail_at(s, "Invalid UTF-8 in string");
        s += length;
      } else {
        ++s;
      }
    }
  }

  void parse_string() {
    ++p_;  // opening quote
    bool escaped = false;
    const char* close = scan_string(escaped);
    const auto raw = static_cast<std::size_t>(close - p_);
    if (!escaped) {
      char* out = out_.grow(5 + raw);
      const int header = write_str_header(out, raw);
      std::memcpy(out + header, p_, raw);
      out_.resize(out_.size() + header + raw);
    } else {
      // The decoded text is no longer than the raw span: reserve that header, shrink after.
      const int reserved = str_header_size(raw);
      char* start = out_.grow(reserved + raw);
      char* body = start + reserved;
      const std::size_t length = static_cast<std::size_t>(unescape(p_, close, body) - body);
      const int header = str_header_size(length);
      if (header != reserved) std::memmove(start + header, body, length);
      write_str_header(start, length);
      out_.resize(out_.size() + header + length);
    }
    p_ = close + 1;
  }

  std::uint32_t read_hex4(const char* s) const {
    if (end_ - s < 4) fail_at(s, "Invalid \\uXXXX escape");
    std::uint32_t code = 0;
    for (int i = 0; i < 4; ++i) {
      const int digit = hex_value(s[i]);
      if (digit < 0) fail_at(s, "Invalid \\uXXXX escape");
      code = (code << 4) | static_cast<std::uint32_t>(digit);
    }
    return code;
  }

  char* unescape(const char* s, const char* close, char* out) const {
    while (s < close) {
      if (*s != '\\') {
        *out++ = *s++;
        continue;
      }
      const char* escape = s;
      ++s;
      switch (*s++) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '/': *out++ = '/'; break;
        case 'b': *out++ = '\b'; break;
        case 'f': *out++ = '\f'; break;
        case 'n': *out++ = '\n'; break;
        case 'r': *out++ = '\r'; break;
        case 't': *out++ = '\t'; break;
        case 'u': {
          std::uint32_t code = read_hex4(s);
          s += 4;
          if (code >= 0xdc00 && code <= 0xdfff) fail_at(escape, "Lone surrogate in \\u escape");
          if (code >= 0xd800 && code <= 0xdbff) {
            if (close - s < 6 || s[0] != '\\' || s[1] != 'u') {
              fail_at(escape, "Lone surrogate in \\u escape");
            }
            const std::uint32_t low = read_hex4(s + 2);
            if (low < 0xdc00 || low > 0xdfff) fail_at(escape, "Lone surrogate in \\u escape");
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
            s += 6;
          }
          out = put_utf8(out, code);
          break;
        }
        default: fail_at(escape, "Invalid \\escape");
      }
    }
    return out;
  }

  JsonKind parse_number() {
    const char* start = p_;
    const bool negative = *p_ == '-';
    if (negative) ++p_;
    const char* digits = p_;
    scan_integer_part(start);
    const char* digits_end = p_;
    if (scan_fraction_and_exponent(start)) {
      write_float(parse_float(start));
      return JsonKind::kFloat;
    }
    write_integer(start, negative, integer_magnitude(start, digits, digits_end));
    return JsonKind::kInteger;
  }

  // The digits before any '.' or exponent: a lone 0 or no leading zero.
  void scan_integer_part(const char* start) {
    if (p_ == end_ || !is_digit(*p_)) fail_at(start, "Invalid number");
    if (*p_ == '0') {
      ++p_;
      if (p_ != end_ && is_digit(*p_)) fail_at(start, "Invalid number: leading zero");
    } else {
      while (p_ != end_ && is_digit(*p_)) ++p_;
    }
  }

  // The fraction and the exponent, each optional; true when there was either.
  bool scan_fraction_and_exponent(const char* start) {
    bool is_float = false;
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      if (p_ == end_ || !is_digit(*p_)) fail_at(start, "Invalid number: no digit after '.'");
      while (p_ != end_ && is_digit(*p_)) ++p_;
      is_float = true;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !is_digit(*p_)) fail_at(start, "Invalid number: no digit in exponent");
      while (p_ != end_ && is_digit(*p_)) ++p_;
      is_float = true;
    }
    return is_float;
  }

  double parse_float(const char* start) const {
    double value = 0;
    const auto [where, error] = std::from_chars(start, p_, value);
    if (error == std::errc::result_out_of_range) {
      // Underflow rounds to (signed) zero, as Python's json does; overflow is refused.
      value = std::strtod(std::string(start, p_).c_str(), nullptr);
      if (std::isinf(value)) fail_at(start, "Number out of float64 range");
    } else if (error != std::errc() || where != p_) {
      fail_at(start, "Invalid number");
    }
    return value;
  }

  void write_float(double value) {
    char* out = out_.grow(9);
    std::uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    write_header(out, 0xcb, bits, 8);
    out_.resize(out_.size() + 9);
  }

  std::uint64_t integer_magnitude(const char* start, const char* digits,
                                  const char* digits_end) const {
    std::uint64_t magnitude = 0;
    for (const char* d = digits; d != digits_end; ++d) {
      const auto digit = static_cast<std::uint64_t>(*d - '0');
      if (magnitude > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) {
        fail_at(start, "Integer out of 64-bit range");
      }
      magnitude = magnitude * 10 + digit;
    }
    return magnitude;
  }

  // The integer in msgpack's narrowest form: a fixint, or uint/int 8 to 64.
  void write_integer(const char* start, bool negative, std::uint64_t magnitude) {
    if (negative && magnitude > (1ULL << 63)) fail_at(start, "Integer out of 64-bit range");
    char* out = out_.grow(9);
    const int size = negative && magnitude != 0 ? write_negative(out, magnitude)
                                                : write_non_negative(out, magnitude);
    out_.resize(out_.size() + size);
  }

  static int write_non_negative(char* out, std::uint64_t magnitude) {
    if (magnitude < 0x80) {
      out[0] = static_cast<char>(magnitude);
      return 1;
    }
    if (magnitude < 0x100) return write_header(out, 0xcc, magnitude, 1);
    if (magnitude < 0x10000) return write_header(out, 0xcd, magnitude, 2);
    if (magnitude < 0x100000000ULL) return write_header(out, 0xce, magnitude, 4);
    return write_header(out, 0xcf, magnitude, 8);
  }

  static int write_negative(char* out, std::uint64_t magnitude) {
    const std::uint64_t bits = ~magnitude + 1;  // two's complement of -magnitude
    if (magnitude <= 32) {
      out[0] = static_cast<char>(bits & 0xff);
      return 1;
    }
    if (magnitude <= 0x80) return write_header(out, 0xd0, bits & 0xff, 1);
    if (magnitude <= 0x8000) return write_header(out, 0xd1, bits & 0xffff, 2);
    if (magnitude <= 0x80000000ULL) return write_header(out, 0xd2, bits & 0xffffffffULL, 4);
    return write_header(out, 0xd3, bits, 8);
  }

  // Writes the deferred headers, moving what follows each one right by the bytes it lacks, in
  // one sweep from the end; remaps the top-level offsets. Usually there is nothing to do.
  void insert_deferred() {
    if (deferred_.empty()) return;
    std::sort(deferred_.begin(), deferred_.end(),
              [](const Deferred& a, const Deferred& b) { return a.slot < b.slot; });
    std::size_t shift = 0;  // bytes inserted before the current position
    for (const Deferred& header : deferred_) {
      shift += static_cast<std::size_t>(container_header_size(header.count) - header.placed);
    }
    remap_members();
    const std::size_t old_size = out_.size();
    out_.resize(old_size + shift);
    char* data = out_.data();
    std::size_t end = old_size;
    for (auto it = deferred_.rbegin(); it != deferred_.rend(); ++it) {
      const std::size_t body = it->slot + static_cast<std::size_t>(it->placed);
      std::memmove(data + body + shift, data + body, end - body);
      shift -= static_cast<std::size_t>(container_header_size(it->count) - it->placed);
      write_container_header(data + it->slot + shift, it->map, it->count);
      end = it->slot;
    }
  }

  // A position moves right by the bytes inserted before it (deferred_ sorted by slot).
  void remap_members() {
    std::size_t next = 0;
    std::size_t shift = 0;
    auto remap = [&](std::size_t& position) {
      const std::size_t old = position;
      while (next < deferred_.size() && deferred_[next].slot < old) {
        shift += static_cast<std::size_t>(container_header_size(deferred_[next].count) -
                                          deferred_[next].placed);
        ++next;
      }
      position = old + shift;
    };
    for (TopLevelMember& member : result_.members) {
      remap(member.begin);
      remap(member.end);
    }
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  const TranscodeLimits& limits_;
  Transcoded& result_;
  util::Buffer& out_;
  std::vector<Deferred> deferred_;
  std::size_t move_budget_ = 0;
  bool deferring_ = false;
  bool last_array_all_objects_ = false;
};

}  // namespace

tl::expected<Transcoded, JsonError> json_to_msgpack(std::string_view json,
                                                    const TranscodeLimits& limits) {
  Transcoded result;
  try {
    Transcoder(json, limits, result).run();
  } catch (JsonError& error) {
    return tl::unexpected(std::move(error));
  }
  return result;
}

}  // namespace vllmd::wire
