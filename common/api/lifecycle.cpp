// The weight-update lifecycle of WeightSyncService: init, start, update, finish (with a
// version), set version. Calls run one at a time (SerialQueue). A session belongs to the
// engine incarnations it was started on: when one of them restarts the session is lost,
// nothing is committed, and vllmd closes the survivors' sessions so that the next start
// works on every rank. After a call that failed on some ranks the same recovery brings every
// rank back to "no session".

#include <algorithm>

#include "common/api/replies.hpp"
#include "common/api/service.hpp"
#include "common/util/log.hpp"
#include "common/wire/json_text.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

using engine::CallErrorKind;
using engine::CallOptions;
using engine::EngineReply;

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

// A finish to a rank without a session says so: for closing, that is as good as closed.
bool session_already_closed(const engine::CallError& error) {
  return error.kind == CallErrorKind::kFailed &&
         error.message.find("without a matching start_weight_update") != std::string::npos;
}

Response with_note(ApiError error, const std::string& note, double seconds) {
  error.message += "; " + note;
  return error_response(error, seconds);
}

}  // namespace

// Validated before it may wait (handle(): a bad request never waits and never reaches an
// engine), then run in its turn.
void WeightSyncService::enqueue(const CallPtr& call, const Done& done) {
  const Handler handler = call->route->handler;
  lifecycle_queue_.run(
      [this, call, handler, done](const SerialQueue::Finished& finished) {
        (this->*handler)(call, [done, finished](Response response) {
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

void WeightSyncService::forward_to_workers(const CallPtr& call, const Done& done) {
  forward(*call, {}, [call, done](FanOut result) {
    if (result.error) return done(error_response(*result.error, result.seconds));
    done(succeeded_response(*call->route, result.seconds));
  });
}

void WeightSyncService::set_version_label(const CallPtr& call, const Done& done) {
  commit_version(*call->text, 0, {}, [version = *call->text, done](Response response) {
    if (response.status == 200) {
      response.body = "{\"success\":true,\"new_version\":" + wire::json_string(version) + "}";
    }
    done(std::move(response));
  });
}

Response WeightSyncService::succeeded_response(const Route& route, double seconds) {
  Response response;
  response.engine_seconds = seconds;
  response.body = message_body(route.success_message);
  return response;
}

// The call's worker method through collective_rpc on every engine, only to the engine
// incarnations given (by rank; empty: any).
void WeightSyncService::forward(const Call& call, std::vector<std::uint64_t> incarnations,
                                std::function<void(FanOut)> then) {
  const Route& route = *call.route;
  // The validated member goes on as the worker method's keyword argument (init_info, ...).
  const bool passed_on =
      route.member_kind == Member::kObject || route.member_kind == Member::kObjectOrList;
  const std::string header =
      collective_rpc_header(route.worker_method, passed_on ? route.member : std::string_view());
  engine::EngineCalls::ArgParts args{header};
  if (!call.value.empty()) args.push_back(call.value);
  CallOptions options{options_.lifecycle_timeout, true};
  options.incarnations = std::move(incarnations);
  fan_out(std::string(route.worker_method), std::string(route.metric),
          std::string(route.engine_method), args, options, Changes::kNothing, {}, std::move(then));
}

void WeightSyncService::start(const CallPtr& call, const Done& done) {
  // A session lost to a restarted rank is closed on the others, and the start says so: left
  // open there, it would make them refuse this start while the new process takes it.
  if (!continue_session(*call, done)) return;
  // A rank that may still hold a session vllmd gave up on is closed first, or it would refuse.
  flush_pending_closes([this, call, done] {
    // A rank still unreachable would refuse the start ("already active") once back, maybe
    // before the start is sent to it: no rank gets the start until that one is closed.
    if (const std::vector<int> unclosed = unclosed_ranks(); !unclosed.empty()) {
      return done(error_response(engine_unavailable(
          "failed to call " + std::string(call->route->worker_method) + ": " + rank_list(unclosed) +
          " may still hold a weight-update session that vllmd could not close (unreachable); "
          "vllmd closes it when the rank answers again; no session was opened")));
    }
    const std::vector<std::uint64_t> incarnations = current_incarnations();
    const bool was_open = sessions_.is_open();
    forward(*call, incarnations, [this, call, incarnations, was_open, done](FanOut result) {
      const bool draft = call->route->operation == Operation::kStartDraftWeightUpdate;
      if (!result.error) {
        sessions_.opened(call->session, draft, incarnations);
        return done(succeeded_response(*call->route, result.seconds));
      }
      // The ranks that did start (or may have: the reply was lost) hold a session the others
      // do not: close theirs. Not while a session was open: every rank holds that one, and
      // refused (or would have) this start.
      std::vector<int> started;
      for (const EngineReply& reply : result.replies) {
        if (reply.value || reply.value.error().sent) started.push_back(reply.rank);
      }
      if (started.empty() || was_open) return done(error_response(*result.error, result.seconds));
      close_sessions(started, incarnations, [result, done](const std::string& outcome) {
        done(with_note(*result.error, "no session was opened: " + outcome, result.seconds));
      });
    });
  });
}

// Closes the sessions of ranks that were unreachable when vllmd closed them, now that they
// answer again (same incarnation; a restarted one holds no session), then runs `then`.
void WeightSyncService::flush_pending_closes(const std::function<void()>& then) {
  const std::vector<engine::EngineStatus> engines = engines_.engines();
  std::vector<int> ranks;
  std::vector<std::uint64_t> incarnations;
  incarnations.reserve(engines.size());
  for (const engine::EngineStatus& engine : engines) incarnations.push_back(engine.incarnation);
  {
    std::lock_guard lock(pending_closes_mutex_);
    for (auto it = pending_closes_.begin(); it != pending_closes_.end();) {
      const auto& engine = engines[static_cast<std::size_t>(it->first)];
      if (engine.incarnation != it->second) {
        it = pending_closes_.erase(it);  // a new process: no session to close
        continue;
      }
      if (engine.state == engine::EngineState::kReady) ranks.push_back(it->first);
      ++it;
    }
  }
  if (ranks.empty()) return then();
  close_sessions(ranks, incarnations, [then](const std::string&) { then(); });
}

// The ranks that may still hold a session vllmd closed elsewhere: unreachable when it did, and
// still the same process.
std::vector<int> WeightSyncService::unclosed_ranks() const {
  std::vector<int> ranks;
  {
    std::lock_guard lock(pending_closes_mutex_);
    if (pending_closes_.empty()) return ranks;  // as good as always: no status snapshot then
  }
  const std::vector<std::uint64_t> now = current_incarnations();
  std::lock_guard lock(pending_closes_mutex_);
  for (const auto& [rank, incarnation] : pending_closes_) {
    const auto index = static_cast<std::size_t>(rank);
    if (index < now.size() && now[index] == incarnation) ranks.push_back(rank);
  }
  return ranks;
}

// Whether the caller may start, or go on with the open session (or none): a conflict, or a
// session lost to a restarted engine, is answered here. The session's incarnations when it may.
std::optional<std::vector<std::uint64_t>> WeightSyncService::continue_session(const Call& call,
                                                                              const Done& done) {
  if (auto conflict = sessions_.conflict(call.session)) {
    done(error_response(*conflict));
    return std::nullopt;
  }
  if (auto asleep = weights_asleep()) {
    done(error_response(*asleep));
    return std::nullopt;
  }
  std::vector<std::uint64_t> session = sessions_.incarnations();
  if (auto restarted = restarted_ranks(session); !restarted.empty()) {
    lose(restarted, session, true, 0, done);
    return std::nullopt;
  }
  return session;
}

void WeightSyncService::update(const CallPtr& call, const Done& done) {
  const auto continued = continue_session(*call, done);
  if (!continued) return;
  const std::vector<std::uint64_t>& session = *continued;
  forward(*call, session, [this, call, session, done](FanOut result) {
    const bool reached =
        std::any_of(result.replies.begin(), result.replies.end(), [](const EngineReply& reply) {
          return reply.value || reply.value.error().kind != CallErrorKind::kUnavailable;
        });
    if (reached) sessions_.updated(!result.error);  // the weights may differ from the label now
    if (!result.error) return done(succeeded_response(*call->route, result.seconds));
    if (session.empty()) return done(error_response(*result.error, result.seconds));
    if (auto restarted = restarted_ranks(session); !restarted.empty()) {
      return lose(restarted, session, true, result.seconds, done);
    }
    // vLLM ends the session on a worker whose update failed and keeps it on the others (and
    // on the other TP workers of the same engine): close it everywhere.
    sessions_.closed();
    close_sessions(all_ranks(), session, [result, done](const std::string& outcome) {
      done(with_note(*result.error, "nothing was committed, and " + outcome, result.seconds));
    });
  });
}

void WeightSyncService::finish(const CallPtr& call, const Done& done) {
  const auto continued = continue_session(*call, done);
  if (!continued) return;
  const std::vector<std::uint64_t>& session = *continued;
  forward(*call, session, [this, call, session, done](const FanOut& result) {
    if (auto restarted = restarted_ranks(session); !restarted.empty()) {
      // The finishes that succeeded were on processes that are gone or on survivors: either
      // way the engines do not all hold this session's weights. Nothing is committed.
      return lose(restarted, session, static_cast<bool>(result.error), result.seconds, done);
    }
    if (result.error) {
      sessions_.closed();
      // vLLM keeps the session open on a worker whose finish failed: close it there (not
      // where it failed for want of a session, as when another client finished it).
      std::vector<int> failed;
      for (const EngineReply& reply : result.replies) {
        if (!reply.value && !session_already_closed(reply.value.error())) {
          failed.push_back(reply.rank);
        }
      }
      const std::vector<int> finished = succeeded(result.replies);
      const std::string done_ranks =
          finished.empty() ? "no rank finished" : rank_list(finished) + " finished";
      return close_sessions(
          failed, session, [result, done, done_ranks](const std::string& outcome) {
            done(with_note(*result.error,
                           "nothing was committed; " + done_ranks + ", and " + outcome,
                           result.seconds));
          });
    }
    sessions_.closed();
    if (!call->text) return done(succeeded_response(*call->route, result.seconds));
    // Commit the version only now that every engine finished, and only on the engine
    // incarnations that held the session; a failure here is reported as set_weight_version's,
    // so the trainer can tell it from a failed finish.
    commit_version(*call->text, result.seconds, session, [call, done](Response response) {
      if (response.status == 200) response.body = message_body(call->route->success_message);
      done(std::move(response));
    });
  });
}

// set_weight_version on every engine; on success the known state holds `version`, and the
// version labels the weights again.
void WeightSyncService::commit_version(const std::string& version, double seconds_before,
                                       std::vector<std::uint64_t> incarnations, const Done& done) {
  const std::string args = wire::encode_string_array({version});
  CallOptions options{options_.lifecycle_timeout, true};
  options.incarnations = std::move(incarnations);
  fan_out("set_weight_version", "set_version", "set_weight_version", {args}, options,
          Changes::kVersion, {}, [this, version, seconds_before, done](FanOut set) {
            const double seconds = seconds_before + set.seconds;
            if (set.error) {
              std::vector<int> unknown;  // sent, but the answer was lost: it may have applied
              for (const EngineReply& reply : set.replies) {
                if (!reply.value && reply.value.error().sent) unknown.push_back(reply.rank);
              }
              if (unknown.empty()) return done(error_response(*set.error, seconds));
              return done(with_note(*set.error,
                                    "the version may have been applied on " + rank_list(unknown) +
                                        " before its answer was lost: GET /weight_info tells",
                                    seconds));
            }
            known_.set_version_all(set.sequence, version);
            if (committed_ != nullptr) committed_->commit(version);
            sessions_.committed();
            Response response;
            response.engine_seconds = seconds;
            done(std::move(response));
          });
}

// A session whose engines restarted: nothing is committed; the survivors' sessions are closed
// (when they may still be open) so that the next start works everywhere.
void WeightSyncService::lose(const std::vector<int>& restarted,
                             const std::vector<std::uint64_t>& session, bool survivors_open,
                             double seconds, const Done& done) {
  sessions_.closed();
  const std::vector<std::uint64_t> now = current_incarnations();
  std::string message = rank_list(restarted) + " restarted during the weight-update session (";
  for (std::size_t i = 0; i < restarted.size(); ++i) {
    const auto rank = static_cast<std::size_t>(restarted[i]);
    message += (i > 0 ? ", " : "") + std::string("rank ") + std::to_string(rank) +
               ": incarnation " + std::to_string(session[rank]) + ", now " +
               std::to_string(now[rank]);
  }
  message += "); nothing was committed";
  util::log::warning(message);
  std::vector<int> survivors;
  for (std::size_t rank = 0; rank < session.size(); ++rank) {
    if (std::find(restarted.begin(), restarted.end(), static_cast<int>(rank)) == restarted.end()) {
      survivors.push_back(static_cast<int>(rank));
    }
  }
  if (!survivors_open || survivors.empty()) {
    return done(error_response(engine_unavailable(message), seconds));
  }
  close_sessions(survivors, session, [message, seconds, done](const std::string& outcome) {
    done(error_response(engine_unavailable(message + ", and " + outcome), seconds));
  });
}

// Finish without a version on `ranks`, to bring them back to "no session"; `then` gets what
// came of it, for the error message.
void WeightSyncService::close_sessions(
    const std::vector<int>& ranks, std::vector<std::uint64_t> incarnations,
    const std::function<void(const std::string& outcome)>& then) {
  if (ranks.empty()) return then("no session was left open");
  const std::string header = collective_rpc_header("finish_weight_update", "");
  CallOptions options{options_.lifecycle_timeout, true};
  options.incarnations = std::move(incarnations);
  fan_out("finish_weight_update", "", "collective_rpc", {header}, options, Changes::kNothing, ranks,
          [this, then, incarnations = options.incarnations](const FanOut& result) {
            const std::string outcome = close_outcome(result.replies, incarnations);
            util::log::notice("weight-update session recovery: ", outcome);
            then(outcome);
          });
}

// What closing achieved, for the error message; a rank it could not reach is remembered
// (pending_closes_) and closed when it answers again, if it is still the same process.
std::string WeightSyncService::close_outcome(const std::vector<EngineReply>& replies,
                                             const std::vector<std::uint64_t>& incarnations) {
  std::vector<int> closed;
  std::string open;
  bool retried = false;
  std::lock_guard lock(pending_closes_mutex_);
  for (const EngineReply& reply : replies) {
    const auto rank = static_cast<std::size_t>(reply.rank);
    if (reply.value || session_already_closed(reply.value.error())) {
      closed.push_back(reply.rank);
      pending_closes_.erase(reply.rank);
      continue;
    }
    // Unknown outcome (unreachable, no answer, an undecodable answer): close it again later.
    const engine::CallError& error = reply.value.error();
    if ((error.kind != CallErrorKind::kFailed || error.sent) && rank < incarnations.size()) {
      pending_closes_[reply.rank] = incarnations[rank];
      retried = true;
    }
    open += (open.empty() ? "" : "; ") + std::string("engine rank ") + std::to_string(reply.rank) +
            " may still hold it (" + reply.value.error().message + ")";
  }
  if (retried) open += "; vllmd closes it when the rank answers again";
  std::string outcome;
  if (!closed.empty()) outcome = "the session was closed on " + rank_list(closed);
  if (!open.empty()) outcome += (outcome.empty() ? "" : "; ") + open;
  return outcome;
}

std::vector<std::uint64_t> WeightSyncService::current_incarnations() const {
  std::vector<std::uint64_t> incarnations;
  for (const engine::EngineStatus& engine : engines_.engines()) {
    incarnations.push_back(engine.incarnation);
  }
  return incarnations;
}

// The ranks whose engine is no longer the incarnation the session started on.
std::vector<int> WeightSyncService::restarted_ranks(
    const std::vector<std::uint64_t>& session) const {
  std::vector<int> restarted;
  if (session.empty()) return restarted;
  const std::vector<std::uint64_t> now = current_incarnations();
  for (std::size_t rank = 0; rank < session.size() && rank < now.size(); ++rank) {
    if (now[rank] != session[rank]) restarted.push_back(static_cast<int>(rank));
  }
  return restarted;
}

std::vector<int> WeightSyncService::all_ranks() const {
  std::vector<int> ranks(static_cast<std::size_t>(engines_.data_parallel_size()));
  for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
  return ranks;
}

}  // namespace vllmd::api
