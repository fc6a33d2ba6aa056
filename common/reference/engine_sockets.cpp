#include "common/reference/engine_sockets.hpp"

#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <utility>

#include "common/wire/messages.hpp"

namespace vllmd::reference {

namespace {

// Longest a blocking wait may run before the thread looks at the stop request again.
constexpr std::chrono::milliseconds kSlice{100};

}  // namespace

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

bool EngineSockets::poll_one(zmq::socket_t& socket, short events,
                             std::chrono::milliseconds timeout) {
  zmq_pollitem_t item{socket.handle(), 0, events, 0};
  const int rc = zmq_poll(&item, 1, static_cast<long>(timeout.count()));
  if (rc < 0 && zmq_errno() != EINTR) throw zmq::error_t();
  return rc > 0 && (item.revents & events) != 0;
}

zmq::socket_t EngineSockets::open(zmq::socket_type type, const std::string& address) {
  zmq::socket_t socket(context, type);
  socket.set(zmq::sockopt::linger, 0);
  // vLLM's make_zmq_socket: no high-water mark, so thousands of calls or held replies
  // queue up instead of being dropped or blocking.
  socket.set(zmq::sockopt::rcvhwm, 0);
  socket.set(zmq::sockopt::sndhwm, 0);
  if (type == zmq::socket_type::dealer) {
    socket.set(zmq::sockopt::routing_id, wire::engine_identity(rank_));
  }
  try {
    socket.connect(address);
  } catch (const zmq::error_t& error) {
    throw std::runtime_error("cannot connect to '" + address + "': " + error.what());
  }
  return socket;
}

bool EngineSockets::send_part(zmq::socket_t& socket, std::string_view frame, bool more) {
  const auto flags =
      more ? zmq::send_flags::sndmore | zmq::send_flags::dontwait : zmq::send_flags::dontwait;
  // Only a message's first frame can find the socket full: ZeroMQ takes the rest with it.
  while (!socket.send(zmq::buffer(frame.data(), frame.size()), flags)) {
    if (stopping()) return false;
    poll_one(socket, ZMQ_POLLOUT, kSlice);
  }
  return true;
}

bool EngineSockets::send(zmq::socket_t& socket, std::string_view frame) {
  return send_part(socket, frame, false);
}

bool EngineSockets::send_frames(zmq::socket_t& socket, std::span<const std::string> frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    if (!send_part(socket, frames[i], i + 1 < frames.size())) return false;
  }
  return true;
}

std::optional<std::vector<zmq::message_t>> EngineSockets::try_receive(zmq::socket_t& socket) {
  std::vector<zmq::message_t> frames;
  do {
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
    frames.push_back(std::move(frame));
  } while (frames.back().more());
  if (frames.empty()) return std::nullopt;
  return frames;
}

std::optional<std::vector<zmq::message_t>> EngineSockets::receive(
    zmq::socket_t& socket, std::optional<Clock::time_point> deadline) {
  while (!stopping()) {
    auto slice = kSlice;
    if (deadline) {
      const auto now = Clock::now();
      if (now >= *deadline) return std::nullopt;
      slice = std::min(slice, std::chrono::ceil<std::chrono::milliseconds>(*deadline - now));
    }
    if (!poll_one(socket, ZMQ_POLLIN, slice)) continue;
    if (auto frames = try_receive(socket)) return frames;
  }
  return std::nullopt;
}

}  // namespace vllmd::reference
