#pragma once
// Helpers shared by the wire unit tests: hex (spec test vectors are written as hex strings), a
// deterministic generator, and a msgpack-c re-pack to check that encodings are minimal-width.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <msgpack.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/wire/msgpack_codec.hpp"

namespace vllmd::test {

// "94 00 01" or "940001" -> bytes. Whitespace is ignored; anything else but hex digits throws.
inline std::string from_hex(std::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw std::invalid_argument("bad hex digit");
  };
  std::string bytes;
  int high = -1;
  for (const char c : hex) {
    if (c == ' ' || c == '\n' || c == '\t') continue;
    const int value = nibble(c);
    if (high < 0) {
      high = value;
    } else {
      bytes.push_back(static_cast<char>((high << 4) | value));
      high = -1;
    }
  }
  if (high >= 0) throw std::invalid_argument("odd number of hex digits");
  return bytes;
}

// Bytes -> lowercase hex without separators, so failing CHECKs print comparable strings.
inline std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 0xf]);
  }
  return hex;
}

// Hex of a string's UTF-8 bytes, for splicing text into a hex vector.
inline std::string text_hex(std::string_view text) { return to_hex(text); }

// A small deterministic generator (splitmix64): the same sequence on every platform and run.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform-enough value in [0, bound) for small bounds.
  std::uint64_t below(std::uint64_t bound) { return bound == 0 ? 0 : next() % bound; }
  bool chance(unsigned percent) { return below(100) < percent; }

 private:
  std::uint64_t state_;
};

// Unpacks `bytes` with msgpack-c and packs the value again with msgpack-c's packer, floats
// kept at their width (wire::encode_object, which msgpack_codec's own tests pin); equal bytes
// mean an encoding uses the same minimal widths msgpack-c and Python's msgpack choose.
inline std::string msgpack_c_repack(std::string_view bytes) {
  msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size());
  return wire::encode_object(handle.get());
}

// Plain msgpack::pack of the unpacked value, for documents without floats.
inline std::string msgpack_c_pack_plain(std::string_view bytes) {
  msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size());
  msgpack::sbuffer buffer;
  msgpack::pack(buffer, handle.get());
  return std::string(buffer.data(), buffer.size());
}

}  // namespace vllmd::test
