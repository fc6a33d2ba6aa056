#pragma once
// A forward reader over msgpack bytes, for the one message that is too hot to decode into
// msgpack-c's object tree: an engine step's outputs, thousands of requests in one frame, every
// few milliseconds. It reads values in place, builds nothing, and holds to the same bounds as
// `decode` (DecodeLimits): every value it passes over, skipped ones too, is checked to be
// well-formed msgpack.
//
// Each typed read consumes the next value when it has that type and leaves it otherwise, so a
// caller can try one reading, then another; a read with no bytes left fails (callers read what
// a count announced, so the frame was cut short). Once the bytes are found malformed (cut short, a
// reserved byte, a size past a limit) the reader fails for good and says why in error().

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/wire/msgpack_codec.hpp"

namespace vllmd::wire {

// The integer at `at`, already read once by MsgpackReader::int64 (so known to fit), and `at`
// moved past it.
std::int64_t read_checked_int(const char*& at);

class MsgpackReader {
 public:
  explicit MsgpackReader(std::string_view bytes, const DecodeLimits& limits = {})
      : at_(bytes.data()), end_(bytes.data() + bytes.size()), limits_(limits) {}

  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  // Every byte read, and nothing failed.
  bool done() const { return at_ == end_ && !failed(); }
  const char* position() const { return at_; }

  // The one-byte forms (nil, booleans, fixints, small arrays and strings) are read inline:
  // they are most of an engine step's bytes.
  bool nil() {
    if (at_ == end_) {
      truncated();
      return false;
    }
    if (tag() != 0xc0) return false;
    ++at_;
    return true;
  }
  // An integer of any width that fits int64 (as as_int64 reads one).
  std::optional<std::int64_t> int64() {
    if (at_ == end_) return truncated();
    const unsigned byte = tag();
    if (byte <= 0x7f || byte >= 0xe0) return static_cast<std::int8_t>(*at_++);
    if (byte < 0xcc || byte > 0xd3) return std::nullopt;
    return wide_int64();  // cc..cf unsigned, d0..d3 signed: 1 to 8 bytes
  }
  std::optional<std::string_view> str() {
    if (at_ == end_) return truncated();
    const unsigned byte = tag();
    if ((byte & 0xe0U) == 0xa0 && (byte & 0x1fU) < left()) {
      std::string_view text(at_ + 1, byte & 0x1fU);
      at_ += 1 + text.size();
      return text;
    }
    if (byte != 0xd9 && byte != 0xda && byte != 0xdb && (byte & 0xe0U) != 0xa0) return std::nullopt;
    return long_str();
  }
  // The element count of an array, or the entry count of a map; the elements follow.
  std::optional<std::uint32_t> array() { return container(0x90, 0xdc); }
  std::optional<std::uint32_t> map() { return container(0x80, 0xde); }
  struct Ext {
    std::int8_t type = 0;
    std::string_view data;
  };
  std::optional<Ext> ext();
  // Passes over the next value whatever it is; false when it is malformed.
  bool skip() {
    if (at_ != end_ &&
        (tag() <= 0x7f || tag() >= 0xe0 || tag() == 0xc0 || tag() == 0xc2 || tag() == 0xc3)) {
      ++at_;
      return true;
    }
    return skip_value(0);
  }
  // The next value's bytes, passed over (to decode later, or never); raw_map only a map's.
  std::optional<std::string_view> raw();
  std::optional<std::string_view> raw_map();

 private:
  enum class Kind : std::uint8_t { kNil, kBool, kInt, kFloat, kStr, kBin, kArray, kMap, kExt };
  // What the next value is and where its body starts: its header read, nothing consumed.
  struct Head {
    Kind kind = Kind::kNil;
    std::size_t header = 0;  // bytes before the body
    std::uint64_t size = 0;  // body bytes (str, bin, ext, int, float) or items (array, map)
    std::int8_t ext_type = 0;
  };
  unsigned tag() const { return static_cast<unsigned char>(*at_); }
  std::optional<Head> head();
  std::optional<std::int64_t> wide_int64();
  std::optional<std::string_view> long_str();
  std::string_view take(const Head& head);  // a str, bin or ext body, passed over
  // An array (fix 0x90, then 0xdc, 0xdd) or map (0x80, 0xde, 0xdf) header.
  std::optional<std::uint32_t> container(unsigned fix, unsigned wide) {
    if (at_ == end_) return truncated();
    const unsigned byte = tag();
    if ((byte & 0xf0U) == fix) {
      const std::size_t items = byte & 0x0fU;
      const std::size_t limit = fix == 0x80 ? limits_.map : limits_.array;
      if (items * (fix == 0x80 ? 2 : 1) < left() && items <= limit) {
        ++at_;
        return static_cast<std::uint32_t>(items);
      }
      return long_container();
    }
    if (byte != wide && byte != wide + 1) return std::nullopt;
    return long_container();
  }
  std::optional<std::uint32_t> long_container();
  bool skip_value(std::size_t depth);
  bool fail(std::string why);
  std::nullopt_t stop(std::string why);      // fail(), as a read's answer
  [[gnu::cold]] std::nullopt_t truncated();  // out of line: the inline reads build no string
  std::size_t left() const { return static_cast<std::size_t>(end_ - at_); }

  const char* at_;
  const char* end_;
  DecodeLimits limits_;
  std::string error_;
};

}  // namespace vllmd::wire
