// Fuzz target: a JSON request body -> validation (docs/http-api.md §3) -> msgpack.
// Properties checked (a violation traps): what the transcoder accepts, msgpack_to_json turns
// back into JSON; a validated update_info value decodes and re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/api/request.hpp"
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
    (void)api::init_info(*body);
    (void)api::finish_version(*body);
    (void)api::new_version(*body);
    if (auto value = api::update_info(*body)) {
      auto handle = wire::decode(*value, limits);
      check(handle.has_value());
      check(wire::encode_object(handle->get()) == *value);
    }
  }

  if (auto transcoded = wire::json_to_msgpack(input)) {
    auto json = wire::msgpack_to_json(transcoded->msgpack.view(), limits);
    check(json.has_value());
  }
  return 0;
}
