// Engine commands of WeightSyncService: calls every engine runs outside the lifecycle queue
// (the cache resets, is_sleeping), answered once every engine has, with their results merged
// as vLLM's Rust frontend merges them.

#include "common/api/replies.hpp"
#include "common/api/service.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

using engine::CallOptions;
using engine::EngineReply;

namespace {

// Each engine's boolean answer, or nullopt for one that is not a boolean.
std::optional<bool> reply_bool(const EngineReply& reply) { return decode_bool(*reply.value); }

Response json_bool(std::string_view key, bool value) {
  return {200, "{\"" + std::string(key) + "\":" + (value ? "true" : "false") + "}"};
}

}  // namespace

void WeightSyncService::on_every_engine(const CallPtr& call, Changes changes,
                                        std::function<Response(const FanOut&)> answer,
                                        const Done& done) {
  const std::string method(call->route->engine_method);
  const CallOptions call_options{options_.lifecycle_timeout, false};
  fan_out(method, std::string(call->route->metric), method, {call->engine_args}, call_options,
          changes, {}, [answer = std::move(answer), done](const FanOut& result) {
            if (result.error) return done(error_response(*result.error, result.seconds));
            Response response = answer(result);
            response.engine_seconds = result.seconds;
            done(std::move(response));
          });
}

// The route's engine method with the query's args; 200 with an empty body when every engine
// succeeded (what both vLLM frontends answer for the cache resets).
void WeightSyncService::engine_command(const CallPtr& call, const Done& done) {
  on_every_engine(
      call, Changes::kNothing,
      [](const FanOut&) {
        return Response{200, ""};
      },
      done);
}

// reset_prefix_cache(reset_running_requests, reset_connector): {"success": ...} true only when
// every engine reset its cache. false is an answer, not an error: an engine whose blocks are
// still held by running requests declines, and the caller may retry.
void WeightSyncService::reset_prefix_cache(const CallPtr& call, const Done& done) {
  on_every_engine(
      call, Changes::kNothing,
      [](const FanOut& result) {
        bool success = true;
        for (const EngineReply& reply : result.replies) {
          success = success && reply_bool(reply).value_or(false);
        }
        return json_bool("success", success);
      },
      done);
}

// is_sleeping: paused or asleep, by consensus (vLLM's Rust frontend): engines that disagree
// are a 500 naming each rank's answer, since no single answer would be true of all of them.
void WeightSyncService::is_sleeping(const CallPtr& call, const Done& done) {
  on_every_engine(
      call, Changes::kNothing,
      [](const FanOut& result) {
        std::string answers;
        std::optional<bool> agreed;
        bool agree = true;
        for (const EngineReply& reply : result.replies) {
          const std::optional<bool> value = reply_bool(reply);
          if (!value) {
            return error_response(server_error("failed to call is_sleeping: engine rank " +
                                               std::to_string(reply.rank) +
                                               " returned a non-boolean"));
          }
          agree = agree && (!agreed || *agreed == *value);
          agreed = *value;
          answers += (answers.empty() ? "" : ", ") + std::string("engine rank ") +
                     std::to_string(reply.rank) + ": " + (*value ? "true" : "false");
        }
        if (!agree) {
          return error_response(
              server_error("failed to call is_sleeping: the engines disagree (" + answers + ")"));
        }
        return json_bool("is_sleeping", agreed.value_or(false));
      },
      done);
}

}  // namespace vllmd::api
