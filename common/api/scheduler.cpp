// Pause and resume of WeightSyncService: engine calls outside the lifecycle queue. One that
// could not reach an engine (disconnected, or dead after a timeout) is remembered and
// delivered as soon as the engine is ready again; the response says generation may still be
// paused (or running) meanwhile.

#include "common/api/replies.hpp"
#include "common/api/service.hpp"
#include "common/util/log.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

using engine::CallErrorKind;
using engine::CallOptions;
using engine::EngineReply;

namespace {

std::string still_note(bool pause, const std::vector<int>& missed) {
  const std::string state = pause ? "running" : "paused";
  if (missed.empty()) return "generation may still be " + state + " where the call did not succeed";
  return "generation may still be " + state + " on " + rank_list(missed) + ": vllmd " +
         (pause ? "pauses" : "resumes") + " it as soon as it answers again";
}

}  // namespace

void WeightSyncService::scheduler(const CallPtr& call, const Done& done) {
  const Route& route = *call->route;
  const bool pause = route.operation == Operation::kPause;
  // mode=wait drains running requests: as long as a lifecycle call may take.
  const CallOptions call_options{options_.lifecycle_timeout, false};
  const std::string method(route.engine_method);
  fan_out(method, "", method, {call->engine_args}, call_options, route.changes, {},
          [this, pause, method, args = call->engine_args, done](FanOut result) {
            std::vector<int> missed;  // unreachable: they get it as soon as they are ready again
            {
              std::lock_guard lock(scheduler_mutex_);
              for (const EngineReply& reply : result.replies) {
                if (!reply.value && reply.value.error().kind == CallErrorKind::kUnavailable) {
                  undelivered_scheduler_[reply.rank] = {method, args};
                  missed.push_back(reply.rank);
                } else {
                  undelivered_scheduler_.erase(reply.rank);  // this newer call reached it
                }
              }
            }
            for (const EngineReply& reply : result.replies) {
              if (reply.value) known_.set_paused(reply.rank, result.sequence, pause);
            }
            if (result.error) {
              ApiError error = *result.error;
              error.message += "; " + still_note(pause, missed);
              return done(error_response(error, result.seconds));
            }
            Response response{200, pause ? R"({"status":"paused"})" : R"({"status":"resumed"})"};
            response.engine_seconds = result.seconds;
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
    lifecycle_queue_.run(
        [this](const SerialQueue::Finished& finished) { flush_pending_closes(finished); },
        options_.lifecycle_timeout, [] {});
  }
  std::pair<std::string, std::string> call;
  {
    std::lock_guard lock(scheduler_mutex_);
    const auto found = undelivered_scheduler_.find(engine.rank);
    if (found == undelivered_scheduler_.end()) return;
    call = found->second;
  }
  deliver_scheduler(engine.rank, call);
}

void WeightSyncService::deliver_scheduler(int rank,
                                          const std::pair<std::string, std::string>& call) {
  const CallOptions call_options{options_.lifecycle_timeout, false};
  fan_out(call.first, "", call.first, {call.second}, call_options, Changes::kPaused, {rank},
          [this, rank, call](FanOut result) {
            const EngineReply& reply = result.replies.front();
            {
              std::lock_guard lock(scheduler_mutex_);
              const auto found = undelivered_scheduler_.find(rank);
              if (found == undelivered_scheduler_.end() || found->second != call) return;
              if (!reply.value && reply.value.error().kind == CallErrorKind::kUnavailable) return;
              undelivered_scheduler_.erase(found);
            }
            if (!reply.value) {
              util::log::warning("engine rank ", rank, " refused the ", call.first,
                                 " it could not be given earlier: ", reply.value.error().message);
              return;
            }
            known_.set_paused(rank, result.sequence, call.first == "pause_scheduler");
            util::log::notice("delivered ", call.first, " to engine rank ", rank,
                              " now that it answers again");
          });
}

}  // namespace vllmd::api
