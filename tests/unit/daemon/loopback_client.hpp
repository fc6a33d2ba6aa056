#pragma once
// A blocking loopback client for the HTTP server tests, with the ways a real client leaves:
// a half-close (FIN), a reset (RST), or simply not reading.

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <linux/tcp.h>  // tcp_info with tcpi_segs_in, which glibc's lacks
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace vllmd::test {

class LoopbackClient {
 public:
  // `receive_buffer` > 0 shrinks the socket's receive buffer (before connecting, so the
  // window is small too): a client that stops reading then fills up quickly.
  explicit LoopbackClient(std::uint16_t port, int receive_buffer = 0)
      : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    if (receive_buffer > 0) {
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval timeout{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  }
  ~LoopbackClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  LoopbackClient(const LoopbackClient&) = delete;
  LoopbackClient& operator=(const LoopbackClient&) = delete;

  void send(const std::string& bytes) const {
    REQUIRE(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size()));
  }
  // Everything until the server closes (or the timeout).
  std::string read_all() const {
    std::string out;
    char buffer[4096];
    for (ssize_t n; (n = ::recv(fd_, buffer, sizeof buffer, 0)) > 0;)
      out.append(buffer, static_cast<std::size_t>(n));
    return out;
  }
  // Reads until `marker` has been seen `times` times.
  std::string read_until(const std::string& marker, int times = 1) const {
    std::string out;
    char buffer[4096];
    auto count = [&] {
      int seen = 0;
      for (std::size_t at = out.find(marker); at != std::string::npos;
           at = out.find(marker, at + 1))
        ++seen;
      return seen;
    };
    while (count() < times) {
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      out.append(buffer, static_cast<std::size_t>(n));
    }
    return out;
  }
  // One read of what has arrived: 0 at the end, -1 on an error or the timeout.
  ssize_t read_some(std::string& out) const {
    char buffer[16384];
    const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
    if (n > 0) out.append(buffer, static_cast<std::size_t>(n));
    return n;
  }
  void half_close() const { ::shutdown(fd_, SHUT_WR); }
  // Closes with SO_LINGER 0: the server sees a reset, not a FIN.
  void reset() {
    const linger abortive{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abortive, sizeof abortive);
    ::close(fd_);
    fd_ = -1;
  }
  // TCP segments this socket has received so far (data and acknowledgements alike).
  std::uint32_t segments_in() const {
    tcp_info info{};
    socklen_t length = sizeof info;
    REQUIRE(::getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &info, &length) == 0);
    return info.tcpi_segs_in;
  }

 private:
  int fd_;
};

}  // namespace vllmd::test
