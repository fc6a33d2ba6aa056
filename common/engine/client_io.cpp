// The engine client's IO thread: the only code that touches the sockets.

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/engine/client_impl.hpp"
#include "common/util/duration.hpp"
#include "common/util/log.hpp"

namespace vllmd::engine {

namespace {

constexpr int kMaxPollMs = 250;
constexpr std::size_t kDrainBatch = 256;    // messages per socket per loop, for fairness
constexpr std::size_t kRememberTimedOut = 64;

// Receives one multipart message without blocking; extra frames beyond `frames` are dropped.
bool receive(zmq::socket_t& socket, std::vector<zmq::message_t>& parts, std::size_t frames) {
  parts.clear();
  zmq::message_t part;
  if (!socket.recv(part, zmq::recv_flags::dontwait)) return false;
  for (;;) {
    const bool more = part.more();
    if (parts.size() < frames) parts.push_back(std::move(part));
    if (!more) return true;
    part = zmq::message_t();
    (void)socket.recv(part);  // the rest of a multipart message is already here
  }
}

// The connection a message came in on (ZMQ_SRCFD), or -1 when libzmq does not know it.
int source_fd(const zmq::message_t& message) {
  return zmq_msg_get(const_cast<zmq_msg_t*>(message.handle()), ZMQ_SRCFD);
}

std::string_view view(const zmq::message_t& message) {
  return {static_cast<const char*>(message.data()), message.size()};
}

}  // namespace

void EngineClient::Impl::run() {
  while (!stopping.load()) {
    zmq::pollitem_t items[] = {
        {output.handle(), 0, ZMQ_POLLIN, 0},
        {input.handle(), 0, ZMQ_POLLIN, 0},
        {handshake.handle(), 0, ZMQ_POLLIN, 0},
        {input_monitor.handle(), 0, ZMQ_POLLIN, 0},
        {handshake_monitor.handle(), 0, ZMQ_POLLIN, 0},
        {nullptr, wake_fd, ZMQ_POLLIN, 0},
    };
    try {
      zmq::poll(items, 6, std::chrono::milliseconds(poll_timeout_ms(Clock::now())));
      if (items[5].revents != 0) {
        std::uint64_t count = 0;
        [[maybe_unused]] const auto got = ::read(wake_fd, &count, sizeof count);
        take_submissions();
      }
      // Replies before connection events: an answer that beat the disconnect still counts.
      if (items[0].revents != 0) drain_output();
      if (items[1].revents != 0) drain_input();
      if (items[2].revents != 0) drain_handshake();
      if (items[3].revents != 0) drain_monitor(input_monitor, true);
      if (items[4].revents != 0) drain_monitor(handshake_monitor, false);
      expire(Clock::now());
      pending_count.store(pending.size(), std::memory_order_relaxed);
    } catch (const zmq::error_t& error) {
      if (error.num() == ETERM) break;
      log::error("engine link: ", error.what());
    }
  }
  shut_down();
}

int EngineClient::Impl::poll_timeout_ms(Clock::time_point now) const {
  Clock::time_point next = now + std::chrono::milliseconds(kMaxPollMs);
  for (const auto& [id, call] : pending) next = std::min(next, call.deadline);
  for (const EngineSlot& engine : engines) {
    if (engine.status.state == EngineState::kHandshaking) next = std::min(next, engine.ready_deadline);
  }
  const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::clamp<long long>(wait, 0, kMaxPollMs));
}

void EngineClient::Impl::take_submissions() {
  std::deque<Submission> taken;
  {
    std::lock_guard lock(queue_mutex);
    taken.swap(queue);
  }
  for (Submission& submission : taken) {
    for (OutgoingCall& call : submission.calls) send_call(submission, call);
  }
}

void EngineClient::Impl::send_call(const Submission& submission, OutgoingCall& call) {
  EngineSlot& engine = engines[static_cast<std::size_t>(call.rank)];
  auto unavailable = [&](const std::string& why) {
    submission.batch->complete(call.index, tl::unexpected(CallError{CallErrorKind::kUnavailable, why}));
  };
  if (engine.status.state != EngineState::kReady) {
    std::string why = "engine rank " + std::to_string(call.rank) + " is " +
                      std::string(state_name(engine.status.state));
    if (!engine.status.reason.empty()) why += " (" + engine.status.reason + ")";
    unavailable(why);
    return;
  }
  static const std::uint8_t kUtility = static_cast<std::uint8_t>(wire::RequestType::kUtility);
  try {
    // ROUTER_MANDATORY turns an unroutable identity into EHOSTUNREACH instead of a silent drop.
    input.send(zmq::buffer(engine.identity), zmq::send_flags::sndmore);
    input.send(zmq::buffer(&kUtility, 1), zmq::send_flags::sndmore);
    input.send(call.payload, zmq::send_flags::none);
  } catch (const zmq::error_t& error) {
    unavailable("cannot send to engine rank " + std::to_string(call.rank) + ": " + error.what());
    return;
  }
  log::debug("engine link: sent ", submission.method, " call ", call.call_id, " to rank ",
             call.rank);
  pending.emplace(call.call_id, PendingCall{submission.batch, call.index, call.rank,
                                            submission.method, submission.options,
                                            submission.deadline});
}

void EngineClient::Impl::drain_output() {
  std::vector<zmq::message_t> parts;
  for (std::size_t n = 0; n < kDrainBatch && receive(output, parts, 1); ++n) {
    const std::string_view frame = view(parts[0]);
    const int fd = source_fd(parts[0]);
    if (frame == wire::kEngineCoreDead) {
      EngineSlot* sender = nullptr;
      std::vector<EngineSlot*> unknown;
      for (EngineSlot& engine : engines) {
        if (engine.status.state != EngineState::kReady) continue;
        if (engine.output_fd == fd) sender = &engine;
        if (engine.output_fd < 0) unknown.push_back(&engine);
      }
      // An engine we never heard from on this socket is the sender if it is the only one.
      if (sender == nullptr && unknown.size() == 1) sender = unknown.front();
      if (sender != nullptr) {
        mark_dead(*sender, "engine sent ENGINE_CORE_DEAD");
      } else {
        log::warning("engine link: ENGINE_CORE_DEAD from an unidentified engine; waiting for its "
                     "connection to drop");
      }
      continue;
    }
    auto outputs = wire::decode_engine_core_outputs(frame, options.reply_limits);
    if (!outputs) {
      for (EngineSlot& engine : engines) {
        if (engine.output_fd == fd && fd >= 0) {
          fail_pending(engine.status.rank, CallErrorKind::kFailed,
                       "engine rank " + std::to_string(engine.status.rank) +
                           " sent an undecodable reply: " + outputs.error());
        }
      }
      log::warning("engine link: dropped an undecodable reply: ", outputs.error());
      continue;
    }
    if (outputs->utility_output) on_reply(*outputs, fd);
  }
}

void EngineClient::Impl::on_reply(const wire::EngineCoreOutputs& outputs, int fd) {
  const wire::UtilityOutput& reply = *outputs.utility_output;
  const auto found = reply.call_id.negative ? pending.end() : pending.find(reply.call_id.bits);
  if (found == pending.end()) {
    // A late answer to a timed-out call proves a slow engine is alive after all.
    for (EngineSlot& engine : engines) {
      auto& late = engine.timed_out_calls;
      if (std::find(late.begin(), late.end(), reply.call_id.bits) == late.end()) continue;
      late.erase(std::remove(late.begin(), late.end(), reply.call_id.bits), late.end());
      if (engine.status.state == EngineState::kDead && engine.dead_by_timeout) {
        log::notice("engine link: engine rank ", engine.status.rank,
                    " answered a timed-out call; it is alive again");
        engine.dead_by_timeout = false;
        set_state(engine, EngineState::kReady, "");
      }
      return;
    }
    log::debug("engine link: reply to unknown call id ", reply.call_id.bits);
    return;
  }
  PendingCall call = std::move(found->second);
  pending.erase(found);
  EngineSlot& engine = engines[static_cast<std::size_t>(call.rank)];
  if (fd >= 0) engine.output_fd = fd;
  if (reply.failure_message) {
    call.batch->complete(call.index,
                         tl::unexpected(CallError{CallErrorKind::kFailed, *reply.failure_message}));
  } else {
    call.batch->complete(call.index, reply.value_msgpack);
  }
}

void EngineClient::Impl::drain_input() {
  std::vector<zmq::message_t> parts;
  for (std::size_t n = 0; n < kDrainBatch && receive(input, parts, 2); ++n) {
    EngineSlot* engine = slot_for_identity(view(parts[0]));
    if (engine == nullptr) {
      log::warning("engine link: ignoring input from an unknown engine identity");
      continue;
    }
    // The identity frame is made up by the ROUTER; the payload frame knows its connection.
    const std::string_view frame = parts.size() > 1 ? view(parts[1]) : std::string_view();
    on_registration(*engine, frame, parts.size() > 1 ? source_fd(parts[1]) : -1);
  }
}

void EngineClient::Impl::drain_handshake() {
  std::vector<zmq::message_t> parts;
  for (std::size_t n = 0; n < kDrainBatch && receive(handshake, parts, 2); ++n) {
    EngineSlot* engine = slot_for_identity(view(parts[0]));
    if (engine == nullptr || parts.size() < 2) {
      log::warning("engine link: rejecting a handshake message from an unknown identity (",
                   parts[0].size(), " bytes; want the DP rank as 2 little-endian bytes below ",
                   options.data_parallel_size, ")");
      continue;
    }
    auto message = wire::decode_handshake_status(view(parts[1]));
    if (!message) {
      log::warning("engine link: bad handshake message from engine rank ", engine->status.rank,
                   ": ", message.error());
      continue;
    }
    if (message->status == "HELLO") {
      on_hello(*engine, source_fd(parts[1]));
    } else if (message->status == "READY") {
      on_ready(*engine);
    } else {
      log::warning("engine link: unknown handshake status '", message->status,
                   "' from engine rank ", engine->status.rank);
    }
  }
}

EngineSlot* EngineClient::Impl::slot_for_identity(std::string_view identity) {
  const auto rank = wire::rank_from_identity(identity);
  if (!rank || *rank >= options.data_parallel_size) return nullptr;
  return &engines[static_cast<std::size_t>(*rank)];
}

void EngineClient::Impl::on_hello(EngineSlot& engine, int fd) {
  const int rank = engine.status.rank;
  if (engine.status.state == EngineState::kHandshaking) {
    log::warning("engine link: duplicate HELLO from engine rank ", rank, " rejected");
    return;
  }
  if (engine.status.state == EngineState::kReady) {
    // A running engine never says HELLO twice: this is a new process under the same rank.
    mark_dead(engine, "engine restarted");
  }
  try {
    handshake.send(zmq::buffer(engine.identity), zmq::send_flags::sndmore);
    handshake.send(zmq::buffer(init_message), zmq::send_flags::none);
  } catch (const zmq::error_t& error) {
    log::warning("engine link: cannot send INIT to engine rank ", rank, ": ", error.what());
    return;
  }
  engine.got_ready = false;
  engine.got_registration = false;
  engine.handshake_fd = unique_fd(fd, &EngineSlot::handshake_fd, engine);
  engine.input_fd = engine.output_fd = -1;
  engine.dead_by_timeout = false;
  engine.timed_out_calls.clear();
  engine.ready_deadline = Clock::now() + options.ready_timeout;
  log::info("engine link: HELLO from engine rank ", rank, "; sent INIT");
  set_state(engine, EngineState::kHandshaking, "");
}

void EngineClient::Impl::on_ready(EngineSlot& engine) {
  if (engine.status.state != EngineState::kHandshaking || engine.got_ready) {
    log::warning("engine link: unexpected READY from engine rank ", engine.status.rank,
                 " rejected");
    return;
  }
  engine.got_ready = true;
  admit_if_complete(engine);
}

void EngineClient::Impl::on_registration(EngineSlot& engine, std::string_view frame, int fd) {
  if (engine.status.state != EngineState::kHandshaking || engine.got_registration) {
    log::warning("engine link: unexpected input frame from engine rank ", engine.status.rank);
    return;
  }
  auto registration = wire::decode_registration(frame);
  if (!registration) {
    log::warning("engine link: unreadable registration from engine rank ", engine.status.rank,
                 " (", registration.error(), "); treating it as empty");
    registration = wire::Registration{};
  }
  {
    std::lock_guard lock(state_mutex);
    engine.status.registration = *registration;
  }
  engine.got_registration = true;
  engine.input_fd = unique_fd(fd, &EngineSlot::input_fd, engine);
  admit_if_complete(engine);
}

void EngineClient::Impl::admit_if_complete(EngineSlot& engine) {
  if (!engine.got_ready || !engine.got_registration) return;
  {
    std::lock_guard lock(state_mutex);
    ++engine.status.admissions;
  }
  ++admissions_total;
  const wire::Registration& registration = engine.status.registration;
  log::info("engine link: engine rank ", engine.status.rank, " ready",
            registration.empty ? " (empty registration)" : "",
            registration.vllm_version ? ", vLLM " + *registration.vllm_version : "",
            registration.world_size ? ", world_size " + std::to_string(*registration.world_size) : "",
            registration.weight_transfer_backend
                ? ", weight transfer " + *registration.weight_transfer_backend : "");
  set_state(engine, EngineState::kReady, "");
}

// The fd a message came in on, unless another engine claimed that number before. libzmq
// reuses a closed connection's fd at once: when one engine closes its handshake connection
// after READY and the next connects, both carry the same number, and the first one's
// DISCONNECTED event may be read after the second one's HELLO. Rather than let that event
// kill the newcomer, the newcomer is not tied to disconnect events (its timeouts still
// apply, and its input and output connections still report its death).
int EngineClient::Impl::unique_fd(int fd, int EngineSlot::*field, const EngineSlot& engine) const {
  if (fd < 0) return -1;
  for (const EngineSlot& other : engines) {
    if (&other != &engine && other.*field == fd) {
      log::debug("engine link: fd ", fd, " was engine rank ", other.status.rank,
                 "'s; not tying rank ", engine.status.rank, " to its disconnect events");
      return -1;
    }
  }
  return fd;
}

void EngineClient::Impl::drain_monitor(zmq::socket_t& monitor, bool is_input) {
  std::vector<zmq::message_t> parts;
  for (std::size_t n = 0; n < kDrainBatch && receive(monitor, parts, 1); ++n) {
    if (parts[0].size() < 6) continue;
    std::uint16_t event = 0;
    std::int32_t fd = -1;
    std::memcpy(&event, parts[0].data(), sizeof event);
    std::memcpy(&fd, static_cast<const char*>(parts[0].data()) + 2, sizeof fd);
    if (event != ZMQ_EVENT_DISCONNECTED) continue;
    for (EngineSlot& engine : engines) {
      const EngineState state = engine.status.state;
      if (is_input && engine.input_fd == fd &&
          (state == EngineState::kReady || state == EngineState::kHandshaking)) {
        mark_dead(engine, "connection lost");
      } else if (!is_input && engine.handshake_fd == fd && state == EngineState::kHandshaking &&
                 !engine.got_ready) {
        // After READY an engine closes its handshake socket; before, it means it is gone.
        mark_dead(engine, "disconnected before READY");
      }
    }
  }
}

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
}

void EngineClient::Impl::mark_dead(EngineSlot& engine, const std::string& reason,
                                   bool by_timeout) {
  if (engine.status.state == EngineState::kDead) return;
  const int rank = engine.status.rank;
  log::warning("engine link: engine rank ", rank, " is dead: ", reason);
  engine.dead_by_timeout = by_timeout;
  engine.input_fd = engine.output_fd = engine.handshake_fd = -1;
  set_state(engine, EngineState::kDead, reason);
  fail_pending(rank, CallErrorKind::kUnavailable,
               "engine rank " + std::to_string(rank) + " is dead: " + reason);
}

void EngineClient::Impl::fail_pending(int rank, CallErrorKind kind, const std::string& message) {
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->second.rank != rank) {
      ++it;
      continue;
    }
    it->second.batch->complete(it->second.index, tl::unexpected(CallError{kind, message}));
    it = pending.erase(it);
  }
}

void EngineClient::Impl::expire(Clock::time_point now) {
  std::vector<std::pair<std::uint64_t, PendingCall>> expired;
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->second.deadline > now) {
      ++it;
      continue;
    }
    expired.emplace_back(it->first, std::move(it->second));
    it = pending.erase(it);
  }
  // Engines first, callers second: a caller woken by its timeout sees the engine's new state.
  for (auto& [id, call] : expired) {
    EngineSlot& engine = engines[static_cast<std::size_t>(call.rank)];
    engine.timed_out_calls.push_back(id);
    if (engine.timed_out_calls.size() > kRememberTimedOut) engine.timed_out_calls.pop_front();
    if (call.options.timeout_marks_dead) mark_dead(engine, "a lifecycle call timed out", true);
  }
  for (auto& [id, call] : expired) {
    call.batch->complete(
        call.index,
        tl::unexpected(CallError{CallErrorKind::kTimeout,
                                 "engine rank " + std::to_string(call.rank) + " did not answer " +
                                     call.method + " within " + seconds_text(call.options.timeout)}));
  }
  for (EngineSlot& engine : engines) {
    if (engine.status.state == EngineState::kHandshaking && engine.ready_deadline <= now) {
      mark_dead(engine, "no READY and registration within " +
                            seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(
                                options.ready_timeout)));
    }
  }
}

void fail_submission(Submission& submission, const std::string& message) {
  for (OutgoingCall& call : submission.calls) {
    submission.batch->complete(call.index,
                               tl::unexpected(CallError{CallErrorKind::kUnavailable, message}));
  }
}

void EngineClient::Impl::shut_down() {
  std::deque<Submission> taken;
  {
    std::lock_guard lock(queue_mutex);
    taken.swap(queue);
    queue_closed = true;
  }
  for (Submission& submission : taken) fail_submission(submission, "engine client is shutting down");
  for (auto& [id, call] : pending) {
    call.batch->complete(call.index, tl::unexpected(CallError{CallErrorKind::kUnavailable,
                                                              "engine client is shutting down"}));
  }
  pending.clear();
  handshake_monitor.close();
  input_monitor.close();
  handshake.close();
  input.close();
  output.close();
}

}  // namespace vllmd::engine
