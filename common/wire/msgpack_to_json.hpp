#pragma once
// msgpack -> JSON, the way back: engine results (a version string, a bool) into HTTP bodies,
// and recorded engine arguments into readable test output. Integers stay integers; floats
// keep a '.' or exponent so they stay floats when read back.

#include <string>
#include <string_view>
#include <tl/expected.hpp>

#include "common/wire/json_text.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::wire {

tl::expected<std::string, std::string> msgpack_to_json(std::string_view msgpack,
                                                       const DecodeLimits& limits = {});
void append_json(std::string& out, const msgpack::object& object);
// A JSON number that reads back as a float (shortest round trip, "1.0" not "1"); null for
// NaN and infinities, which JSON cannot write.
void append_double(std::string& out, double value);

}  // namespace vllmd::wire
