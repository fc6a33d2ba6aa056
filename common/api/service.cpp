#include "common/api/service.hpp"

#include <algorithm>

#include "common/api/replies.hpp"
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

std::string pause_args(const std::string& mode, bool clear_cache) {
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  packer.pack_array(2);
  wire::pack_str(packer, mode);
  packer.pack(clear_cache);
  return buffer.take();
}

}  // namespace

WeightSyncService::WeightSyncService(engine::EngineClient& engines, ServiceOptions options,
                                     util::Executor* executor)
    : engines_(engines), options_(options), lifecycle_queue_(executor),
      sessions_(options.session_idle_timeout) {}

void WeightSyncService::fan_out(std::string operation_name, std::string metric,
                                std::string engine_method,
                                const engine::EngineClient::ArgParts& args,
                                const CallOptions& options, const std::vector<int>& ranks,
                                std::function<void(FanOut)> then) {
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
    if (observer_ && !metric.empty() && reached_engine) observer_(metric, result.seconds);
    if (result.error) log::warning(result.error->message);
    then(std::move(result));
  };
  if (ranks.empty()) {
    engines_.call_all_async(engine_method, args, options, std::move(completion));
  } else {
    engines_.call_ranks_async(ranks, engine_method, args, options, std::move(completion));
  }
}

void WeightSyncService::handle(const Route& route, const Query& query, std::string body,
                               RequestContext context, Done done) {
  switch (route.operation) {
    case Operation::kHealth: return done(health());
    case Operation::kVersion: return done(version());
    case Operation::kWorldSize: return done(world_size(query));
    case Operation::kWeightInfo:
    case Operation::kIsPaused: return read(route, std::move(done));
    case Operation::kPause:
    case Operation::kResume: return scheduler(route, query, std::move(done));
    case Operation::kSessionStatus: return done({200, sessions_.snapshot().json()});
    case Operation::kMetrics:
    case Operation::kReload: return done(error_response(not_found()));  // the daemon's own
    default: return lifecycle(route, std::move(body), std::move(context.session), std::move(done));
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

bool WeightSyncService::answers_at_once(Operation operation) const {
  switch (operation) {
    case Operation::kHealth:
    case Operation::kVersion:
    case Operation::kSessionStatus:
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
    case Operation::kSessionStatus: return {200, sessions_.snapshot().json()};
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
          call_options, {}, [this, is_version, done](FanOut call) {
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
  const std::string method(route.engine_method);
  fan_out(method, "", method, {args}, call_options, {},
          [this, pause, method, args, done](FanOut call) {
            std::vector<int> missed;  // unreachable: they get it as soon as they are ready again
            {
              std::lock_guard lock(scheduler_mutex_);
              for (const EngineReply& reply : call.replies) {
                if (!reply.value && reply.value.error().kind == CallErrorKind::kUnavailable) {
                  undelivered_scheduler_[reply.rank] = {method, args};
                  missed.push_back(reply.rank);
                } else {
                  undelivered_scheduler_.erase(reply.rank);  // this newer call reached it
                }
              }
            }
            for (const EngineReply& reply : call.replies) {
              if (reply.value) known_.set_paused(reply.rank, call.sequence, pause);
            }
            if (call.error) {
              std::string note;
              if (!missed.empty()) {
                note = std::string("generation may still be ") + (pause ? "running" : "paused") +
                       " on " + rank_list(missed) + ": vllmd " + (pause ? "pauses" : "resumes") +
                       " it as soon as it answers again";
              } else {
                note = std::string("generation may still be ") + (pause ? "running" : "paused") +
                       " where the call did not succeed";
              }
              ApiError error = *call.error;
              error.message += "; " + note;
              return done(error_response(error, call.seconds));
            }
            Response response;
            response.engine_seconds = call.seconds;
            response.body = pause ? R"({"status":"paused"})" : R"({"status":"resumed"})";
            done(std::move(response));
          });
}

// A pause or resume that could not reach an engine goes out once it is ready again, and so
// does the close of a session it may still hold (in the lifecycle queue, before any start).
void WeightSyncService::on_engine_state(const engine::EngineStatus& engine) {
  if (engine.state != engine::EngineState::kReady) return;
  bool close_pending = false;
  {
    std::lock_guard lock(pending_closes_mutex_);
    close_pending = pending_closes_.count(engine.rank) > 0;
  }
  if (close_pending) {
    lifecycle_queue_.run([this](SerialQueue::Finished finished) { flush_pending_closes(finished); },
                         options_.lifecycle_timeout, [] {});
  }
  std::pair<std::string, std::string> call;
  {
    std::lock_guard lock(scheduler_mutex_);
    const auto found = undelivered_scheduler_.find(engine.rank);
    if (found == undelivered_scheduler_.end()) return;
    call = found->second;
  }
  const int rank = engine.rank;
  const CallOptions call_options{options_.lifecycle_timeout, false};
  fan_out(call.first, "", call.first, {call.second}, call_options, {rank},
          [this, rank, call](FanOut result) {
            const EngineReply& reply = result.replies.front();
            {
              std::lock_guard lock(scheduler_mutex_);
              const auto found = undelivered_scheduler_.find(rank);
              if (found == undelivered_scheduler_.end() || found->second != call) return;
              if (!reply.value && reply.value.error().kind == CallErrorKind::kUnavailable) return;
              undelivered_scheduler_.erase(found);
            }
            if (reply.value) {
              known_.set_paused(rank, result.sequence, call.first == "pause_scheduler");
              log::notice("delivered ", call.first, " to engine rank ", rank,
                          " now that it answers again");
            } else {
              log::warning("engine rank ", rank, " refused the ", call.first,
                           " it could not be given earlier: ", reply.value.error().message);
            }
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
                                               " is " +
                                               std::string(engine::state_name(engine.state))));
    }
  }
  const std::int64_t per_engine =
      engines.front().registration.world_size.value_or(options_.world_size_fallback);
  const std::int64_t total =
      *include_dp ? per_engine * static_cast<std::int64_t>(engines.size()) : per_engine;
  return {200, "{\"world_size\":" + std::to_string(total) + "}"};
}

}  // namespace vllmd::api
