#pragma once
// Python call semantics for the reference engine: binding msgpack positional and keyword
// arguments to a parameter list, with the TypeError texts CPython produces, so the reference
// engine fails the same way (and with the same words) as vLLM's Python engine does.

#include <cstdint>
#include <initializer_list>
#include <msgpack.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

namespace vllmd::reference {

struct Param {
  std::string_view name;
  bool required = true;
};

// Positional arguments as a view into a msgpack array.
struct Positional {
  const msgpack::object* items = nullptr;
  std::uint32_t size = 0;
};
Positional positional(const msgpack::object& array);  // empty unless `array` is an array

// Binds arguments to `params` as CPython binds them for a method whose parameters are all
// positional-or-keyword (`self` included in the counts, as CPython counts it). `qualname` is
// e.g. "Worker.update_weights". `kwargs` may be nullptr or a map. The result has one entry per
// parameter, nullptr for an optional one that was not passed.
tl::expected<std::vector<const msgpack::object*>, std::string> bind_call(
    std::string_view qualname, std::initializer_list<Param> params, Positional args,
    const msgpack::object* kwargs);

// CPython's "<qualname>() missing 2 required positional arguments: 'a' and 'b'".
std::string missing_arguments(std::string_view qualname,
                              const std::vector<std::string_view>& names);

// The Python type name a msgpack value decodes to ("NoneType", "int", "list", "dict", ...).
std::string_view python_type(const msgpack::object& object);

// len() of the Python value a msgpack value decodes to (code points for a str); nullopt where
// len() raises, with the TypeError text no_len_error() gives.
std::optional<std::size_t> python_len(const msgpack::object& object);
std::string no_len_error(const msgpack::object& object);  // "object of type 'int' has no len()"

// A method's return value as msgpack: None, a bool.
std::string none_value();
std::string bool_value(bool value);

// "Invalid pause mode: ..." unless `mode` is None or one of vLLM's PauseMode values.
std::optional<std::string> pause_mode_error(const msgpack::object* mode);

// "<what> must be <expected>, not <python type of got>".
std::string type_error(std::string_view what, std::string_view expected,
                       const msgpack::object& got);

}  // namespace vllmd::reference
