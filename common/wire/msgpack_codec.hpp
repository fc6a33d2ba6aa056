#pragma once
// Bounded msgpack decoding for frames we do not trust (everything an engine sends), and the
// small helpers the message codecs share. msgpack-c throws; nothing here lets an exception out.

#include <cstddef>
#include <cstdint>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>

namespace vllmd::wire {

// Upper bounds for one decoded frame. Engine replies are small; these stop a hostile or broken
// peer from making the decoder allocate gigabytes (msgpack-c's defaults are 4 G of each).
struct DecodeLimits {
  std::size_t array = 1U << 20;
  std::size_t map = 1U << 20;
  std::size_t str = 256U << 20;
  std::size_t bin = 256U << 20;
  std::size_t ext = 1U << 20;
  std::size_t depth = 64;
};

// Decodes exactly one msgpack value filling `bytes`. Strings reference `bytes`, which must
// outlive the handle. Trailing bytes are an error.
tl::expected<msgpack::object_handle, std::string> decode(std::string_view bytes,
                                                         const DecodeLimits& limits = {});

// Re-encodes one value (minimal-width, as every msgpack writer here does).
std::string encode_object(const msgpack::object& object);

// Checked accessors; nullopt when the object has another type.
std::optional<std::string_view> as_str(const msgpack::object& object);
std::optional<bool> as_bool(const msgpack::object& object);
std::optional<std::int64_t> as_int64(const msgpack::object& object);
// A float, or an integer of any width read as one (JSON and msgspec take either for a float).
std::optional<double> as_double(const msgpack::object& object);
bool is_nil(const msgpack::object& object);

// Looks a string key up in a map object; nullptr when absent or when `map` is no map.
// Duplicate keys resolve to the last one, as a Python dict built from the map would.
const msgpack::object* find_key(const msgpack::object& map, std::string_view key);
// find_key, with a nil value read as absent (as Python's defaults and pydantic's None do).
const msgpack::object* find_value(const msgpack::object& map, std::string_view key);

// Buffer type used by all encoders: a std::string so frames can be sent without conversion.
class StringBuffer {
 public:
  void write(const char* data, std::size_t size) { bytes_.append(data, size); }
  std::string& bytes() { return bytes_; }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};
using Packer = msgpack::packer<StringBuffer>;

void pack_str(Packer& packer, std::string_view text);
// A float64 that stays one (msgpack-c's pack_double writes an integral value as an integer).
void pack_float64(StringBuffer& buffer, double value);

}  // namespace vllmd::wire
