// The engine client's IO thread, continued: engine states, and the probes that tell a live
// engine from a silent one (vLLM's own frontends have none).
//
// A probe never goes to an engine with a caller's call in flight (an engine serves utility
// calls one at a time: a probe would wait behind a blocked NCCL update):
// - ready and idle for probe_interval: a liveness probe; unanswered within probe_timeout,
//   the engine is dead until it answers;
// - dead by a timeout: the same probe every probe_interval, so it is revived even when the
//   late reply it owes was lost;
// - disconnected: a probe when a connection to the input socket completes its handshake,
//   and every kReconnectProbeEvery; one that cannot be routed yet just waits for the next
//   try. These do not wait for each other: one sent in the moment the old connection's pipe
//   was still there is lost, and the first answer drops the others.

#include "common/engine/client_impl.hpp"
#include "common/util/duration.hpp"
#include "common/util/log.hpp"

namespace vllmd::engine {

namespace {

constexpr auto kReconnectProbeEvery = std::chrono::milliseconds(500);
constexpr std::size_t kMaxReconnectProbes = 4;  // in flight to one engine
constexpr std::string_view kProbeMethod = "is_scheduler_paused";

}  // namespace

void EngineClient::Impl::set_state(EngineSlot& engine, EngineState state, std::string reason) {
  EngineStatus snapshot;
  {
    std::lock_guard lock(state_mutex);
    engine.status.state = state;
    engine.status.reason = std::move(reason);
    snapshot = engine.status;
  }
  state_changed.notify_all();
  if (options.on_state_change) options.on_state_change(snapshot);
  std::shared_ptr<const StateListener> listener;
  {
    std::lock_guard lock(listener_mutex);
    listener = state_listener;
  }
  if (listener) (*listener)(snapshot);
}

void EngineClient::Impl::mark_dead(EngineSlot& engine, const std::string& reason, bool by_timeout) {
  // Only a revivable death (a timeout) may still become a final one.
  if (engine.status.state == EngineState::kDead && (!engine.dead_by_timeout || by_timeout)) {
    return;
  }
  const int rank = engine.status.rank;
  util::log::warning("engine link: engine rank ", rank, " is dead: ", reason);
  engine.dead_by_timeout = by_timeout;
  engine.startup_timed_out = false;
  // A timed-out engine may still be there: keep its connections for its revival.
  if (!by_timeout) engine.input_fd = engine.output_fd = engine.handshake_fd = -1;
  set_state(engine, EngineState::kDead, reason);
  const std::string why = "engine rank " + std::to_string(rank) + " is dead: " + reason;
  fail_pending(rank, CallErrorKind::kUnavailable, why);
  end_requests(rank, Closed::kEngineLost, why);
}

void EngineClient::Impl::mark_disconnected(EngineSlot& engine, const std::string& reason) {
  const int rank = engine.status.rank;
  util::log::warning("engine link: engine rank ", rank, " is disconnected: ", reason,
                     "; probing it until ZeroMQ has reconnected it");
  engine.input_fd = -1;
  const std::string status_reason = reason + "; waiting for it to reconnect";
  set_state(engine, EngineState::kDisconnected, status_reason);
  const std::string why =
      "engine rank " + std::to_string(rank) + " is disconnected (" + status_reason + ")";
  fail_pending(rank, CallErrorKind::kUnavailable, why);
  // It can no longer be told to abort them, and may be gone for good: end them now.
  end_requests(rank, Closed::kEngineLost, why);
  // Not at once: the dropped connection's pipe may linger for a moment and swallow it.
  engine.next_probe = Clock::now() + kReconnectProbeEvery;  // after fail_pending, which sets it
}

void EngineClient::Impl::revive(EngineSlot& engine, std::string_view why) {
  util::log::notice("engine link: engine rank ", engine.status.rank, " ", why,
                    "; it is ready again");
  engine.dead_by_timeout = false;
  drop_probes(engine.status.rank);  // their answers or timeouts would say nothing new
  if (options.probe_interval.count() > 0) engine.next_probe = Clock::now() + options.probe_interval;
  set_state(engine, EngineState::kReady, "");
}

void EngineClient::Impl::drop_probes(int rank) {
  for (auto it = pending.begin(); it != pending.end();) {
    auto next = std::next(it);
    if (it->second.rank == rank && !it->second.batch) take_pending(it);
    it = next;
  }
}

bool EngineClient::Impl::wants_probe(const EngineSlot& engine) const {
  if (engine.calls_in_flight > 0) return false;
  const EngineState state = engine.status.state;
  if (state == EngineState::kDisconnected) return engine.probes_in_flight < kMaxReconnectProbes;
  const bool liveness = options.probe_interval.count() > 0 && engine.probes_in_flight == 0;
  return liveness &&
         (state == EngineState::kReady || (state == EngineState::kDead && engine.dead_by_timeout));
}

void EngineClient::Impl::send_probes(Clock::time_point now) {
  for (EngineSlot& engine : engines) {
    if (now < engine.next_probe || !wants_probe(engine)) continue;
    const bool reconnect = engine.status.state == EngineState::kDisconnected;
    engine.next_probe = now + (reconnect ? kReconnectProbeEvery : options.probe_interval);
    send_probe(engine, now);
  }
}

void EngineClient::Impl::send_probe(EngineSlot& engine, Clock::time_point now) {
  const std::uint64_t call_id = next_call_id.fetch_add(1);
  zmq::message_t payload(wire::utility_request_prefix(0, {call_id, false}, kProbeMethod) + "\x90");
  if (const int error = send_utility(engine, payload); error != 0) {
    if (error == EHOSTUNREACH && engine.status.state == EngineState::kReady) {
      mark_disconnected(engine, "input connection gone");
    } else if (error != EHOSTUNREACH) {
      util::log::debug("engine link: cannot probe engine rank ", engine.status.rank, ": ",
                       zmq_strerror(error));
    }
    return;  // unroutable while disconnected: the next try may find it back
  }
  util::log::trace("engine link: probing engine rank ", engine.status.rank, " (call ", call_id,
                   ")");
  const CallOptions probe_options{options.probe_timeout, false, {}};
  add_pending(call_id, PendingCall{nullptr, 0, engine.status.rank, std::string(kProbeMethod),
                                   probe_options, now + options.probe_timeout});
}

void EngineClient::Impl::on_probe_answer(EngineSlot& engine) {
  // Any answer, a failure message too, shows the engine serving its busy loop.
  if (engine.status.state == EngineState::kDisconnected) {
    claim_fresh_input_fd(engine);
    revive(engine, "answered after reconnecting");
  } else if (engine.status.state == EngineState::kDead && engine.dead_by_timeout) {
    if (engine.input_fd < 0) claim_fresh_input_fd(engine);
    revive(engine, "answered a probe");
  }
}

void EngineClient::Impl::on_probe_timeout(EngineSlot& engine) {
  const std::string after = util::seconds_text(options.probe_timeout);
  if (engine.status.state == EngineState::kReady) {
    mark_dead(engine, "not answering: liveness probe timed out after " + after, true);
  } else if (engine.status.state == EngineState::kDisconnected) {
    mark_dead(engine, "not answering after reconnecting: probe timed out after " + after, true);
  }
}

// The reconnected engine's input connection, when no other engine may own it: later drops of
// it are then noticed at once (else at the next call or probe, which cannot be routed).
void EngineClient::Impl::claim_fresh_input_fd(EngineSlot& engine) {
  if (fresh_input_fds.size() != 1) {
    util::log::debug("engine link: ", fresh_input_fds.size(),
                     " new input connections; not tying one to ", "engine rank ",
                     engine.status.rank);
    return;
  }
  engine.input_fd = *fresh_input_fds.begin();
  fresh_input_fds.clear();
}

}  // namespace vllmd::engine
