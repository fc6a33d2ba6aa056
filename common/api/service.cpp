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

// The version every engine reported, or the error: a non-string or a disagreement.
tl::expected<std::string, ApiError> agreed_version(const std::vector<EngineReply>& replies) {
  std::optional<std::string> agreed;
  std::string seen;
  for (const EngineReply& reply : replies) {
    auto version = decode_string(*reply.value);
    if (!version) {
      return tl::unexpected(server_error("failed to call get_weight_version: engine rank " +
                                         std::to_string(reply.rank) +
                                         " returned a non-string version"));
    }
    if (!seen.empty()) seen += ", ";
    seen += "rank " + std::to_string(reply.rank) + " '" + *version + "'";
    if (agreed && *agreed != *version) {
      return tl::unexpected(server_error("engines disagree on the weight version: " + seen));
    }
    agreed = *version;
  }
  return agreed.value_or("");
}

}  // namespace

// One lifecycle call, validated: what its engine calls need, kept alive until they are sent.
struct WeightSyncService::LifecycleCall {
  const Route* route = nullptr;
  std::optional<wire::Transcoded> document;
  std::string_view value;  // the validated init_info / update_info, inside `document`
  std::string kwarg;
  std::optional<std::string> version;
};

WeightSyncService::WeightSyncService(engine::EngineClient& engines, ServiceOptions options,
                                     util::Executor* executor)
    : engines_(engines), options_(options), lifecycle_queue_(executor) {}

void WeightSyncService::fan_out(std::string operation_name, std::string metric,
                                std::string engine_method,
                                const engine::EngineClient::ArgParts& args,
                                const CallOptions& options, std::function<void(FanOut)> then) {
  const auto started = std::chrono::steady_clock::now();
  sync_known();
  // In flight first: readers then never see a value both uncertain and without a call to
  // wait behind (answers_at_once relies on it).
  ++calls_in_flight_;
  const std::uint64_t sequence = known_.next_sequence();
  // Until this call succeeds, nobody knows what the engines hold.
  if (engine_method == "set_weight_version") known_.changing_version(sequence);
  if (engine_method == "pause_scheduler" || engine_method == "resume_scheduler") {
    known_.changing_paused(sequence);
  }
  engines_.call_all_async(
      engine_method, args, options,
      [this, started, sequence, operation_name = std::move(operation_name),
       metric = std::move(metric), then = std::move(then)](std::vector<EngineReply> replies) {
        --calls_in_flight_;
        FanOut result;
        result.sequence = sequence;
        result.replies = std::move(replies);
        result.seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        result.error = summarize(operation_name, result.replies);
        const bool reached_engine = std::any_of(
            result.replies.begin(), result.replies.end(), [](const EngineReply& reply) {
              return reply.value || reply.value.error().kind != CallErrorKind::kUnavailable;
            });
        if (observer_ && !metric.empty() && reached_engine) observer_(metric, result.seconds);
        if (result.error) log::warning(result.error->message);
        then(std::move(result));
      });
}

void WeightSyncService::handle(const Route& route, const Query& query, std::string body,
                               Done done) {
  switch (route.operation) {
    case Operation::kHealth: return done(health());
    case Operation::kVersion: return done(version());
    case Operation::kWorldSize: return done(world_size(query));
    case Operation::kWeightInfo:
    case Operation::kIsPaused: return read(route, std::move(done));
    case Operation::kPause:
    case Operation::kResume: return scheduler(route, query, std::move(done));
    case Operation::kMetrics:
    case Operation::kReload: return done(error_response(not_found()));  // the daemon's own
    default: return lifecycle(route, std::move(body), std::move(done));
  }
}

void WeightSyncService::lifecycle(const Route& route, std::string body, Done done) {
  // Validate before queueing: a bad request never waits and never reaches an engine.
  auto call = std::make_shared<LifecycleCall>();
  call->route = &route;
  if (route.body == Body::kRequired || (route.body == Body::kOptional && !body.empty())) {
    auto parsed = parse_object_body(body);
    if (!parsed) return done(error_response(parsed.error()));
    call->document = std::move(*parsed);
    std::string().swap(body);  // the msgpack holds everything now
  }
  const wire::Transcoded* document = call->document ? &*call->document : nullptr;
  if (route.operation == Operation::kInitWeightTransfer) {
    auto info = init_info(*document);
    if (!info) return done(error_response(info.error()));
    call->value = *info;
    call->kwarg = "init_info";
  } else if (route.operation == Operation::kUpdateWeights) {
    auto info = update_info(*document);
    if (!info) return done(error_response(info.error()));
    call->value = *info;
    call->kwarg = "update_info";
  } else if (route.operation == Operation::kFinishWeightUpdate && document) {
    auto requested = finish_version(*document);
    if (!requested) return done(error_response(requested.error()));
    call->version = *requested;
  } else if (route.operation == Operation::kUpdateWeightVersion) {
    auto requested = new_version(*document);
    if (!requested) return done(error_response(requested.error()));
    call->version = *requested;
  }
  lifecycle_queue_.run(
      [this, call, done](SerialQueue::Finished finished) {
        run_lifecycle(call, [done, finished](Response response) {
          finished();
          done(std::move(response));
        });
      },
      options_.lifecycle_timeout,
      [done] {
        done(error_response(
            engine_timeout("timed out waiting for another weight-sync call to finish")));
      });
}

void WeightSyncService::run_lifecycle(const std::shared_ptr<LifecycleCall>& call, Done done) {
  const Route& route = *call->route;
  if (route.operation == Operation::kUpdateWeightVersion) {
    return set_version(*call->version, 0, [version = *call->version, done](Response response) {
      if (response.status == 200) {
        response.body = "{\"success\":true,\"new_version\":" + wire::json_string(version) + "}";
      }
      done(std::move(response));
    });
  }
  const std::string header = collective_rpc_header(route.worker_method, call->kwarg);
  engine::EngineClient::ArgParts args{header};
  if (!call->value.empty()) args.push_back(call->value);
  const CallOptions call_options{options_.lifecycle_timeout, true};
  fan_out(std::string(route.worker_method), std::string(route.metric_operation),
          std::string(route.engine_method), args, call_options,
          [this, call, done](FanOut result) {
            if (result.error) return done(error_response(*result.error, result.seconds));
            const Route& finished_route = *call->route;
            if (finished_route.operation == Operation::kFinishWeightUpdate && call->version) {
              // Commit the version only now that every engine finished; a failure here is
              // reported as set_weight_version's, so the trainer can tell it from a failed
              // finish.
              return set_version(*call->version, result.seconds,
                                 [call, done](Response response) {
                                   if (response.status == 200) {
                                     response.body = message_body(call->route->success_message);
                                   }
                                   done(std::move(response));
                                 });
            }
            Response response;
            response.engine_seconds = result.seconds;
            response.body = message_body(finished_route.success_message);
            done(std::move(response));
          });
}

// set_weight_version on every engine; on success the known state holds `version`.
void WeightSyncService::set_version(const std::string& version, double seconds_before,
                                    Done done) {
  const std::string args = wire::encode_string_array({version});
  const CallOptions call_options{options_.lifecycle_timeout, true};
  fan_out("set_weight_version", "set_version", "set_weight_version", {args}, call_options,
          [this, version, seconds_before, done](FanOut set) {
            const double seconds = seconds_before + set.seconds;
            if (set.error) return done(error_response(*set.error, seconds));
            known_.set_version_all(set.sequence, version);
            Response response;
            response.engine_seconds = seconds;
            done(std::move(response));
          });
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
  switch (route.operation) {
    case Operation::kHealth: return health();
    case Operation::kVersion: return version();
    case Operation::kWorldSize: return world_size(query);
    case Operation::kWeightInfo:
    case Operation::kIsPaused:
      if (auto unready = not_ready()) return error_response(*unready);
      sync_known();
      return known_answer(route);
    default: return error_response(server_error("internal error: not a read of known state"));
  }
}

// /weight_info or /is_paused from what the engines last told us.
Response WeightSyncService::known_answer(const Route& route) {
  if (route.operation == Operation::kIsPaused) {
    return {200, std::string("{\"is_paused\":") + (known_.paused() ? "true" : "false") + "}"};
  }
  auto version = known_.version();
  if (!version) return error_response(server_error(version.error()));
  return {200, "{\"weight_version\":" + wire::json_string(*version) + "}"};
}

void WeightSyncService::read(const Route& route, Done done) {
  const bool is_version = route.operation == Operation::kWeightInfo;
  // The engine runs utility calls one at a time, so a query sent while an update blocks it
  // would wait for the update. Answer from what the engines last told us instead, and
  // whenever that is certain (no call that changes it has been made since, or failed): a
  // round trip would return the same.
  // Without every engine attached there is no state to report (nor anyone to ask).
  if (auto unready = not_ready()) return done(error_response(*unready));
  sync_known();
  const bool certain = is_version ? known_.version_certain() : known_.paused_certain();
  if (certain || calls_in_flight_.load() > 0) return done(known_answer(route));
  const CallOptions call_options{options_.query_timeout, false};
  fan_out(std::string(route.engine_method), "", std::string(route.engine_method), {"\x90"},
          call_options, [this, is_version, done](FanOut call) {
            if (call.error) return done(error_response(*call.error, call.seconds));
            Response response;
            response.engine_seconds = call.seconds;
            if (is_version) {
              auto agreed = agreed_version(call.replies);
              if (!agreed) return done(error_response(agreed.error(), call.seconds));
              for (const EngineReply& reply : call.replies) {
                known_.set_version(reply.rank, call.sequence, *agreed);
              }
              response.body = "{\"weight_version\":" + wire::json_string(*agreed) + "}";
              return done(std::move(response));
            }
            bool paused = false;
            for (const EngineReply& reply : call.replies) {
              auto value = decode_bool(*reply.value);
              if (!value) {
                return done(error_response(
                    server_error("failed to call is_scheduler_paused: engine rank " +
                                 std::to_string(reply.rank) + " returned a non-boolean"),
                    call.seconds));
              }
              paused = paused || *value;
              known_.set_paused(reply.rank, call.sequence, *value);
            }
            response.body = std::string("{\"is_paused\":") + (paused ? "true" : "false") + "}";
            done(std::move(response));
          });
}

void WeightSyncService::scheduler(const Route& route, const Query& query, Done done) {
  const bool pause = route.operation == Operation::kPause;
  std::string args = "\x90";  // []
  if (pause) {
    auto mode = pause_mode(query);
    if (!mode) return done(error_response(mode.error()));
    auto clear_cache = query_bool(query, "clear_cache", true);
    if (!clear_cache) return done(error_response(clear_cache.error()));
    args = pause_args(*mode, *clear_cache);
  }
  // mode=wait drains running requests: as long as a lifecycle call may take.
  const CallOptions call_options{options_.lifecycle_timeout, false};
  fan_out(std::string(route.engine_method), "", std::string(route.engine_method), {args},
          call_options, [this, pause, done](FanOut call) {
            if (call.error) return done(error_response(*call.error, call.seconds));
            known_.set_paused_all(call.sequence, pause);
            Response response;
            response.engine_seconds = call.seconds;
            response.body = pause ? R"({"status":"paused"})" : R"({"status":"resumed"})";
            done(std::move(response));
          });
}

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

Response WeightSyncService::health() const {
  if (auto unready = not_ready()) return error_response(*unready);
  return {200, ""};
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
