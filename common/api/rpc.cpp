// POST /collective_rpc of WeightSyncService: a worker method on every worker of every engine,
// with the body's JSON as msgpack without loss (integers stay integers, `timeout` a float64),
// and the results as vLLM's Rust frontend returns them: every engine's list of per-worker
// values, concatenated in rank order, values as they are. A lifecycle call: worker methods
// (SkyRL drives its weight updates through them) run in order with the weight updates.

#include "common/api/replies.hpp"
#include "common/api/service.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::api {

using engine::CallOptions;
using engine::EngineReply;
using wire::JsonKind;

namespace {

// A member of the body, or nullptr when absent or null.
const wire::TopLevelMember* present(const wire::Transcoded& body, std::string_view key) {
  const wire::TopLevelMember* member = body.find(key);
  return member == nullptr || member->kind == JsonKind::kNull ? nullptr : member;
}

}  // namespace

tl::expected<std::string, ApiError> rpc_args(const Call& call) {
  const wire::Transcoded& body = *call.document;
  const wire::TopLevelMember* method = present(body, "method");
  if (method == nullptr)
    return tl::unexpected(invalid_request("Missing 'method' in request body", "method"));
  if (method->kind != JsonKind::kString) {
    return tl::unexpected(invalid_request("'method' must be a string", "method"));
  }
  const wire::TopLevelMember* timeout = present(body, "timeout");
  std::optional<double> seconds;
  if (timeout != nullptr) {
    auto handle = wire::decode(body.value_bytes(*timeout));
    if (!handle || (timeout->kind != JsonKind::kInteger && timeout->kind != JsonKind::kFloat)) {
      return tl::unexpected(invalid_request("'timeout' must be a number or null", "timeout"));
    }
    const msgpack::object& value = handle->get();
    switch (value.type) {
      case msgpack::type::POSITIVE_INTEGER: seconds = static_cast<double>(value.via.u64); break;
      case msgpack::type::NEGATIVE_INTEGER: seconds = static_cast<double>(value.via.i64); break;
      default: seconds = value.via.f64; break;
    }
  }
  const wire::TopLevelMember* args = present(body, "args");
  if (args != nullptr && args->kind != JsonKind::kArray) {
    return tl::unexpected(invalid_request("'args' must be a list", "args"));
  }
  const wire::TopLevelMember* kwargs = present(body, "kwargs");
  if (kwargs != nullptr && kwargs->kind != JsonKind::kObject) {
    return tl::unexpected(invalid_request("'kwargs' must be a JSON object", "kwargs"));
  }
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  const auto copy = [&](const wire::TopLevelMember& member) {
    const std::string_view bytes = body.value_bytes(member);
    buffer.write(bytes.data(), bytes.size());
  };
  packer.pack_array(4);
  copy(*method);
  if (seconds) {
    wire::pack_float64(buffer, *seconds);
  } else {
    packer.pack_nil();
  }
  if (args != nullptr) {
    copy(*args);
  } else {
    packer.pack_array(0);
  }
  if (kwargs != nullptr) {
    copy(*kwargs);
  } else {
    packer.pack_map(0);
  }
  return buffer.take();
}

void WeightSyncService::collective_rpc(const CallPtr& call, const Done& done) {
  if (auto conflict = sessions_.conflict(call->session)) return done(error_response(*conflict));
  const std::string method(call->route->engine_method);
  const CallOptions call_options{options_.lifecycle_timeout, true};
  fan_out(method, "", method, {call->engine_args}, call_options, Changes::kNothing, {},
          [done](const FanOut& result) {
            if (result.error) return done(error_response(*result.error, result.seconds));
            std::string results = "[";
            for (const EngineReply& reply : result.replies) {
              auto handle = wire::decode(*reply.value);
              if (!handle) {
                return done(error_response(
                    server_error("failed to call collective_rpc: engine rank " +
                                 std::to_string(reply.rank) + " returned undecodable msgpack")));
              }
              const msgpack::object& value = handle->get();
              const bool list = value.type == msgpack::type::ARRAY;
              const std::uint32_t count = list ? value.via.array.size : 1;
              for (std::uint32_t i = 0; i < count; ++i) {
                if (results.size() > 1) results += ",";
                wire::append_json(results, list ? value.via.array.ptr[i] : value);
              }
            }
            Response response{200, "{\"results\":" + results + "]}"};
            response.engine_seconds = result.seconds;
            done(std::move(response));
          });
}

}  // namespace vllmd::api
