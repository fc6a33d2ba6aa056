#include "common/reference/python_call.hpp"

#include "common/wire/msgpack_codec.hpp"

namespace vllmd::reference {

namespace {

std::string plural(std::size_t count, std::string_view word) {
  return std::to_string(count) + " " + std::string(word) + (count == 1 ? "" : "s");
}

// CPython's list of missing names: 'a' / 'a' and 'b' / 'a', 'b', and 'c'.
std::string quoted_names(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i != 0) out += names.size() == 2 ? " and " : (i + 1 == names.size() ? ", and " : ", ");
    out += "'" + std::string(names[i]) + "'";
  }
  return out;
}

}  // namespace

Positional positional(const msgpack::object& array) {
  if (array.type != msgpack::type::ARRAY) return {};
  return {array.via.array.ptr, array.via.array.size};
}

tl::expected<std::vector<const msgpack::object*>, std::string> bind_call(
    std::string_view qualname, std::initializer_list<Param> params, Positional args,
    const msgpack::object* kwargs) {
  const std::string prefix = std::string(qualname) + "() ";
  std::vector<const msgpack::object*> bound(params.size(), nullptr);
  std::size_t required = 0;
  for (const Param& param : params) required += param.required ? 1 : 0;

  if (args.size > params.size()) {
    // CPython counts `self` on both sides.
    const std::string takes = required == params.size()
                                  ? plural(params.size() + 1, "positional argument")
                                  : "from " + std::to_string(required + 1) + " to " +
                                        plural(params.size() + 1, "positional argument");
    return tl::unexpected(prefix + "takes " + takes + " but " + std::to_string(args.size + 1) +
                          " were given");
  }
  for (std::uint32_t i = 0; i < args.size; ++i) bound[i] = &args.items[i];

  if (kwargs != nullptr && kwargs->type == msgpack::type::MAP) {
    for (std::uint32_t i = 0; i < kwargs->via.map.size; ++i) {
      const msgpack::object_kv& entry = kwargs->via.map.ptr[i];
      const auto key = wire::as_str(entry.key);
      if (!key) return tl::unexpected(prefix + "keywords must be strings");
      std::size_t index = 0;
      for (const Param& param : params) {
        if (param.name == *key) break;
        ++index;
      }
      if (index == params.size()) {
        return tl::unexpected(prefix + "got an unexpected keyword argument '" + std::string(*key) +
                              "'");
      }
      if (bound[index] != nullptr) {
        return tl::unexpected(prefix + "got multiple values for argument '" + std::string(*key) +
                              "'");
      }
      bound[index] = &entry.val;
    }
  }

  std::vector<std::string_view> missing;
  std::size_t index = 0;
  for (const Param& param : params) {
    if (param.required && bound[index] == nullptr) missing.push_back(param.name);
    ++index;
  }
  if (!missing.empty()) return tl::unexpected(missing_arguments(qualname, missing));
  return bound;
}

std::string missing_arguments(std::string_view qualname,
                              const std::vector<std::string_view>& names) {
  return std::string(qualname) + "() missing " +
         plural(names.size(), "required positional argument") + ": " + quoted_names(names);
}

std::string_view python_type(const msgpack::object& object) {
  switch (object.type) {
    case msgpack::type::NIL: return "NoneType";
    case msgpack::type::BOOLEAN: return "bool";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER: return "int";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return "float";
    case msgpack::type::STR: return "str";
    case msgpack::type::BIN: return "bytes";
    case msgpack::type::ARRAY: return "list";
    case msgpack::type::MAP: return "dict";
    case msgpack::type::EXT: return "ExtType";
  }
  return "object";
}

std::optional<std::size_t> python_len(const msgpack::object& object) {
  switch (object.type) {
    case msgpack::type::STR: {
      std::size_t code_points = 0;  // UTF-8: count every byte that starts a character
      for (std::uint32_t i = 0; i < object.via.str.size; ++i) {
        code_points += (static_cast<unsigned char>(object.via.str.ptr[i]) & 0xc0) != 0x80;
      }
      return code_points;
    }
    case msgpack::type::BIN: return object.via.bin.size;
    case msgpack::type::ARRAY: return object.via.array.size;
    case msgpack::type::MAP: return object.via.map.size;
    default: return std::nullopt;
  }
}

std::string no_len_error(const msgpack::object& object) {
  return "object of type '" + std::string(python_type(object)) + "' has no len()";
}

std::string type_error(std::string_view what, std::string_view expected,
                       const msgpack::object& got) {
  return std::string(what) + " must be " + std::string(expected) + ", not " +
         std::string(python_type(got));
}

std::string none_value() { return std::string(1, '\xc0'); }

std::string bool_value(bool value) { return std::string(1, value ? '\xc3' : '\xc2'); }

std::optional<std::string> pause_mode_error(const msgpack::object* mode) {
  if (mode == nullptr || wire::is_nil(*mode)) return std::nullopt;
  const auto text = wire::as_str(*mode);
  if (!text) return type_error("pause mode", "a str", *mode);
  if (*text == "abort" || *text == "wait" || *text == "keep") return std::nullopt;
  return "Invalid pause mode: '" + std::string(*text) +
         "'. Expected one of 'abort', 'wait', 'keep'.";
}

}  // namespace vllmd::reference
