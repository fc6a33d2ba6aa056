#include "common/api/service.hpp"

#include <algorithm>

#include "common/util/log.hpp"
#include "common/version.hpp"
#include "common/wire/msgpack_codec.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::api {

using engine::CallErrorKind;
using engine::CallOptions;
using engine::EngineReply;

Response error_response(const ApiError& error, double engine_seconds) {
  Response response{error.status, error.body()};
  response.engine_seconds = engine_seconds;
  return response;
}

namespace {

std::string message_body(std::string_view message) {
  return "{\"message\":" + wire::json_string(message) + "}";
}

// [worker_method, nil, [], {kwarg: <value>}] without the value, or with {} when no kwarg.
std::string collective_rpc_header(std::string_view worker_method, std::string_view kwarg) {
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  packer.pack_array(4);
  wire::pack_str(packer, worker_method);
  packer.pack_nil();
  packer.pack_array(0);
  packer.pack_map(kwarg.empty() ? 0 : 1);
  if (!kwarg.empty()) wire::pack_str(packer, kwarg);
  return buffer.take();
}

std::string pause_args(const std::string& mode, bool clear_cache) {
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  packer.pack_array(2);
  wire::pack_str(packer, mode);
  packer.pack(clear_cache);
  return buffer.take();
}

// The error for a fanned-out call, or nullopt when every engine succeeded. A dead engine
// outranks a timeout, which outranks a failure: the most basic cause is reported first.
std::optional<ApiError> summarize(std::string_view operation, const std::vector<EngineReply>& replies) {
  std::optional<CallErrorKind> worst;
  std::string details;
  for (const EngineReply& reply : replies) {
    if (reply.value) continue;
    const engine::CallError& error = reply.value.error();
    if (!details.empty()) details += "; ";
    if (replies.size() > 1 && error.kind == CallErrorKind::kFailed) {
      details += "engine rank " + std::to_string(reply.rank) + ": ";
    }
    details += error.message;
    if (!worst || error.kind == CallErrorKind::kUnavailable ||
        (error.kind == CallErrorKind::kTimeout && *worst == CallErrorKind::kFailed)) {
      worst = error.kind;
    }
  }
  if (!worst) return std::nullopt;
  const std::string message = "failed to call " + std::string(operation) + ": " + details;
  switch (*worst) {
    case CallErrorKind::kUnavailable: return engine_unavailable(message);
    case CallErrorKind::kTimeout: return engine_timeout(message);
    case CallErrorKind::kFailed: break;
  }
  return server_error(message);
}

std::optional<std::string> decode_string(const std::string& msgpack) {
  auto handle = wire::decode(msgpack);
  if (!handle) return std::nullopt;
  auto text = wire::as_str(handle->get());
  return text ? std::optional<std::string>(std::string(*text)) : std::nullopt;
}

std::optional<bool> decode_bool(const std::string& msgpack) {
  auto handle = wire::decode(msgpack);
  return handle ? wire::as_bool(handle->get()) : std::nullopt;
}

}  // namespace

WeightSyncService::WeightSyncService(engine::EngineClient& engines, ServiceOptions options)
    : engines_(engines), options_(options) {}

WeightSyncService::FanOut WeightSyncService::fan_out(std::string_view operation_name,
                                                     std::string_view metric,
                                                     std::string_view engine_method,
                                                     const engine::EngineClient::ArgParts& args,
                                                     const CallOptions& options) {
  FanOut result;
  const auto started = std::chrono::steady_clock::now();
  sync_known();
  // In flight first: readers then never see a value both uncertain and without a call to
  // wait behind (answers_at_once relies on it).
  ++calls_in_flight_;
  // Until this call succeeds, nobody knows what the engines hold.
  if (engine_method == "set_weight_version") known_.forget_version();
  if (engine_method == "pause_scheduler" || engine_method == "resume_scheduler") {
    known_.forget_paused();
  }
  result.replies = engines_.call_all(engine_method, args, options);
  --calls_in_flight_;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  result.error = summarize(operation_name, result.replies);
  const bool reached_engine = std::any_of(
      result.replies.begin(), result.replies.end(), [](const EngineReply& reply) {
        return reply.value || reply.value.error().kind != CallErrorKind::kUnavailable;
      });
  if (observer_ && !metric.empty() && reached_engine) observer_(metric, result.seconds);
  if (result.error) log::warning(result.error->message);
  return result;
}

Response WeightSyncService::handle(const Route& route, const Query& query, std::string& body) {
  switch (route.operation) {
    case Operation::kHealth: return health();
    case Operation::kVersion: return version();
    case Operation::kWorldSize: return world_size(query);
    case Operation::kWeightInfo:
    case Operation::kIsPaused:
    case Operation::kPause:
    case Operation::kResume: return read_only(route, query);
    case Operation::kMetrics:
    case Operation::kReload: return error_response(not_found());  // the daemon's own routes
    default: return lifecycle(route, query, body);
  }
}

Response WeightSyncService::lifecycle(const Route& route, const Query&, std::string& body) {
  // Validate before waiting for the lock: a bad request never waits and never reaches an engine.
  std::optional<wire::Transcoded> document;
  std::string_view value;
  std::string kwarg;
  std::optional<std::string> version;
  if (route.body == Body::kRequired || (route.body == Body::kOptional && !body.empty())) {
    auto parsed = parse_object_body(body);
    if (!parsed) return error_response(parsed.error());
    document = std::move(*parsed);
    std::string().swap(body);  // the msgpack holds everything now
  }
  if (route.operation == Operation::kInitWeightTransfer) {
    auto info = init_info(*document);
    if (!info) return error_response(info.error());
    value = *info;
    kwarg = "init_info";
  } else if (route.operation == Operation::kUpdateWeights) {
    auto info = update_info(*document);
    if (!info) return error_response(info.error());
    value = *info;
    kwarg = "update_info";
  } else if (route.operation == Operation::kFinishWeightUpdate && document) {
    auto requested = finish_version(*document);
    if (!requested) return error_response(requested.error());
    version = *requested;
  } else if (route.operation == Operation::kUpdateWeightVersion) {
    auto requested = new_version(*document);
    if (!requested) return error_response(requested.error());
    version = *requested;
  }

  std::unique_lock lock(lifecycle_mutex_, std::defer_lock);
  if (!lock.try_lock_for(options_.lifecycle_timeout)) {
    return error_response(engine_timeout("timed out waiting for another weight-sync call to finish"));
  }
  const CallOptions call_options{options_.lifecycle_timeout, true};
  Response response;

  if (route.operation == Operation::kUpdateWeightVersion) {
    const std::string args = wire::encode_string_array({*version});
    FanOut set = fan_out("set_weight_version", route.metric_operation, "set_weight_version",
                         {args}, call_options);
    response.engine_seconds = set.seconds;
    if (set.error) return error_response(*set.error, response.engine_seconds);
    known_.set_version_all(*version);
    response.body = "{\"success\":true,\"new_version\":" + wire::json_string(*version) + "}";
    return response;
  }

  const std::string header = collective_rpc_header(route.worker_method, kwarg);
  engine::EngineClient::ArgParts args{header};
  if (!value.empty()) args.push_back(value);
  FanOut call = fan_out(route.worker_method, route.metric_operation, route.engine_method, args,
                        call_options);
  response.engine_seconds = call.seconds;
  if (call.error) return error_response(*call.error, call.seconds);

  if (route.operation == Operation::kFinishWeightUpdate && version) {
    // Commit the version only now that every engine finished; a failure here is reported as
    // set_weight_version's, so the trainer can tell it from a failed finish.
    const std::string version_args = wire::encode_string_array({*version});
    FanOut set = fan_out("set_weight_version", "set_version", "set_weight_version",
                         {version_args}, call_options);
    response.engine_seconds += set.seconds;
    if (set.error) return error_response(*set.error, response.engine_seconds);
    known_.set_version_all(*version);
  }
  response.body = message_body(route.success_message);
  return response;
}

// Seeds newly admitted engines in the known state; the engines' snapshot is copied only when
// an admission happened since (reads call this on every request).
void WeightSyncService::sync_known() {
  const std::uint64_t admissions = engines_.admissions();
  if (admissions == synced_admissions_.load()) return;
  known_.sync(engines_.engines());
  synced_admissions_ = admissions;
}

bool WeightSyncService::answers_at_once(Operation operation) const {
  switch (operation) {
    case Operation::kHealth:
    case Operation::kVersion:
    case Operation::kWorldSize: return true;
    case Operation::kWeightInfo: return calls_in_flight_.load() > 0 || known_.version_certain();
    case Operation::kIsPaused: return calls_in_flight_.load() > 0 || known_.paused_certain();
    default: return false;
  }
}

Response WeightSyncService::handle_without_waiting(const Route& route, const Query& query) {
  if (route.operation == Operation::kWeightInfo || route.operation == Operation::kIsPaused) {
    return read_only(route, query, false);
  }
  std::string no_body;
  return handle(route, query, no_body);
}

Response WeightSyncService::read_only(const Route& route, const Query& query, bool may_wait) {
  const bool is_version = route.operation == Operation::kWeightInfo;
  // The engine runs utility calls one at a time, so a query sent while an update blocks it
  // would wait for the update. Answer from what the engines last told us instead, and
  // whenever that is certain (no call that changes it has been made since, or failed): a
  // round trip would return the same.
  const bool reads_state = is_version || route.operation == Operation::kIsPaused;
  if (reads_state) sync_known();
  const bool certain = is_version ? known_.version_certain() : known_.paused_certain();
  if (reads_state && (certain || !may_wait || calls_in_flight_.load() > 0)) {
    if (!is_version) {
      return {200, std::string("{\"is_paused\":") + (known_.paused() ? "true" : "false") + "}"};
    }
    auto version = known_.version();
    if (!version) return error_response(server_error(version.error()));
    return {200, "{\"weight_version\":" + wire::json_string(*version) + "}"};
  }

  std::string args = "\x90";  // []
  CallOptions call_options{options_.query_timeout, false};
  if (route.operation == Operation::kPause) {
    auto mode = pause_mode(query);
    if (!mode) return error_response(mode.error());
    auto clear_cache = query_bool(query, "clear_cache", true);
    if (!clear_cache) return error_response(clear_cache.error());
    args = pause_args(*mode, *clear_cache);
    call_options.timeout = options_.lifecycle_timeout;  // mode=wait drains running requests
  } else if (route.operation == Operation::kResume) {
    call_options.timeout = options_.lifecycle_timeout;
  }

  FanOut call = fan_out(route.engine_method, "", route.engine_method, {args}, call_options);
  if (call.error) return error_response(*call.error, call.seconds);
  Response response;
  response.engine_seconds = call.seconds;

  switch (route.operation) {
    case Operation::kWeightInfo: {
      std::optional<std::string> agreed;
      std::string seen;
      for (const EngineReply& reply : call.replies) {
        auto version = decode_string(*reply.value);
        if (!version) {
          return error_response(server_error("failed to call get_weight_version: engine rank " +
                                             std::to_string(reply.rank) +
                                             " returned a non-string version"));
        }
        if (!seen.empty()) seen += ", ";
        seen += "rank " + std::to_string(reply.rank) + " '" + *version + "'";
        if (agreed && *agreed != *version) {
          return error_response(server_error("engines disagree on the weight version: " + seen));
        }
        agreed = *version;
        known_.set_version(reply.rank, *version);
      }
      response.body = "{\"weight_version\":" + wire::json_string(agreed.value_or("")) + "}";
      return response;
    }
    case Operation::kIsPaused: {
      bool paused = false;
      for (const EngineReply& reply : call.replies) {
        auto value = decode_bool(*reply.value);
        if (!value) {
          return error_response(server_error("failed to call is_scheduler_paused: engine rank " +
                                             std::to_string(reply.rank) +
                                             " returned a non-boolean"));
        }
        paused = paused || *value;
        known_.set_paused(reply.rank, *value);
      }
      response.body = std::string("{\"is_paused\":") + (paused ? "true" : "false") + "}";
      return response;
    }
    case Operation::kPause:
    case Operation::kResume: {
      const bool paused = route.operation == Operation::kPause;
      known_.set_paused_all(paused);
      response.body = paused ? R"({"status":"paused"})" : R"({"status":"resumed"})";
      return response;
    }
    default: return error_response(not_found());
  }
}

Response WeightSyncService::health() const {
  std::string problems;
  for (const auto& engine : engines_.engines()) {
    if (engine.state == engine::EngineState::kReady) continue;
    if (!problems.empty()) problems += "; ";
    problems += "engine rank " + std::to_string(engine.rank) + " is " +
                std::string(engine::state_name(engine.state));
    if (!engine.reason.empty()) problems += " (" + engine.reason + ")";
  }
  if (problems.empty()) return {200, ""};
  return error_response(engine_unavailable(problems));
}

Response WeightSyncService::version() const {
  std::string body = "{\"version\":" + wire::json_string(kVersion);
  for (const auto& engine : engines_.engines()) {
    if (engine.registration.vllm_version) {
      body += ",\"vllm_version\":" + wire::json_string(*engine.registration.vllm_version);
      break;
    }
  }
  return {200, body + "}"};
}

Response WeightSyncService::world_size(const Query& query) const {
  auto include_dp = query_bool(query, "include_dp", true);
  if (!include_dp) return error_response(include_dp.error());
  const auto engines = engines_.engines();
  for (const auto& engine : engines) {
    if (engine.state != engine::EngineState::kReady) {
      return error_response(engine_unavailable("engine rank " + std::to_string(engine.rank) +
                                               " is " + std::string(engine::state_name(engine.state))));
    }
  }
  const std::int64_t per_engine =
      engines.front().registration.world_size.value_or(options_.world_size_fallback);
  const std::int64_t total =
      *include_dp ? per_engine * static_cast<std::int64_t>(engines.size()) : per_engine;
  return {200, "{\"world_size\":" + std::to_string(total) + "}"};
}

}  // namespace vllmd::api
