// The engine client's IO thread, continued: HELLO, INIT, registration and READY, and the
// socket monitors' connection events.
//
// Messages and connection events are handled in the order they happened. A monitor event
// and a message travel on different sockets, so the poll may see them the other way round:
// - before acting on a DISCONNECTED event, its socket is drained, so a READY or registration
//   sent just before the connection closed is read first;
// - before a message ties an engine to its connection's fd, the monitor is drained, so the
//   events of an earlier connection that had the same fd (a closed engine connection, or a
//   TCP client probing the port) are consumed first and never taken for the new one's.

#include <cstring>

#include "common/engine/client_impl.hpp"
#include "common/util/duration.hpp"
#include "common/util/log.hpp"

namespace vllmd::engine {

void EngineClient::Impl::drain_input() {
  Reentry guard(draining_input);
  if (!guard.entered()) return;
  std::vector<zmq::message_t> parts;
  for (std::size_t n = 0; n < kDrainBatch && receive(input, parts, 2); ++n) {
    EngineSlot* engine = slot_for_identity(view(parts[0]));
    if (engine == nullptr) {
      util::log::warning("engine link: ignoring input from an unknown engine identity");
      continue;
    }
    // The identity frame is made up by the ROUTER; the payload frame knows its connection.
    const std::string_view frame = parts.size() > 1 ? view(parts[1]) : std::string_view();
    on_registration(*engine, frame, parts.size() > 1 ? source_fd(parts[1]) : -1);
  }
}

void EngineClient::Impl::drain_handshake() {
  Reentry guard(draining_handshake);
  if (!guard.entered()) return;
  std::vector<zmq::message_t> parts;
  for (std::size_t n = 0; n < kDrainBatch && receive(handshake, parts, 2); ++n) {
    EngineSlot* engine = slot_for_identity(view(parts[0]));
    if (engine == nullptr || parts.size() < 2) {
      util::log::warning("engine link: rejecting a handshake message from an unknown identity (",
                         parts[0].size(),
                         " bytes; want the DP rank as 2 little-endian bytes below ",
                         options.data_parallel_size, ")");
      continue;
    }
    auto message = wire::decode_handshake_status(view(parts[1]));
    if (!message) {
      util::log::warning("engine link: bad handshake message from engine rank ",
                         engine->status.rank, ": ", message.error());
      continue;
    }
    if (message->status == "HELLO") {
      on_hello(*engine, source_fd(parts[1]));
    } else if (message->status == "READY") {
      on_ready(*engine);
    } else {
      util::log::warning("engine link: unknown handshake status '", message->status,
                         "' from engine rank ", engine->status.rank);
    }
  }
}

void EngineClient::Impl::read_events(Link link) {
  Reentry guard(link == Link::kInput ? reading_input_events : reading_handshake_events);
  if (!guard.entered()) return;
  zmq::socket_t& monitor = link == Link::kInput ? input_monitor : handshake_monitor;
  std::vector<zmq::message_t> parts;
  for (std::size_t n = 0; n < kDrainBatch && receive(monitor, parts, 1); ++n) {
    if (parts[0].size() < 6) continue;
    std::uint16_t event = 0;
    std::int32_t fd = -1;
    std::memcpy(&event, parts[0].data(), sizeof event);
    std::memcpy(&fd, static_cast<const char*>(parts[0].data()) + 2, sizeof fd);
    on_connection_event(link, event, fd);
  }
}

void EngineClient::Impl::on_connection_event(Link link, std::uint16_t event, int fd) {
  if (event == ZMQ_EVENT_DISCONNECTED) {
    return link == Link::kInput ? on_input_dropped(fd) : on_handshake_dropped(fd);
  }
  if (link != Link::kInput) return;
  // ACCEPTED carries the connection's fd; HANDSHAKE_SUCCEEDED (its value is 0, not the fd)
  // says the peer's identity is known, so a probe can be routed to it.
  if (event == ZMQ_EVENT_ACCEPTED && slot_with(&EngineSlot::input_fd, fd) == nullptr) {
    fresh_input_fds.insert(fd);
  }
  // Maybe a disconnected engine is back: probe every one of them now.
  for (EngineSlot& engine : engines) {
    if (engine.status.state == EngineState::kDisconnected) engine.next_probe = Clock::now();
  }
}

void EngineClient::Impl::on_input_dropped(int fd) {
  fresh_input_fds.erase(fd);
  EngineSlot* engine = slot_with(&EngineSlot::input_fd, fd);
  if (engine == nullptr) return;
  // Replies and registrations that came before the drop count first.
  drain_output();
  drain_input();
  if (engine->input_fd != fd) return;  // re-registered meanwhile
  engine->input_fd = -1;
  switch (engine->status.state) {
    case EngineState::kReady: return mark_disconnected(*engine, "input connection dropped");
    case EngineState::kHandshaking:
      util::log::warning("engine link: engine rank ", engine->status.rank,
                         "'s input connection dropped before READY; it is probed once admitted");
      engine->input_lost = true;
      return;
    default: return;  // dead (by a timeout) or already disconnected: nothing more to lose
  }
}

void EngineClient::Impl::on_handshake_dropped(int fd) {
  EngineSlot* engine = slot_with(&EngineSlot::handshake_fd, fd);
  if (engine == nullptr) return;
  drain_handshake();  // a READY sent just before the close is read first
  if (engine->handshake_fd != fd) return;
  engine->handshake_fd = -1;
  // vLLM closes its handshake socket once READY is out.
  if (engine->got_ready) return;
  const bool loading = engine->status.state == EngineState::kHandshaking;
  if (!loading && !engine->startup_timed_out) return;
  // Maybe gone, maybe ZeroMQ reconnects it: a READY that still comes is admitted, and a new
  // HELLO is a restart rather than a duplicate.
  util::log::warning("engine link: engine rank ", engine->status.rank,
                     "'s handshake connection dropped before READY");
  if (loading) set_state(*engine, EngineState::kHandshaking, "handshake connection dropped");
}

EngineSlot* EngineClient::Impl::slot_for_identity(std::string_view identity) {
  const auto rank = wire::rank_from_identity(identity);
  if (!rank || *rank >= options.data_parallel_size) return nullptr;
  return &engines[static_cast<std::size_t>(*rank)];
}

EngineSlot* EngineClient::Impl::slot_with(int EngineSlot::*field, int fd) {
  if (fd < 0) return nullptr;
  for (EngineSlot& engine : engines) {
    if (engine.*field == fd) return &engine;
  }
  return nullptr;
}

// The fd a message came in on, unless another engine claimed that number before. libzmq
// reuses a closed connection's fd at once: when one engine closes its handshake connection
// after READY and the next connects, both carry the same number. Rather than let the first
// one's events reach the newcomer, the newcomer is not tied to disconnect events (its
// timeouts and probes still apply).
int EngineClient::Impl::unique_fd(int fd, int EngineSlot::*field, const EngineSlot& engine) const {
  if (fd < 0) return -1;
  for (const EngineSlot& other : engines) {
    if (&other != &engine && other.*field == fd) {
      util::log::debug("engine link: fd ", fd, " was engine rank ", other.status.rank,
                       "'s; not tying rank ", engine.status.rank, " to its disconnect events");
      return -1;
    }
  }
  return fd;
}

void EngineClient::Impl::on_hello(EngineSlot& engine, int fd) {
  const int rank = engine.status.rank;
  read_events(Link::kHandshake);  // stale events of this fd's earlier connections first
  // The same connection saying HELLO twice is a protocol error; another one is a restart.
  if (engine.status.state == EngineState::kHandshaking && engine.handshake_fd >= 0 &&
      fd == engine.handshake_fd) {
    util::log::warning("engine link: duplicate HELLO from engine rank ", rank, " rejected");
    return;
  }
  if (engine.status.state == EngineState::kReady ||
      engine.status.state == EngineState::kDisconnected) {
    // A running engine never says HELLO twice: this is a new process under the same rank.
    mark_dead(engine, "engine restarted");
  }
  // Probes of the old process (callers' calls failed with mark_dead).
  fail_pending(rank, CallErrorKind::kUnavailable,
               "engine rank " + std::to_string(rank) + " restarted");
  end_requests(rank, Closed::kEngineLost, "engine rank " + std::to_string(rank) + " restarted");
  try {
    handshake.send(zmq::buffer(engine.identity), zmq::send_flags::sndmore);
    handshake.send(zmq::buffer(init_message), zmq::send_flags::none);
  } catch (const zmq::error_t& error) {
    util::log::warning("engine link: cannot send INIT to engine rank ", rank, ": ", error.what());
    return;
  }
  engine.got_ready = engine.got_registration = false;
  engine.startup_timed_out = engine.input_lost = false;
  engine.handshake_fd = unique_fd(fd, &EngineSlot::handshake_fd, engine);
  engine.input_fd = engine.output_fd = -1;
  engine.dead_by_timeout = false;
  engine.timed_out_calls.clear();
  engine.startup_deadline = options.startup_timeout.count() > 0
                                ? Clock::now() + options.startup_timeout
                                : Clock::time_point::max();
  util::log::info("engine link: HELLO from engine rank ", rank, "; sent INIT");
  set_state(engine, EngineState::kHandshaking, "");
}

namespace {
// Between HELLO and admission: loading, or dead for the startup timeout but still welcome.
bool awaiting_admission(const EngineSlot& engine) {
  return engine.status.state == EngineState::kHandshaking ||
         (engine.status.state == EngineState::kDead && engine.startup_timed_out);
}
}  // namespace

void EngineClient::Impl::on_ready(EngineSlot& engine) {
  if (!awaiting_admission(engine) || engine.got_ready) {
    util::log::warning("engine link: unexpected READY from engine rank ", engine.status.rank,
                       " rejected");
    return;
  }
  engine.got_ready = true;
  admit_if_complete(engine);
}

void EngineClient::Impl::on_registration(EngineSlot& engine, std::string_view frame, int fd) {
  if (!awaiting_admission(engine) || engine.got_registration) {
    util::log::warning("engine link: unexpected input frame from engine rank ", engine.status.rank);
    return;
  }
  read_events(Link::kInput);  // stale events of this fd's earlier connections first
  auto registration = wire::decode_registration(frame);
  if (!registration) {
    util::log::warning("engine link: unreadable registration from engine rank ", engine.status.rank,
                       " (", registration.error(), "); treating it as empty");
    registration = wire::Registration{};
  }
  {
    std::lock_guard lock(state_mutex);
    engine.status.registration = *registration;
  }
  engine.got_registration = true;
  engine.input_fd = unique_fd(fd, &EngineSlot::input_fd, engine);
  fresh_input_fds.erase(fd);
  admit_if_complete(engine);
}

void EngineClient::Impl::admit_if_complete(EngineSlot& engine) {
  if (!engine.got_ready || !engine.got_registration) return;
  {
    std::lock_guard lock(state_mutex);
    engine.status.incarnation = ++engine.status.admissions;
  }
  ++admissions_total;
  const wire::Registration& registration = engine.status.registration;
  util::log::info(
      "engine link: engine rank ", engine.status.rank, " ready",
      engine.startup_timed_out ? " (after its startup timeout)" : "",
      registration.empty ? " (empty registration)" : "",
      registration.vllm_version ? ", vLLM " + *registration.vllm_version : "",
      registration.world_size ? ", world_size " + std::to_string(*registration.world_size) : "",
      registration.weight_transfer_backend
          ? ", weight transfer " + *registration.weight_transfer_backend
          : "");
  engine.startup_timed_out = false;
  if (options.probe_interval.count() > 0) engine.next_probe = Clock::now() + options.probe_interval;
  if (engine.input_lost) {
    engine.input_lost = false;
    return mark_disconnected(engine, "input connection dropped during the model load");
  }
  set_state(engine, EngineState::kReady, "");
}

void EngineClient::Impl::expire_startups(Clock::time_point now) {
  for (EngineSlot& engine : engines) {
    if (engine.status.state != EngineState::kHandshaking || engine.startup_deadline > now) continue;
    const std::string reason = "no READY within " + util::seconds_text(options.startup_timeout);
    util::log::warning("engine link: engine rank ", engine.status.rank, " is dead: ", reason,
                       "; a READY that still comes is admitted");
    engine.startup_timed_out = true;
    set_state(engine, EngineState::kDead, reason);
  }
}

}  // namespace vllmd::engine
