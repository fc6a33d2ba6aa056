#include "common/wire/msgpack_reader.hpp"

#include <limits>

namespace vllmd::wire {

namespace {

// `n` big-endian bytes (msgpack's order) as an unsigned integer.
std::uint64_t big_endian(const char* at, std::size_t n) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < n; ++i) value = (value << 8) | static_cast<unsigned char>(at[i]);
  return value;
}

}  // namespace

std::int64_t read_checked_int(const char*& at) {
  const auto byte = static_cast<unsigned char>(*at);
  if (byte <= 0x7f || byte >= 0xe0) return static_cast<std::int8_t>(*at++);
  const std::size_t size = std::size_t{1} << ((byte - 0xcc) & 3U);  // cc..cf, d0..d3: 1 to 8
  const std::uint64_t bits = big_endian(at + 1, size);
  at += 1 + size;
  if (byte <= 0xcf) return static_cast<std::int64_t>(bits);
  const unsigned shift = 64 - 8 * static_cast<unsigned>(size);
  return static_cast<std::int64_t>(bits << shift) >> shift;
}

bool MsgpackReader::fail(std::string why) {
  if (error_.empty()) error_ = std::move(why);
  at_ = end_;  // nothing more is read once the bytes are known bad
  return false;
}

std::nullopt_t MsgpackReader::stop(std::string why) {
  fail(std::move(why));
  return std::nullopt;
}

std::nullopt_t MsgpackReader::truncated() { return stop("truncated msgpack frame"); }

std::optional<MsgpackReader::Head> MsgpackReader::head() {
  if (at_ == end_) return stop("truncated msgpack frame");
  const unsigned byte = tag();
  Head head;
  head.header = 1;
  // A size stored in `n` bytes after the tag byte.
  auto sized = [&](Kind kind, std::size_t n) -> bool {
    if (left() < 1 + n) return fail("truncated msgpack frame");
    head.kind = kind;
    head.header = 1 + n;
    head.size = big_endian(at_ + 1, n);
    return true;
  };
  if (byte <= 0x7f || byte >= 0xe0) {
    head.kind = Kind::kInt;
  } else if (byte <= 0x8f) {
    head.kind = Kind::kMap;
    head.size = byte & 0x0fU;
  } else if (byte <= 0x9f) {
    head.kind = Kind::kArray;
    head.size = byte & 0x0fU;
  } else if (byte <= 0xbf) {
    head.kind = Kind::kStr;
    head.size = byte & 0x1fU;
  } else {
    switch (byte) {
      case 0xc0: head.kind = Kind::kNil; break;
      case 0xc2:
      case 0xc3: head.kind = Kind::kBool; break;
      case 0xc4:
        if (!sized(Kind::kBin, 1)) return std::nullopt;
        break;
      case 0xc5:
        if (!sized(Kind::kBin, 2)) return std::nullopt;
        break;
      case 0xc6:
        if (!sized(Kind::kBin, 4)) return std::nullopt;
        break;
      case 0xc7:
      case 0xc8:
      case 0xc9: {
        const std::size_t n = byte == 0xc7 ? 1 : byte == 0xc8 ? 2 : 4;
        if (!sized(Kind::kExt, n)) return std::nullopt;
        if (left() < head.header + 1) return stop("truncated msgpack frame");
        head.ext_type = static_cast<std::int8_t>(at_[head.header]);
        ++head.header;
        break;
      }
      case 0xca: head = {Kind::kFloat, 1, 4}; break;
      case 0xcb: head = {Kind::kFloat, 1, 8}; break;
      case 0xcc:
      case 0xd0: head = {Kind::kInt, 1, 1}; break;
      case 0xcd:
      case 0xd1: head = {Kind::kInt, 1, 2}; break;
      case 0xce:
      case 0xd2: head = {Kind::kInt, 1, 4}; break;
      case 0xcf:
      case 0xd3: head = {Kind::kInt, 1, 8}; break;
      case 0xd4:
      case 0xd5:
      case 0xd6:
      case 0xd7:
      case 0xd8:
        if (left() < 2) return stop("truncated msgpack frame");
        head.kind = Kind::kExt;
        head.header = 2;
        head.size = std::size_t{1} << (byte - 0xd4);
        head.ext_type = static_cast<std::int8_t>(at_[1]);
        break;
      case 0xd9:
        if (!sized(Kind::kStr, 1)) return std::nullopt;
        break;
      case 0xda:
        if (!sized(Kind::kStr, 2)) return std::nullopt;
        break;
      case 0xdb:
        if (!sized(Kind::kStr, 4)) return std::nullopt;
        break;
      case 0xdc:
        if (!sized(Kind::kArray, 2)) return std::nullopt;
        break;
      case 0xdd:
        if (!sized(Kind::kArray, 4)) return std::nullopt;
        break;
      case 0xde:
        if (!sized(Kind::kMap, 2)) return std::nullopt;
        break;
      case 0xdf:
        if (!sized(Kind::kMap, 4)) return std::nullopt;
        break;
      default: return stop("malformed msgpack frame: reserved byte 0xc1");
    }
  }
  // The same bounds as decode(). A container's count can never exceed the bytes left (an
  // element takes a byte at least, a map entry two): a larger one was cut short.
  const std::size_t body = left() - head.header;
  std::size_t limit = std::numeric_limits<std::size_t>::max();
  std::size_t room = body;
  switch (head.kind) {
    case Kind::kArray: limit = limits_.array; break;
    case Kind::kMap:
      limit = limits_.map;
      room = body / 2;
      break;
    case Kind::kStr: limit = limits_.str; break;
    case Kind::kBin: limit = limits_.bin; break;
    case Kind::kExt: limit = limits_.ext; break;
    default: break;
  }
  if (head.size > limit) {
    return stop("msgpack frame exceeds decode limits (" + std::to_string(head.size) +
                (head.kind == Kind::kArray || head.kind == Kind::kMap ? " items)" : " bytes)"));
  }
  if (head.size > room) return truncated();
  return head;
}

std::optional<std::int64_t> MsgpackReader::wide_int64() {
  if (!head()) return std::nullopt;  // cut short
  // A uint64 past int64's range is an integer still, but not one this reads: left for skip().
  if (tag() == 0xcf && (static_cast<unsigned char>(at_[1]) & 0x80U) != 0) return std::nullopt;
  return read_checked_int(at_);
}

std::string_view MsgpackReader::take(const Head& head) {
  const std::string_view body(at_ + head.header, head.size);
  at_ += head.header + head.size;
  return body;
}

std::optional<std::string_view> MsgpackReader::long_str() {
  auto found = head();
  if (!found) return std::nullopt;
  return take(*found);
}

std::optional<std::uint32_t> MsgpackReader::long_container() {
  auto found = head();
  if (!found) return std::nullopt;
  at_ += found->header;
  return static_cast<std::uint32_t>(found->size);
}

std::optional<MsgpackReader::Ext> MsgpackReader::ext() {
  if (at_ == end_) return truncated();
  const unsigned byte = tag();
  if (!((byte >= 0xc7 && byte <= 0xc9) || (byte >= 0xd4 && byte <= 0xd8))) return std::nullopt;
  auto found = head();
  if (!found) return std::nullopt;
  const std::int8_t type = found->ext_type;
  return Ext{type, take(*found)};
}

bool MsgpackReader::skip_value(std::size_t depth) {
  auto found = head();
  if (!found) return false;
  at_ += found->header;
  if (found->kind != Kind::kArray && found->kind != Kind::kMap) {
    at_ += found->size;
    return true;
  }
  if (depth + 1 > limits_.depth) return fail("msgpack frame exceeds decode limits (depth)");
  const std::uint64_t items = found->kind == Kind::kMap ? 2 * found->size : found->size;
  for (std::uint64_t i = 0; i < items; ++i) {
    if (!skip_value(depth + 1)) return false;
  }
  return true;
}

std::optional<std::string_view> MsgpackReader::raw_map() {
  if (at_ == end_) return truncated();
  const unsigned byte = tag();
  if (!((byte >= 0x80 && byte <= 0x8f) || byte == 0xde || byte == 0xdf)) return std::nullopt;
  return raw();
}

std::optional<std::string_view> MsgpackReader::raw() {
  const char* start = at_;
  if (!skip()) return std::nullopt;
  return std::string_view(start, static_cast<std::size_t>(at_ - start));
}

}  // namespace vllmd::wire
