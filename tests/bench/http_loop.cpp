#include "tests/bench/http_loop.hpp"

#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "common/util/errno_text.hpp"

namespace vllmd::bench {

Loop::Loop(const Plan& plan, int connections) : plan_(plan), connections_(connections) {
  stats_.steps.resize(plan.requests.size());
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) throw std::runtime_error("epoll_create1: " + vllmd::util::errno_text(errno));
}

Loop::~Loop() {
  for (Connection& connection : connections_) close_socket(connection);
  if (epoll_ >= 0) ::close(epoll_);
}

void Loop::run() {
  for (Connection& connection : connections_) open(connection);
  epoll_event events[256];
  while (active() > 0) {
    const Clock::time_point now = Clock::now();
    if (now >= plan_.deadline) break;
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(plan_.deadline - now);
    const int ready = epoll_wait(epoll_, events, 256, static_cast<int>(wait.count()));
    if (ready < 0 && errno != EINTR) throw std::runtime_error("epoll_wait failed");
    for (int i = 0; i < ready; ++i) {
      auto* connection = static_cast<Connection*>(events[i].data.ptr);
      if (connection->state == Connection::State::kConnecting) finish_connect(*connection);
      drive(*connection);
    }
  }
  stats_.finished = std::min(Clock::now(), plan_.deadline);
  const Clock::time_point end = Clock::now();
  for (Connection& connection : connections_) {
    const bool waiting = connection.state == Connection::State::kSending ||
                         connection.state == Connection::State::kReceiving;
    if (waiting) {
      ++stats_.unfinished;
      stats_.oldest_unfinished_us =
          std::max(stats_.oldest_unfinished_us,
                   std::chrono::duration<double, std::micro>(end - connection.started).count());
    }
    if (connection.completed_in_window == 0) ++stats_.stalled_connections;
    close_socket(connection);
  }
}

std::size_t Loop::active() const {
  return static_cast<std::size_t>(
      std::count_if(connections_.begin(), connections_.end(),
                    [](const Connection& c) { return c.state != Connection::State::kDone; }));
}

void Loop::close_socket(Connection& connection) {
  if (connection.fd >= 0) ::close(connection.fd);  // also leaves the epoll set
  connection.fd = -1;
}

void Loop::give_up(Connection& connection) {
  close_socket(connection);
  connection.state = Connection::State::kDone;
}

void Loop::open(Connection& connection) {
  close_socket(connection);
  connection.in.clear();
  connection.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (connection.fd < 0) {
    ++stats_.connect_errors;
    give_up(connection);
    return;
  }
  const int one = 1;
  setsockopt(connection.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int result = connect(connection.fd, reinterpret_cast<const sockaddr*>(&plan_.address),
                             sizeof plan_.address);
  if (result < 0 && errno != EINPROGRESS) {
    ++stats_.connect_errors;
    give_up(connection);
    return;
  }
  // Edge-triggered, both directions, registered once: no epoll_ctl per request.
  epoll_event event{};
  event.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  event.data.ptr = &connection;
  epoll_ctl(epoll_, EPOLL_CTL_ADD, connection.fd, &event);
  connection.state = Connection::State::kConnecting;
  if (result == 0) {
    connection.state = Connection::State::kIdle;
    drive(connection);
  }
}

void Loop::finish_connect(Connection& connection) {
  int error = 0;
  socklen_t length = sizeof error;
  getsockopt(connection.fd, SOL_SOCKET, SO_ERROR, &error, &length);
  if (error == EINPROGRESS) return;
  if (error != 0) {
    ++stats_.connect_errors;
    give_up(connection);
    return;
  }
  connection.state = Connection::State::kIdle;
}

void Loop::fail(Connection& connection, bool parse_error) {
  ++(parse_error ? stats_.parse_errors : stats_.io_errors);
  connection.iteration_ok = false;
  advance(connection, true);
  if (++connection.failures >= kMaxFailuresPerConnection || Clock::now() >= plan_.deadline) {
    give_up(connection);
    return;
  }
  open(connection);
}

void Loop::advance(Connection& connection, bool recorded) {
  if (++connection.step < plan_.requests.size()) return;
  connection.step = 0;
  ++connection.iterations;
  if (recorded && connection.started >= plan_.measure_from) {
    ++stats_.sequences;
    if (connection.iteration_ok) ++stats_.sequences_ok;
  }
  connection.iteration_ok = true;
}

void Loop::complete(Connection& connection, const ParsedResponse& response) {
  const Clock::time_point now = Clock::now();
  const bool ok = response.status >= 200 && response.status < 300;
  if (connection.started >= plan_.measure_from) {
    StepStats& step = stats_.steps[connection.step];
    step.micros.push_back(
        std::chrono::duration<double, std::micro>(now - connection.started).count());
    ++step.status[response.status];
    ++connection.completed_in_window;
    if (!ok && step.first_error.empty()) {
      const std::string_view whole(connection.in.data(), response.length);
      const std::size_t body = whole.find("\r\n\r\n");
      step.first_error =
          std::to_string(response.status) + " " +
          std::string(whole.substr(body == std::string_view::npos ? whole.size() : body + 4,
                                   kErrorBodyChars));
    }
  }
  if (!ok) connection.iteration_ok = false;
  connection.in.erase(0, response.length);
  advance(connection, true);
  if (response.close) {
    ++stats_.reconnects;
    open(connection);
  } else {
    connection.state = Connection::State::kIdle;
  }
}

Loop::Progress Loop::send_some(Connection& connection) {
  const RequestSpec& request = plan_.requests[connection.step];
  const std::size_t total = request.head.size() + request.body->size();
  while (connection.sent < total) {
    iovec parts[2];
    int count = 0;
    if (connection.sent < request.head.size()) {
      parts[count++] = {const_cast<char*>(request.head.data()) + connection.sent,
                        request.head.size() - connection.sent};
      if (!request.body->empty()) {
        parts[count++] = {const_cast<char*>(request.body->data()), request.body->size()};
      }
    } else {
      const std::size_t offset = connection.sent - request.head.size();
      parts[count++] = {const_cast<char*>(request.body->data()) + offset,
                        request.body->size() - offset};
    }
    msghdr message{};
    message.msg_iov = parts;
    message.msg_iovlen = static_cast<std::size_t>(count);
    const ssize_t written = sendmsg(connection.fd, &message, MSG_NOSIGNAL);
    if (written < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? Progress::kBlocked : Progress::kFailed;
    }
    connection.sent += static_cast<std::size_t>(written);
  }
  return Progress::kDone;
}

Loop::Progress Loop::receive_some(Connection& connection, ParsedResponse& response) {
  char buffer[65536];
  for (;;) {
    const ssize_t got = read(connection.fd, buffer, sizeof buffer);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? Progress::kBlocked : Progress::kFailed;
    }
    if (got > 0) connection.in.append(buffer, static_cast<std::size_t>(got));
    response = vllmd::bench::parse_response(connection.in, got == 0);
    if (response.state == ParsedResponse::State::kComplete) return Progress::kDone;
    if (response.state == ParsedResponse::State::kError || got == 0) return Progress::kFailed;
  }
}

void Loop::drive(Connection& connection) {
  for (;;) {
    switch (connection.state) {
      case Connection::State::kConnecting:
      case Connection::State::kDone: return;
      case Connection::State::kIdle: {
        const Clock::time_point now = Clock::now();
        if (now >= plan_.deadline ||
            (plan_.iterations > 0 && connection.iterations >= plan_.iterations)) {
          give_up(connection);
          return;
        }
        connection.started = now;
        connection.sent = 0;
        connection.state = Connection::State::kSending;
        break;
      }
      case Connection::State::kSending: {
        const Progress sent = send_some(connection);
        if (sent == Progress::kFailed) return fail(connection, false);
        if (sent == Progress::kBlocked) {
          // A server may answer (413, say) before it read the whole body.
          ParsedResponse early;
          const Progress got = receive_some(connection, early);
          if (got == Progress::kDone) {
            early.close = true;  // the rest of the request cannot be sent on this connection
            complete(connection, early);
            continue;
          }
          if (got == Progress::kFailed) return fail(connection, false);
          return;
        }
        connection.state = Connection::State::kReceiving;
        break;
      }
      case Connection::State::kReceiving: {
        ParsedResponse response;
        const Progress got = receive_some(connection, response);
        if (got == Progress::kBlocked) return;
        if (got == Progress::kFailed) {
          return fail(connection,
                      response.state == ParsedResponse::State::kError && !connection.in.empty());
        }
        complete(connection, response);
        break;
      }
    }
  }
}

}  // namespace vllmd::bench
