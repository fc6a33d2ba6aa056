#include "common/api/service.hpp"

#include <algorithm>

#include "common/api/replies.hpp"
#include "common/util/log.hpp"
#include "common/version.hpp"
#include "common/wire/json_text.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

using engine::CallErrorKind;
using engine::CallOptions;
using engine::EngineReply;

Response error_response(const ApiError& error, double engine_seconds) {
  Response response{error.status, error.body()};
  response.engine_seconds = engine_seconds;
  return response;
}

WeightSyncService::WeightSyncService(engine::EngineCalls& engines, ServiceOptions options,
                                     util::Executor* executor)
    : engines_(engines), options_(std::move(options)),
      started_at_(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count()),
      lifecycle_queue_(executor), sessions_(options_.session_idle_timeout) {}

void WeightSyncService::handle(const CallPtr& call, const Done& done) {
  const Route& route = *call->route;
  // Everything is checked before the call may queue or reach an engine.
  if (auto valid = validate_body(*call); !valid) return done(error_response(valid.error()));
  if (route.engine_args != nullptr) {
    auto args = route.engine_args(*call);
    if (!args) return done(error_response(args.error()));
    call->engine_args = std::move(*args);
  }
  switch (route.handling) {
    case Handling::kLifecycle: return enqueue(call, done);
    case Handling::kRead:
    case Handling::kScheduler:
    case Handling::kEngine:
    case Handling::kLocal: return (this->*route.handler)(call, done);
    case Handling::kGenerate:
      return done(error_response(server_error("internal error: " + std::string(route.path) +
                                              " is served by the generation service")));
  }
}

bool WeightSyncService::answers_at_once(const Route& route) const {
  switch (route.handling) {
    case Handling::kLocal: return !route.blocking;
    case Handling::kRead: {
      // While a call is in flight, reads answer from known state (see read()).
      if (calls_in_flight_.load() > 0) return true;
      return route.operation == Operation::kWeightInfo ? known_.version_certain()
                                                       : known_.paused_certain();
    }
    case Handling::kLifecycle:
    case Handling::kScheduler:
    case Handling::kEngine:
    case Handling::kGenerate: return false;
  }
  return false;
}

void WeightSyncService::fan_out(std::string operation_name, std::string metric,
                                const std::string& engine_method,
                                const engine::EngineCalls::ArgParts& args,
                                const CallOptions& options, Changes changes,
                                const std::vector<int>& ranks, std::function<void(FanOut)> then) {
  const auto started = std::chrono::steady_clock::now();
  sync_known();
  // In flight first: readers then never see a value both uncertain and without a call to
  // wait behind (answers_at_once relies on it).
  ++calls_in_flight_;
  const std::uint64_t sequence = known_.next_sequence();
  // Until this call succeeds, nobody knows what the engines hold.
  if (changes == Changes::kVersion) known_.changing_version(sequence);
  if (changes == Changes::kPaused) known_.changing_paused(sequence);
  if (observer_ && !metric.empty()) observer_({.operation = metric});
  auto completion = [this, started, sequence, operation_name = std::move(operation_name),
                     metric = std::move(metric),
                     then = std::move(then)](std::vector<EngineReply> replies) {
    --calls_in_flight_;
    FanOut result;
    result.sequence = sequence;
    result.replies = std::move(replies);
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    result.error = summarize(operation_name, result.replies);
    const bool reached_engine =
        std::any_of(result.replies.begin(), result.replies.end(), [](const EngineReply& reply) {
          return reply.value || reply.value.error().kind != CallErrorKind::kUnavailable;
        });
    if (observer_ && !metric.empty()) {
      observer_({.operation = metric,
                 .finished = true,
                 .seconds = result.seconds,
                 .succeeded = !result.error,
                 .reached_engine = reached_engine});
    }
    if (result.error) util::log::warning(result.error->message);
    then(std::move(result));
  };
  if (ranks.empty()) {
    engines_.call_all_async(engine_method, args, options, std::move(completion));
  } else {
    engines_.call_ranks_async(ranks, engine_method, args, options, std::move(completion));
  }
}

// Seeds newly admitted engines in the known state; the engines' snapshot is copied only when
// an admission happened since (reads call this on every request).
void WeightSyncService::sync_known() {
  const std::uint64_t admissions = engines_.admissions();
  if (admissions == synced_admissions_.load()) return;
  known_.sync(engines_.engines());
  synced_admissions_ = admissions;
}

// ---------------------------------------------------------------------------------------------
// Reads

// /weight_info or /is_paused from what the engines last told us.
Response WeightSyncService::known_answer(const Route& route) {
  if (route.operation == Operation::kIsPaused) {
    return {200, std::string("{\"is_paused\":") + (known_.paused() ? "true" : "false") + "}"};
  }
  auto version = known_.version();
  if (!version) return error_response(server_error(version.error()));
  return {200, "{\"weight_version\":" + wire::json_string(*version) + "}"};
}

// What every engine answered to a read, once they all agree (versions) or any says so
// (paused), into the known state.
tl::expected<std::string, ApiError> read_answer(const Route& route,
                                                const std::vector<EngineReply>& replies,
                                                KnownState& known, std::uint64_t sequence) {
  if (route.operation == Operation::kWeightInfo) {
    auto agreed = agreed_version(replies);
    if (!agreed) return tl::unexpected(agreed.error());
    for (const EngineReply& reply : replies) known.set_version(reply.rank, sequence, *agreed);
    return "{\"weight_version\":" + wire::json_string(*agreed) + "}";
  }
  bool paused = false;
  for (const EngineReply& reply : replies) {
    auto value = decode_bool(*reply.value);
    if (!value) {
      return tl::unexpected(server_error("failed to call is_scheduler_paused: engine rank " +
                                         std::to_string(reply.rank) + " returned a non-boolean"));
    }
    paused = paused || *value;
    known.set_paused(reply.rank, sequence, *value);
  }
  return std::string("{\"is_paused\":") + (paused ? "true" : "false") + "}";
}

void WeightSyncService::read(const CallPtr& call, const Done& done) {
  const Route& route = *call->route;
  // Without every engine attached there is no state to report (nor anyone to ask).
  if (auto unready = not_ready()) return done(error_response(*unready));
  sync_known();
  // The engine runs utility calls one at a time, so a query sent while an update blocks it
  // would wait for the update. Answer from what the engines last told us instead, and
  // whenever that is certain (no call that changes it has been made since, or failed): a
  // round trip would return the same.
  if (answers_at_once(route)) return done(known_answer(route));
  const CallOptions call_options{options_.query_timeout, false};
  fan_out(std::string(route.engine_method), "", std::string(route.engine_method), {"\x90"},
          call_options, route.changes, {}, [this, &route, done](FanOut result) {
            if (result.error) return done(error_response(*result.error, result.seconds));
            auto body = read_answer(route, result.replies, known_, result.sequence);
            if (!body) return done(error_response(body.error(), result.seconds));
            Response response{200, std::move(*body)};
            response.engine_seconds = result.seconds;
            done(std::move(response));
          });
}

// ---------------------------------------------------------------------------------------------
// vllmd's own answers

// 503 naming every engine that is not ready, or nothing when all are.
std::optional<ApiError> WeightSyncService::not_ready() const {
  if (engines_.all_ready()) return std::nullopt;  // no copy of the engines on the read path
  std::string problems;
  for (const auto& engine : engines_.engines()) {
    if (engine.state == engine::EngineState::kReady) continue;
    if (!problems.empty()) problems += "; ";
    problems += "engine rank " + std::to_string(engine.rank) + " is " +
                std::string(engine::state_name(engine.state));
    if (!engine.reason.empty()) problems += " (" + engine.reason + ")";
  }
  if (problems.empty()) return std::nullopt;
  return engine_unavailable(problems);
}

void WeightSyncService::health(const CallPtr&, const Done& done) {
  if (auto unready = not_ready()) return done(error_response(*unready));
  done({200, ""});
}

void WeightSyncService::version(const CallPtr&, const Done& done) {
  std::string body = "{\"version\":" + wire::json_string(kVersion);
  for (const auto& engine : engines_.engines()) {
    if (engine.registration.vllm_version) {
      body += ",\"vllm_version\":" + wire::json_string(*engine.registration.vllm_version);
      break;
    }
  }
  done({200, body + "}"});
}

void WeightSyncService::world_size(const CallPtr& call, const Done& done) {
  auto include_dp = query_bool(call->query, "include_dp", true);
  if (!include_dp) return done(error_response(include_dp.error()));
  if (auto unready = not_ready()) return done(error_response(*unready));
  const auto engines = engines_.engines();
  const std::int64_t per_engine =
      engines.front().registration.world_size.value_or(options_.world_size_fallback);
  const std::int64_t total =
      *include_dp ? per_engine * static_cast<std::int64_t>(engines.size()) : per_engine;
  done({200, "{\"world_size\":" + std::to_string(total) + "}"});
}

void WeightSyncService::metrics(const CallPtr&, const Done& done) {
  if (!hooks_.metrics) return done(error_response(not_found()));
  done(hooks_.metrics());
}

void WeightSyncService::reload(const CallPtr&, const Done& done) {
  if (!hooks_.reload) return done(error_response(not_found()));
  if (auto error = hooks_.reload()) {
    return done(error_response(invalid_configuration("reload failed: " + *error)));
  }
  done({200, R"({"status":"reloaded"})"});
}

void WeightSyncService::session_status(const CallPtr&, const Done& done) {
  done({200, sessions_.snapshot().json()});
}

// The OpenAI model list vLLM serves, with the one model the engines serve: clients (TRL's)
// call it when they are created, and read max_model_len as their token budget. It is the
// smallest any engine registered (null before one did, or from engines too old to say).
void WeightSyncService::models(const CallPtr&, const Done& done) {
  const std::string name = wire::json_string(options_.served_model_name);
  const std::string created = std::to_string(started_at_);
  std::optional<std::int64_t> max_model_len;
  for (const engine::EngineStatus& engine : engines_.engines()) {
    if (const auto& length = engine.registration.max_model_len) {
      max_model_len = std::min(max_model_len.value_or(*length), *length);
    }
  }
  const std::string length = max_model_len ? std::to_string(*max_model_len) : "null";
  done({200, R"({"object":"list","data":[{"id":)" + name + R"(,"object":"model","created":)" +
                 created + R"(,"owned_by":"vllm","root":)" + name +
                 R"(,"parent":null,"max_model_len":)" + length + R"(,"permission":[]}]})"});
}

void WeightSyncService::server_info(const CallPtr& call, const Done& done) {
  const std::string* format = query_value(call->query, "config_format");
  if (format != nullptr && *format != "text" && *format != "json") {
    return done(error_response(invalid_request(
        "config_format must be text or json, got '" + *format + "'", "query.config_format")));
  }
  if (!hooks_.server_info) return done(error_response(not_found()));
  done({200, hooks_.server_info(format != nullptr && *format == "json")});
}

}  // namespace vllmd::api
