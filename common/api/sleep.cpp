// Sleep mode of WeightSyncService: /sleep, /wake_up and /release_kv_cache_memory are
// lifecycle calls (one at a time, in order with the weight updates, refused to a client that
// does not own the open session), and vllmd remembers what sleeps (SleepStates) so that a
// weight update never reaches sleeping weights: vLLM's engine crashes on one (vllm#57853).

#include "common/api/replies.hpp"
#include "common/api/service.hpp"
#include "common/wire/json_text.hpp"

namespace vllmd::api {

using engine::CallOptions;
using engine::EngineReply;

namespace {

// Succeeded, or sent and not answered: an engine that refused (kFailed) changed nothing.
bool may_have_applied(const EngineReply& reply) {
  if (reply.value) return true;
  const engine::CallError& error = reply.value.error();
  return error.sent && error.kind != engine::CallErrorKind::kFailed;
}

std::string tags_json(const std::optional<std::vector<std::string>>& tags) {
  if (!tags) return "null";
  std::string out = "[";
  for (const std::string& tag : *tags) {
    if (out.size() > 1) out += ",";
    wire::append_json_string(out, tag);
  }
  return out + "]";
}

}  // namespace

std::vector<std::string_view> WeightSyncService::sleep_states() const {
  const std::vector<std::uint64_t> incarnations = current_incarnations();
  std::vector<std::string_view> states;
  states.reserve(incarnations.size());
  for (std::size_t rank = 0; rank < incarnations.size(); ++rank) {
    const int r = static_cast<int>(rank);
    const unsigned tags = sleep_.tags(r, incarnations[rank]);
    if (tags == kNoTag) {
      states.emplace_back("awake");
    } else if ((tags & kWeightsTag) == 0) {
      states.emplace_back("");
    } else {
      states.emplace_back(sleep_.level(r, incarnations[rank]) >= 2 ? "discard_all"
                                                                   : "weights_offloaded");
    }
  }
  return states;
}

std::optional<ApiError> WeightSyncService::weights_asleep() const {
  const std::vector<std::uint64_t> incarnations = current_incarnations();
  const std::vector<int> ranks = sleep_.weights_asleep(incarnations);
  if (ranks.empty()) return std::nullopt;
  const auto first = static_cast<std::size_t>(ranks.front());
  return weights_asleep_error("the model weights are asleep on " + rank_list(ranks) +
                              " (sleep level " +
                              std::to_string(sleep_.level(ranks.front(), incarnations[first])) +
                              "): POST /wake_up?tags=weights before a weight update");
}

// The lifecycle call's engine method with the query's args, to the engines as they are now;
// `then` gets the replies and the incarnations they came from.
void WeightSyncService::sleep_call(const CallPtr& call,
                                   std::function<void(FanOut, std::vector<std::uint64_t>)> then) {
  std::vector<std::uint64_t> incarnations = current_incarnations();
  const std::string method(call->route->engine_method);
  CallOptions options{options_.lifecycle_timeout, false};
  options.incarnations = incarnations;
  fan_out(method, std::string(call->route->metric), method, {call->engine_args}, options,
          call->route->changes, {},
          [then = std::move(then), incarnations = std::move(incarnations)](FanOut result) mutable {
            then(std::move(result), std::move(incarnations));
          });
}

// An error for a sleep-mode call, with what now sleeps (the caller decides what to wake).
Response WeightSyncService::sleep_failure(const FanOut& result) const {
  ApiError error = *result.error;
  const std::vector<int> asleep = sleep_.weights_asleep(current_incarnations());
  error.message += asleep.empty() ? "; no engine's weights are asleep"
                                  : "; the weights are (or may be) asleep on " + rank_list(asleep) +
                                        ": POST /wake_up wakes them";
  return error_response(error, result.seconds);
}

// sleep(level, mode): pauses generation and, at level 1 or 2, puts the weights and the KV
// cache to sleep. Not while a weight-update session is open: the update would run on
// offloaded weights.
void WeightSyncService::sleep(const CallPtr& call, const Done& done) {
  if (auto conflict = sessions_.conflict(call->session)) return done(error_response(*conflict));
  const int level = sleep_level(call->query).value_or(1);
  if (level >= 1 && sessions_.is_open()) {
    return done(error_response(
        conflict("a weight-update session is open: POST /finish_weight_update before putting the "
                 "weights to sleep")));
  }
  sleep_call(call, [this, level, done](const FanOut& result,
                                       const std::vector<std::uint64_t>& incarnations) {
    for (const EngineReply& reply : result.replies) {
      const auto rank = static_cast<std::size_t>(reply.rank);
      if (may_have_applied(reply)) sleep_.slept(reply.rank, incarnations[rank], level);
      if (reply.value) known_.set_paused(reply.rank, result.sequence, true);
    }
    if (result.error) return done(sleep_failure(result));
    Response response{200, "{\"status\":\"sleeping\",\"level\":" + std::to_string(level) + "}"};
    response.engine_seconds = result.seconds;
    done(std::move(response));
  });
}

// wake_up(tags): the engines answer whether they are fully awake (and resumed generation):
// "awake" when every one is. An engine of an older vLLM answers nil: awake if all was woken.
void WeightSyncService::wake_up(const CallPtr& call, const Done& done) {
  if (auto conflict = sessions_.conflict(call->session)) return done(error_response(*conflict));
  auto tags = wake_tags(call->query).value_or(std::nullopt);
  std::optional<unsigned> bits;
  if (tags) bits = tag_bits(*tags);
  sleep_call(call, [this, tags, bits, done](const FanOut& result,
                                            const std::vector<std::uint64_t>& incarnations) {
    bool all_awake = true;
    for (const EngineReply& reply : result.replies) {
      if (!reply.value) continue;
      const std::optional<bool> answer = decode_bool(*reply.value);
      const bool awake = answer.value_or(!bits);
      sleep_.woke(reply.rank, incarnations[static_cast<std::size_t>(reply.rank)], bits, awake);
      if (awake) known_.set_paused(reply.rank, result.sequence, false);
      all_awake = all_awake && awake;
    }
    if (result.error) return done(sleep_failure(result));
    Response response{200, std::string("{\"status\":\"") + (all_awake ? "awake" : "sleeping") +
                               "\",\"tags_woken\":" + tags_json(tags) + "}"};
    response.engine_seconds = result.seconds;
    done(std::move(response));
  });
}

// release_kv_cache_memory(): a paused engine with all its memory resident discards its KV
// cache; wake_up?tags=kv_cache restores it. The engine refuses otherwise (a 500 with its words).
void WeightSyncService::release_kv_cache_memory(const CallPtr& call, const Done& done) {
  if (auto conflict = sessions_.conflict(call->session)) return done(error_response(*conflict));
  sleep_call(call, [this, done](const FanOut& result,
                                const std::vector<std::uint64_t>& incarnations) {
    for (const EngineReply& reply : result.replies) {
      if (may_have_applied(reply)) {
        sleep_.released_kv_cache(reply.rank, incarnations[static_cast<std::size_t>(reply.rank)]);
      }
    }
    if (result.error) return done(sleep_failure(result));
    Response response{200, R"({"status":"kv_cache_released"})"};
    response.engine_seconds = result.seconds;
    done(std::move(response));
  });
}

}  // namespace vllmd::api
