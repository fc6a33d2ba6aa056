#include "common/wire/msgpack_to_json.hpp"

#include <charconv>
#include <cmath>

namespace vllmd::wire {

void append_double(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";  // JSON has no NaN/Infinity
    return;
  }
  char digits[32];
  const auto [end, error] = std::to_chars(digits, digits + sizeof digits, value);
  std::string_view text(digits, static_cast<std::size_t>(end - digits));
  out += text;
  if (text.find_first_of(".e") == std::string_view::npos) out += ".0";
}

void append_json(std::string& out, const msgpack::object& object) {
  switch (object.type) {
    case msgpack::type::NIL: out += "null"; break;
    case msgpack::type::BOOLEAN: out += object.via.boolean ? "true" : "false"; break;
    case msgpack::type::POSITIVE_INTEGER: out += std::to_string(object.via.u64); break;
    case msgpack::type::NEGATIVE_INTEGER: out += std::to_string(object.via.i64); break;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: append_double(out, object.via.f64); break;
    case msgpack::type::STR:
      append_json_string(out, std::string_view(object.via.str.ptr, object.via.str.size));
      break;
    case msgpack::type::BIN:
      // Binary has no JSON form; render as a string of its bytes, as bytes.decode would fail to.
      append_json_string(out, std::string_view(object.via.bin.ptr, object.via.bin.size));
      break;
    case msgpack::type::ARRAY:
      out.push_back('[');
      for (std::uint32_t i = 0; i < object.via.array.size; ++i) {
        if (i != 0) out.push_back(',');
        append_json(out, object.via.array.ptr[i]);
      }
      out.push_back(']');
      break;
    case msgpack::type::MAP:
      out.push_back('{');
      for (std::uint32_t i = 0; i < object.via.map.size; ++i) {
        if (i != 0) out.push_back(',');
        const msgpack::object_kv& entry = object.via.map.ptr[i];
        if (entry.key.type == msgpack::type::STR || entry.key.type == msgpack::type::BIN) {
          append_json(out, entry.key);
        } else {
          std::string key;
          append_json(key, entry.key);
          append_json_string(out, key);
        }
        out.push_back(':');
        append_json(out, entry.val);
      }
      out.push_back('}');
      break;
    case msgpack::type::EXT: out += "null"; break;
  }
}

tl::expected<std::string, std::string> msgpack_to_json(std::string_view msgpack,
                                                       const DecodeLimits& limits) {
  auto handle = decode(msgpack, limits);
  if (!handle) return tl::unexpected(handle.error());
  std::string out;
  append_json(out, handle->get());
  return out;
}

}  // namespace vllmd::wire
