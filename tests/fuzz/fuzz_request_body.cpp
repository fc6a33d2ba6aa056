// Fuzz target: a JSON request body -> validation (docs/http-api.md §3) -> msgpack.
// Properties checked (a violation traps): what the transcoder accepts, msgpack_to_json turns
// back into JSON; a validated update_info value decodes and re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/api/request.hpp"
#include "common/api/table.hpp"
#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_codec.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace {

// The transcoder nests up to TranscodeLimits::max_depth (256); decode at least that deep.
vllmd::wire::DecodeLimits deep_limits() {
  vllmd::wire::DecodeLimits limits;
  limits.depth = 300;
  return limits;
}

void check(bool property) {
  if (!property) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace api = vllmd::api;
  namespace wire = vllmd::wire;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const wire::DecodeLimits limits = deep_limits();

  if (auto body = api::parse_object_body(input)) {
    // Every route's member check; what passes as a value decodes and re-encodes to itself.
    for (const api::Route& route : api::routes()) {
      auto member = api::member_value(route, *body);
      if (!member || member->value.empty()) continue;
      auto handle = wire::decode(member->value, limits);
      check(handle.has_value());
      check(wire::encode_object(handle->get()) == member->value);
    }
  }

  if (auto transcoded = wire::json_to_msgpack(input)) {
    auto json = wire::msgpack_to_json(transcoded->msgpack.view(), limits);
    check(json.has_value());
  }
  return 0;
}
