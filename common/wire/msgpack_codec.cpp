#include "common/wire/msgpack_codec.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace vllmd::wire {

namespace {
// Keep strings and binaries pointing into the caller's buffer instead of copying them.
bool reference_everything(msgpack::type::object_type, std::size_t, void*) { return true; }
}  // namespace

tl::expected<msgpack::object_handle, std::string> decode(std::string_view bytes,
                                                         const DecodeLimits& limits) {
  if (bytes.empty()) return tl::unexpected(std::string("empty msgpack frame"));
  // msgpack-c allocates a container's elements when it reads the header: a count can never
  // exceed the bytes left (an element takes one byte at least, a map entry two), so capping the
  // limits there keeps a short frame of nested huge headers from allocating gigabytes.
  const msgpack::unpack_limit unpack_limit(std::min(limits.array, bytes.size()),
                                           std::min(limits.map, bytes.size() / 2), limits.str,
                                           limits.bin, limits.ext, limits.depth);
  std::size_t offset = 0;
  try {
    msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size(), offset,
                                                    reference_everything, nullptr, unpack_limit);
    if (offset != bytes.size()) {
      return tl::unexpected("trailing bytes after msgpack value at offset " +
                            std::to_string(offset));
    }
    return handle;
  } catch (const msgpack::insufficient_bytes&) {
    return tl::unexpected(std::string("truncated msgpack frame"));
  } catch (const msgpack::size_overflow& error) {
    return tl::unexpected(std::string("msgpack frame exceeds decode limits (") + error.what() +
                          ")");
  } catch (const std::exception& error) {
    return tl::unexpected(std::string("malformed msgpack frame: ") + error.what());
  }
}

namespace {
// Floats are written here, not by msgpack-c: since 4.1 its packer turns integral floats into
// integers (1.0 -> 0x01, -0.0 -> 0x00), which would change a value's type on the way through.
void write_float(StringBuffer& buffer, std::uint8_t type, std::uint64_t bits, int size) {
  char bytes[9];
  bytes[0] = static_cast<char>(type);
  for (int i = size; i >= 1; --i, bits >>= 8) bytes[i] = static_cast<char>(bits & 0xff);
  buffer.write(bytes, static_cast<std::size_t>(size) + 1);
}

void pack_object(Packer& packer, StringBuffer& buffer, const msgpack::object& object) {
  switch (object.type) {
    case msgpack::type::FLOAT64: pack_float64(buffer, object.via.f64); break;
    case msgpack::type::FLOAT32: {
      const auto value = static_cast<float>(object.via.f64);
      std::uint32_t bits = 0;
      std::memcpy(&bits, &value, sizeof bits);
      write_float(buffer, 0xca, bits, 4);
      break;
    }
    case msgpack::type::ARRAY:
      packer.pack_array(object.via.array.size);
      for (std::uint32_t i = 0; i < object.via.array.size; ++i) {
        pack_object(packer, buffer, object.via.array.ptr[i]);
      }
      break;
    case msgpack::type::MAP:
      packer.pack_map(object.via.map.size);
      for (std::uint32_t i = 0; i < object.via.map.size; ++i) {
        pack_object(packer, buffer, object.via.map.ptr[i].key);
        pack_object(packer, buffer, object.via.map.ptr[i].val);
      }
      break;
    default: packer.pack(object); break;
  }
}
}  // namespace

std::string encode_object(const msgpack::object& object) {
  StringBuffer buffer;
  Packer packer(buffer);
  pack_object(packer, buffer, object);
  return buffer.take();
}

std::optional<std::string_view> as_str(const msgpack::object& object) {
  if (object.type != msgpack::type::STR) return std::nullopt;
  return std::string_view(object.via.str.ptr, object.via.str.size);
}

std::optional<bool> as_bool(const msgpack::object& object) {
  if (object.type != msgpack::type::BOOLEAN) return std::nullopt;
  return object.via.boolean;
}

std::optional<std::int64_t> as_int64(const msgpack::object& object) {
  if (object.type == msgpack::type::NEGATIVE_INTEGER) return object.via.i64;
  if (object.type == msgpack::type::POSITIVE_INTEGER &&
      object.via.u64 <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(object.via.u64);
  }
  return std::nullopt;
}

std::optional<double> as_double(const msgpack::object& object) {
  if (object.type == msgpack::type::FLOAT64 || object.type == msgpack::type::FLOAT32) {
    return object.via.f64;
  }
  if (object.type == msgpack::type::POSITIVE_INTEGER) return static_cast<double>(object.via.u64);
  if (object.type == msgpack::type::NEGATIVE_INTEGER) return static_cast<double>(object.via.i64);
  return std::nullopt;
}

bool is_nil(const msgpack::object& object) { return object.type == msgpack::type::NIL; }

const msgpack::object* find_key(const msgpack::object& map, std::string_view key) {
  if (map.type != msgpack::type::MAP) return nullptr;
  const msgpack::object* found = nullptr;
  for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& entry = map.via.map.ptr[i];
    if (as_str(entry.key) == key) found = &entry.val;
  }
  return found;
}

const msgpack::object* find_value(const msgpack::object& map, std::string_view key) {
  const msgpack::object* value = find_key(map, key);
  return value == nullptr || is_nil(*value) ? nullptr : value;
}

void pack_float64(StringBuffer& buffer, double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  write_float(buffer, 0xcb, bits, 8);
}

void pack_str(Packer& packer, std::string_view text) {
  packer.pack_str(static_cast<std::uint32_t>(text.size()));
  packer.pack_str_body(text.data(), static_cast<std::uint32_t>(text.size()));
}

}  // namespace vllmd::wire
