// Engine commands of WeightSyncService: calls every engine runs outside the lifecycle queue
// (the cache resets), answered once every engine has, with their results merged as vLLM's
// Rust frontend merges them.

#include "common/api/service.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

using engine::CallOptions;

namespace {

constexpr std::string_view kNoArgs = "\x90";  // []

std::string bool_args(bool first, bool second) {
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  packer.pack_array(2);
  packer.pack(first);
  packer.pack(second);
  return buffer.take();
}

}  // namespace

// Sends the route's engine method without arguments; 200 with an empty body when every
// engine succeeded (what both vLLM frontends answer for the cache resets).
void WeightSyncService::engine_command(const CallPtr& call, const Done& done) {
  const std::string method(call->route->engine_method);
  const CallOptions call_options{options_.lifecycle_timeout, false};
  fan_out(method, std::string(call->route->metric), method, {kNoArgs}, call_options,
          Changes::kNothing, {}, [done](const FanOut& result) {
            if (result.error) return done(error_response(*result.error, result.seconds));
            Response response{200, ""};
            response.engine_seconds = result.seconds;
            done(std::move(response));
          });
}

// reset_prefix_cache(reset_running_requests, reset_connector): the query's booleans as
// Python clients send them (True included), and {"success": ...} true only when every engine
// reset its cache. false is an answer, not an error: an engine whose blocks are still held
// by running requests declines, and the caller may retry.
void WeightSyncService::reset_prefix_cache(const CallPtr& call, const Done& done) {
  auto running = query_bool(call->query, "reset_running_requests", false);
  if (!running) return done(error_response(running.error()));
  auto external = query_bool(call->query, "reset_external", false);
  if (!external) return done(error_response(external.error()));
  const std::string method(call->route->engine_method);
  const CallOptions call_options{options_.lifecycle_timeout, false};
  fan_out(method, std::string(call->route->metric), method, {bool_args(*running, *external)},
          call_options, Changes::kNothing, {}, [done](const FanOut& result) {
            if (result.error) return done(error_response(*result.error, result.seconds));
            bool success = true;
            for (const engine::EngineReply& reply : result.replies) {
              auto value = wire::decode(*reply.value);
              const auto reset = value ? wire::as_bool(value->get()) : std::nullopt;
              success = success && reset.value_or(false);
            }
            Response response{200, success ? R"({"success":true})" : R"({"success":false})"};
            response.engine_seconds = result.seconds;
            done(std::move(response));
          });
}

}  // namespace vllmd::api
