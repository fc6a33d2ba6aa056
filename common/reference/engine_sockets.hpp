#pragma once
// The reference engine's ZeroMQ sockets and the waits around them, all used from the engine
// thread only: the handshake DEALER, the input DEALER and the output PUSH, each waiting in
// slices so that a stop request ends any wait.

#include <atomic>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

namespace vllmd::reference {

// How a connection to a frontend ended.
enum class Outcome { kStopped, kFaultExit };

// Linger for the last message on a socket we close on purpose (READY, ENGINE_CORE_DEAD):
// with 0 it could be dropped before the I/O thread wrote it; bounded so exit cannot hang.
inline constexpr int kFlushLingerMs = 1000;

inline std::string_view view(const zmq::message_t& message) {
  return {static_cast<const char*>(message.data()), message.size()};
}

// Wall-clock seconds, as vLLM stamps its outputs.
double now_seconds();

class EngineSockets {
 public:
  using Clock = std::chrono::steady_clock;

  EngineSockets(int rank, const std::atomic<bool>& stop_requested)
      : rank_(rank), stop_requested_(stop_requested) {}

  bool stopping() const { return stop_requested_.load(); }
  const std::atomic<bool>& stop_requested() const { return stop_requested_; }

  // A socket connected to `address`, with vLLM's options (no high-water marks).
  zmq::socket_t open(zmq::socket_type type, const std::string& address);

  // Sends one message, waiting (in slices) while the socket is full; false when stopped first.
  bool send(zmq::socket_t& socket, std::string_view frame);
  bool send_frames(zmq::socket_t& socket, std::span<const std::string> frames);

  // All frames of the next message; nullopt when stopped or past the deadline.
  std::optional<std::vector<zmq::message_t>> receive(zmq::socket_t& socket,
                                                     std::optional<Clock::time_point> deadline);
  // The next message if one is waiting now, without blocking.
  std::optional<std::vector<zmq::message_t>> try_receive(zmq::socket_t& socket);

  // Waits up to `timeout` for `events`; EINTR counts as "nothing happened".
  static bool poll_one(zmq::socket_t& socket, short events, std::chrono::milliseconds timeout);

  // The context outlives the sockets: members are destroyed in reverse order.
  zmq::context_t context;
  zmq::socket_t handshake;
  zmq::socket_t input;
  zmq::socket_t output;

 private:
  bool send_part(zmq::socket_t& socket, std::string_view frame, bool more);

  int rank_;
  const std::atomic<bool>& stop_requested_;
};

}  // namespace vllmd::reference
