// The engine client's IO thread: the only code that touches the sockets. This file holds the
// loop, calls and replies; client_handshake.cpp admits engines and reads connection events,
// client_liveness.cpp keeps their states and probes them.

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/engine/client_impl.hpp"
#include "common/util/duration.hpp"
#include "common/util/log.hpp"

namespace vllmd::engine {

namespace {

constexpr int kMaxPollMs = 250;
constexpr std::size_t kRememberTimedOut = 64;

}  // namespace

bool is_unsolicited(const wire::CallId& call_id) {
  if (!call_id.negative) return false;
  const auto id = static_cast<std::int64_t>(call_id.bits);
  return id == -1 || id == -2;
}

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
      // Messages before connection events (and each event re-drains its socket first): an
      // answer, registration or READY that beat a disconnect still counts.
      if (items[0].revents != 0) drain_output();
      if (items[1].revents != 0) drain_input();
      if (items[2].revents != 0) drain_handshake();
      if (items[3].revents != 0) read_events(Link::kInput);
      if (items[4].revents != 0) read_events(Link::kHandshake);
      const Clock::time_point now = Clock::now();
      expire(now);
      send_probes(now);
      pending_count.store(pending.size() - probes_pending, std::memory_order_relaxed);
      publish_loads();
    } catch (const zmq::error_t& error) {
      if (error.num() == ETERM) break;
      util::log::error("engine link: ", error.what());
    }
  }
  shut_down();
}

int EngineClient::Impl::poll_timeout_ms(Clock::time_point now) const {
  Clock::time_point next = now + std::chrono::milliseconds(kMaxPollMs);
  for (const auto& [id, call] : pending) next = std::min(next, call.deadline);
  for (const EngineSlot& engine : engines) {
    if (engine.status.state == EngineState::kHandshaking) {
      next = std::min(next, engine.startup_deadline);
    }
    if (wants_probe(engine)) next = std::min(next, engine.next_probe);
  }
  const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::clamp<long long>(wait, 0, kMaxPollMs));
}

void EngineClient::Impl::take_submissions() {
  std::deque<Submission> taken;
  std::deque<std::function<void()>> commands_taken;
  std::deque<Generation> generations_taken;
  std::vector<std::string> aborts_taken;
  {
    std::lock_guard lock(queue_mutex);
    taken.swap(queue);
    commands_taken.swap(commands);
    generations_taken.swap(generations);
    generations_waiting.store(false, std::memory_order_relaxed);
    aborts_taken.swap(aborts);
  }
  for (auto& command : commands_taken) command();
  for (Submission& submission : taken) {
    for (OutgoingCall& call : submission.calls) send_call(submission, call);
  }
  // Aborts after the ADDs taken with them: an abort may be for one of those.
  for (Generation& generation : generations_taken) send_generation(generation);
  if (!aborts_taken.empty()) send_aborts(aborts_taken);
}

// Why a call may not go to this engine now, if it may not.
std::optional<std::string> EngineClient::Impl::refusal(const EngineSlot& engine,
                                                       const CallOptions& call) const {
  const std::string rank = std::to_string(engine.status.rank);
  const auto index = static_cast<std::size_t>(engine.status.rank);
  const std::uint64_t current = engine.status.incarnation;
  const std::uint64_t expected = index < call.incarnations.size() ? call.incarnations[index] : 0;
  if (expected != 0 && expected != current) {
    return "engine rank " + rank + " restarted (incarnation " + std::to_string(expected) +
           ", now " + std::to_string(current) + ")";
  }
  if (engine.status.state == EngineState::kReady) return std::nullopt;
  std::string why = "engine rank " + rank + " is " + std::string(state_name(engine.status.state));
  if (!engine.status.reason.empty()) why += " (" + engine.status.reason + ")";
  return why;
}

void EngineClient::Impl::send_call(const Submission& submission, OutgoingCall& call) {
  EngineSlot& engine = engines[static_cast<std::size_t>(call.rank)];
  auto unavailable = [&](const std::string& why) {
    submission.batch->complete(call.index,
                               tl::unexpected(CallError{CallErrorKind::kUnavailable, why}));
  };
  if (auto why = refusal(engine, submission.options)) return unavailable(*why);
  if (const int error = send_utility(engine, call.payload); error != 0) {
    if (error == EHOSTUNREACH) {
      // The ROUTER no longer knows the engine: its connection is gone, unnoticed until now.
      mark_disconnected(engine, "input connection gone");
      return unavailable(refusal(engine, submission.options).value_or("engine unreachable"));
    }
    return unavailable("cannot send to engine rank " + std::to_string(call.rank) + ": " +
                       zmq_strerror(error));
  }
  util::log::debug("engine link: sent ", submission.method, " call ", call.call_id, " to rank ",
                   call.rank);
  add_pending(call.call_id, PendingCall{submission.batch, call.index, call.rank, submission.method,
                                        submission.options, submission.deadline});
}

int EngineClient::Impl::send_utility(EngineSlot& engine, zmq::message_t& payload) {
  return send_message(engine, wire::RequestType::kUtility, payload);
}

// Sends [identity][type][payload]; 0 or the errno. ROUTER_MANDATORY turns an unroutable
// identity into EHOSTUNREACH instead of a silent drop; the input socket has no send
// high-water mark (as vLLM's), so a send never blocks this thread behind one slow engine.
int EngineClient::Impl::send_message(EngineSlot& engine, wire::RequestType type,
                                     zmq::message_t& payload) {
  const auto type_byte = static_cast<std::uint8_t>(type);
  try {
    input.send(zmq::buffer(engine.identity), zmq::send_flags::sndmore);
    input.send(zmq::buffer(&type_byte, 1), zmq::send_flags::sndmore);
    input.send(payload, zmq::send_flags::none);
  } catch (const zmq::error_t& error) {
    return error.num();
  }
  return 0;
}

void EngineClient::Impl::add_pending(std::uint64_t call_id, PendingCall call) {
  EngineSlot& engine = engines[static_cast<std::size_t>(call.rank)];
  if (call.batch) {
    ++engine.calls_in_flight;
  } else {
    ++engine.probes_in_flight;
    ++probes_pending;
  }
  pending.emplace(call_id, std::move(call));
}

PendingCall EngineClient::Impl::take_pending(
    std::unordered_map<std::uint64_t, PendingCall>::iterator found) {
  PendingCall call = std::move(found->second);
  pending.erase(found);
  EngineSlot& engine = engines[static_cast<std::size_t>(call.rank)];
  if (call.batch) {
    --engine.calls_in_flight;
  } else {
    --engine.probes_in_flight;
    --probes_pending;
  }
  // Idle from now: the next liveness probe is a full interval away.
  if (options.probe_interval.count() > 0) engine.next_probe = Clock::now() + options.probe_interval;
  return call;
}

void EngineClient::Impl::drain_output() {
  std::vector<zmq::message_t> parts;
  std::vector<std::string_view> frames;
  for (std::size_t n = 0; n < kDrainBatch && receive(output, parts, kMaxOutputFrames); ++n) {
    frames.clear();
    for (const zmq::message_t& part : parts) frames.push_back(view(part));
    const int fd = source_fd(parts[0]);
    if (frames[0] == wire::kEngineCoreDead) {
      on_core_dead(fd);
      continue;
    }
    // Every frame of the message stays alive until its outputs are handed on.
    if (auto ok = wire::decode_outputs(frames, received, options.reply_limits); !ok) {
      for (EngineSlot& engine : engines) {
        if (engine.output_fd == fd && fd >= 0) {
          const std::string why = "engine rank " + std::to_string(engine.status.rank) +
                                  " sent an undecodable message: " + ok.error();
          fail_pending(engine.status.rank, CallErrorKind::kFailed, why);
          end_requests(engine.status.rank, Closed::kEngineLost, why);
        }
      }
      util::log::warning("engine link: dropped an undecodable message: ", ok.error());
      continue;
    }
    if (received.utility_output) on_reply(*received.utility_output, received.engine_index, fd);
    if (!received.outputs.empty() || received.scheduler_stats ||
        !received.finished_requests.empty()) {
      on_outputs(received);
    }
  }
}

void EngineClient::Impl::on_core_dead(int fd) {
  EngineSlot* sender = nullptr;
  std::vector<EngineSlot*> unknown;
  for (EngineSlot& engine : engines) {
    const EngineState state = engine.status.state;
    const bool may_send = state == EngineState::kReady || state == EngineState::kDisconnected ||
                          (state == EngineState::kDead && engine.dead_by_timeout);
    if (!may_send) continue;
    if (engine.output_fd == fd) sender = &engine;
    if (engine.output_fd < 0) unknown.push_back(&engine);
  }
  // An engine we never heard from on this socket is the sender if it is the only one.
  if (sender == nullptr && unknown.size() == 1) sender = unknown.front();
  if (sender != nullptr) {
    mark_dead(*sender, "engine sent ENGINE_CORE_DEAD");
  } else {
    util::log::warning(
        "engine link: ENGINE_CORE_DEAD from an unidentified engine; waiting for its "
        "connection to drop");
  }
}

void EngineClient::Impl::on_reply(const wire::UtilityOutput& reply, std::int64_t engine_index,
                                  int fd) {
  if (is_unsolicited(reply.call_id)) {
    util::log::debug("engine link: ignoring an unsolicited utility output (call id ",
                     static_cast<std::int64_t>(reply.call_id.bits), ") from engine ", engine_index);
    return;
  }
  const auto found = reply.call_id.negative ? pending.end() : pending.find(reply.call_id.bits);
  if (found == pending.end()) return on_late_reply(reply.call_id.bits);
  PendingCall call = take_pending(found);
  EngineSlot& engine = engines[static_cast<std::size_t>(call.rank)];
  if (fd >= 0) engine.output_fd = fd;
  if (!call.batch) return on_probe_answer(engine);
  if (reply.failure_message) {
    call.batch->complete(call.index,
                         tl::unexpected(CallError{CallErrorKind::kFailed, *reply.failure_message}));
  } else {
    call.batch->complete(call.index, reply.value_msgpack);
  }
}

// A late answer to a timed-out call proves a slow engine is alive after all.
void EngineClient::Impl::on_late_reply(std::uint64_t call_id) {
  for (EngineSlot& engine : engines) {
    auto& late = engine.timed_out_calls;
    if (std::find(late.begin(), late.end(), call_id) == late.end()) continue;
    late.erase(std::remove(late.begin(), late.end(), call_id), late.end());
    if (engine.status.state == EngineState::kDead && engine.dead_by_timeout) {
      revive(engine, "answered a timed-out call");
    }
    return;
  }
  util::log::debug("engine link: reply to unknown call id ", call_id);
}

void EngineClient::Impl::fail_pending(int rank, CallErrorKind kind, const std::string& message) {
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->second.rank != rank) {
      ++it;
      continue;
    }
    auto next = std::next(it);
    PendingCall call = take_pending(it);
    // Pending calls were sent: whether the engine ran them is unknown.
    if (call.batch) {
      call.batch->complete(call.index, tl::unexpected(CallError{kind, message, true}));
    }
    it = next;
  }
}

void EngineClient::Impl::expire(Clock::time_point now) {
  std::vector<std::pair<std::uint64_t, PendingCall>> expired;
  for (auto it = pending.begin(); it != pending.end();) {
    auto next = std::next(it);
    if (it->second.deadline <= now) {
      const std::uint64_t call_id = it->first;  // before take_pending erases it
      expired.emplace_back(call_id, take_pending(it));
    }
    it = next;
  }
  // Engines first, callers second: a caller woken by its timeout sees the engine's new state.
  for (auto& [id, call] : expired) {
    EngineSlot& engine = engines[static_cast<std::size_t>(call.rank)];
    engine.timed_out_calls.push_back(id);
    if (engine.timed_out_calls.size() > kRememberTimedOut) engine.timed_out_calls.pop_front();
    if (!call.batch) {
      on_probe_timeout(engine);
    } else if (call.options.timeout_marks_dead) {
      mark_dead(engine, "a lifecycle call timed out", true);
    }
  }
  for (auto& [id, call] : expired) {
    if (!call.batch) continue;
    call.batch->complete(
        call.index, tl::unexpected(CallError{CallErrorKind::kTimeout,
                                             "engine rank " + std::to_string(call.rank) +
                                                 " did not answer " + call.method + " within " +
                                                 util::seconds_text(call.options.timeout),
                                             true}));
  }
  expire_startups(now);
}

void fail_submission(Submission& submission, const std::string& message) {
  for (OutgoingCall& call : submission.calls) {
    submission.batch->complete(call.index,
                               tl::unexpected(CallError{CallErrorKind::kUnavailable, message}));
  }
}

void EngineClient::Impl::shut_down() {
  std::deque<Submission> taken;
  std::deque<Generation> generations_taken;
  {
    std::lock_guard lock(queue_mutex);
    taken.swap(queue);
    generations_taken.swap(generations);
    commands.clear();
    aborts.clear();
    queue_closed = true;
  }
  for (Submission& submission : taken)
    fail_submission(submission, "engine client is shutting down");
  for (Generation& generation : generations_taken) {
    generation.sink->on_closed(Closed::kShutdown, "engine client is shutting down");
  }
  for (const EngineSlot& engine : engines) {
    end_requests(engine.status.rank, Closed::kShutdown, "engine client is shutting down");
  }
  publish_loads();
  for (auto& [id, call] : pending) {
    if (!call.batch) continue;
    call.batch->complete(call.index, tl::unexpected(CallError{CallErrorKind::kUnavailable,
                                                              "engine client is shutting down"}));
  }
  pending.clear();
  // Stop the monitors before their sockets close: libzmq 4.3 leaks an event it fails to send
  // to a closed monitor (an engine dropping its connection meanwhile, with an address of more
  // than 33 bytes, as ipc paths are).
  zmq_socket_monitor(handshake.handle(), nullptr, 0);
  zmq_socket_monitor(input.handle(), nullptr, 0);
  handshake_monitor.close();
  input_monitor.close();
  handshake.close();
  input.close();
  output.close();
}

}  // namespace vllmd::engine
