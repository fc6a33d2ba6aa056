#include "common/reference/dp_group.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "common/engine/endpoints.hpp"
#include "common/util/errno_text.hpp"
#include "common/util/fail.hpp"

namespace vllmd::reference {

namespace {

using Clock = std::chrono::steady_clock;
using Result = tl::expected<DpGroup, std::string>;
using util::fail;

constexpr std::chrono::milliseconds kSlice{100};  // longest wait before looking at `stop`
constexpr std::size_t kMaxLine = 4096;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string system_error(std::string_view what) {
  return std::string(what) + ": " + util::errno_text(errno);
}

// The rank-independent part of a rank's hello: the group size and the master it holds. Rank 0
// compares these texts as they are.
std::string describe(int size, const wire::DataParallelMaster& master) {
  std::string text = "size " + std::to_string(size) + " master " + master.ip + ":" +
                     std::to_string(master.port) + " ports [";
  for (std::size_t i = 0; i < master.port_list.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(master.port_list[i]);
  }
  return text + "]";
}

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(std::chrono::milliseconds(0), std::min(left, kSlice));
}

bool readable(int fd, std::chrono::milliseconds timeout) {
  pollfd item{fd, POLLIN, 0};
  return ::poll(&item, 1, static_cast<int>(timeout.count())) > 0;
}

void send_line(int fd, const std::string& line) {
  const std::string framed = line + "\n";
  (void)::send(fd, framed.data(), framed.size(), MSG_NOSIGNAL);
}

// Appends what `fd` has to `buffer`; false on end of stream or error.
bool read_into(int fd, std::string& buffer) {
  char chunk[1024];
  const ssize_t got = ::recv(fd, chunk, sizeof chunk, 0);
  if (got <= 0) return false;
  buffer.append(chunk, static_cast<std::size_t>(got));
  return buffer.size() <= kMaxLine;
}

// Pops the first complete line off `buffer`.
std::optional<std::string> take_line(std::string& buffer) {
  const std::size_t end = buffer.find('\n');
  if (end == std::string::npos) return std::nullopt;
  std::string line = buffer.substr(0, end);
  buffer.erase(0, end + 1);
  return line;
}

tl::expected<addrinfo*, std::string> resolve(const std::string& host, std::int64_t port,
                                             bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) return tl::unexpected("cannot resolve " + host + ": " + ::gai_strerror(rc));
  return found;
}

tl::expected<Fd, std::string> listen_at(const std::string& host, std::int64_t port) {
  auto found = resolve(host, port, true);
  if (!found) return tl::unexpected(found.error());
  Fd fd(::socket((*found)->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int yes = 1;
  const bool ok = fd.get() >= 0 &&
                  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes) == 0 &&
                  ::bind(fd.get(), (*found)->ai_addr, (*found)->ai_addrlen) == 0 &&
                  ::listen(fd.get(), SOMAXCONN) == 0;
  const std::string error =
      ok ? "" : system_error("cannot listen at " + host + ":" + std::to_string(port));
  ::freeaddrinfo(*found);
  if (!ok) return tl::unexpected(error);
  return fd;
}

// One connection attempt, bounded by `timeout`; an invalid Fd when nobody answered.
Fd try_connect(const std::string& host, std::int64_t port, std::chrono::milliseconds timeout) {
  auto found = resolve(host, port, false);
  if (!found) return Fd();
  Fd fd(::socket((*found)->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  bool connected = false;
  if (fd.get() >= 0) {
    if (::connect(fd.get(), (*found)->ai_addr, (*found)->ai_addrlen) == 0) {
      connected = true;
    } else if (errno == EINPROGRESS) {
      pollfd item{fd.get(), POLLOUT, 0};
      int error = 0;
      socklen_t length = sizeof error;
      connected = ::poll(&item, 1, static_cast<int>(timeout.count())) > 0 &&
                  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
    }
  }
  ::freeaddrinfo(*found);
  if (!connected) return Fd();
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd;
}

// torch's TCPStore counts the seconds of its timeout one up (600 s read "601 seconds").
std::string store_timeout(const DpGroupRequest& request) {
  return "torch.distributed.DistStoreError: Timed out after " +
         std::to_string(request.timeout.count() / 1000 + 1) + " seconds";
}

DpGroup formed(const DpGroupRequest& request, std::int64_t group_port) {
  return {request.rank, request.size, request.master, group_port, false};
}

constexpr int kWaiting = -1;  // Peer::rank before its hello
constexpr int kRefused = -2;  // and after a hello that cannot join, or a peer gone silent

// A peer connected to rank 0: its bytes so far, and its hello once complete.
struct Peer {
  Fd fd;
  std::string buffer;
  int rank = kWaiting;
  std::string description;
};

// Rank 0: what a peer's hello line says, or why it cannot join.
tl::expected<int, std::string> peer_rank(const std::string& line, int size, std::string& rest) {
  constexpr std::string_view kPrefix = "rank ";
  const std::size_t space = line.find(' ', kPrefix.size());
  if (line.rfind(kPrefix, 0) != 0 || space == std::string::npos) {
    return fail("not a DP group hello");
  }
  const int rank = std::atoi(line.substr(kPrefix.size(), space - kPrefix.size()).c_str());
  if (rank < 1 || rank >= size) {
    return tl::unexpected("rank " + std::to_string(rank) + " is outside the group of " +
                          std::to_string(size));
  }
  rest = line.substr(space + 1);
  return rank;
}

// Reads what a waiting peer sent; a complete hello joins it (rank -> index in `joined`).
void read_hello(Peer& peer, std::size_t index, int size, std::map<int, std::size_t>& joined) {
  const bool open = read_into(peer.fd.get(), peer.buffer);
  auto line = take_line(peer.buffer);
  if (!line) {
    if (!open) peer.rank = kRefused;
    return;
  }
  auto rank = peer_rank(*line, size, peer.description);
  if (rank && joined.count(*rank) != 0) {
    rank = tl::unexpected("rank " + std::to_string(*rank) + " joined twice");
  }
  if (!rank) {
    send_line(peer.fd.get(), "error " + rank.error());
    peer.rank = kRefused;
    return;
  }
  peer.rank = *rank;
  joined[*rank] = index;
}

// Rank 0 listens, collects a hello from every other rank and answers all of them at once.
Result serve_group(const DpGroupRequest& request, std::int64_t group_port,
                   const std::atomic<bool>& stop) {
  // On every interface, as torch's TCPStore server does: the master's address is where the
  // other ranks connect, not necessarily one of this host's (without a master in INIT it is
  // the frontend's).
  const bool v6 = request.master.ip.find(':') != std::string::npos;
  auto listener = listen_at(v6 ? "::" : "0.0.0.0", group_port);
  if (!listener) return tl::unexpected(listener.error());
  const std::string own = describe(request.size, request.master);
  const auto deadline = Clock::now() + request.timeout;
  std::vector<Peer> peers;
  std::map<int, std::size_t> joined;  // rank -> index in peers

  while (static_cast<int>(joined.size()) + 1 < request.size) {
    if (stop.load()) return fail("stopped");
    if (Clock::now() >= deadline) {
      const std::string error = store_timeout(request) + " waiting for clients. " +
                                std::to_string(joined.size() + 1) + "/" +
                                std::to_string(request.size) + " clients joined.";
      for (const Peer& peer : peers) send_line(peer.fd.get(), "error " + error);
      return tl::unexpected(error);
    }
    // Poll the listener and the peers that have not said hello yet.
    std::vector<pollfd> items{{listener->get(), POLLIN, 0}};
    std::vector<std::size_t> waiting;
    for (std::size_t i = 0; i < peers.size(); ++i) {
      if (peers[i].rank != kWaiting) continue;
      items.push_back({peers[i].fd.get(), POLLIN, 0});
      waiting.push_back(i);
    }
    if (::poll(items.data(), items.size(), static_cast<int>(remaining(deadline).count())) <= 0) {
      continue;
    }
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      if (items[i + 1].revents != 0) {
        read_hello(peers[waiting[i]], waiting[i], request.size, joined);
      }
    }
    if (items[0].revents & POLLIN) {
      Fd accepted(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (accepted.get() >= 0) {
        Peer peer;
        peer.fd = std::move(accepted);
        peers.push_back(std::move(peer));
      }
    }
  }
  // Everyone is in: the group forms only if all were given the same master.
  for (const auto& [rank, index] : joined) {
    if (peers[index].description == own) continue;
    const std::string error = "the DP group does not agree on its master: rank " +
                              std::to_string(rank) + " holds " + peers[index].description +
                              ", rank 0 holds " + own;
    for (const auto& [other, at] : joined) send_line(peers[at].fd.get(), "error " + error);
    return tl::unexpected(error);
  }
  for (const auto& [rank, index] : joined) send_line(peers[index].fd.get(), "ok");
  return formed(request, group_port);
}

// Ranks 1..N-1 connect to rank 0 (retrying until it listens), say who they are and wait.
Result join_group(const DpGroupRequest& request, std::int64_t group_port,
                  const std::atomic<bool>& stop) {
  const auto deadline = Clock::now() + request.timeout;
  Fd fd;
  while (fd.get() < 0) {
    if (stop.load()) return fail("stopped");
    if (Clock::now() >= deadline) {
      return tl::unexpected(
          "torch.distributed.DistNetworkError: The client socket has timed out after " +
          std::to_string(request.timeout.count()) + "ms while trying to connect to (" +
          request.master.ip + ", " + std::to_string(group_port) + ").");
    }
    fd = try_connect(request.master.ip, group_port, remaining(deadline));
    if (fd.get() < 0) std::this_thread::sleep_for(remaining(deadline));
  }
  send_line(fd.get(),
            "rank " + std::to_string(request.rank) + " " + describe(request.size, request.master));
  std::string buffer;
  while (true) {
    if (auto line = take_line(buffer)) {
      if (*line == "ok") return formed(request, group_port);
      return tl::unexpected(line->rfind("error ", 0) == 0 ? line->substr(6) : *line);
    }
    if (stop.load()) return fail("stopped");
    if (Clock::now() >= deadline) {
      return fail(store_timeout(request) + " waiting for the DP group at rank 0");
    }
    if (readable(fd.get(), remaining(deadline)) && !read_into(fd.get(), buffer)) {
      return fail("torch.distributed.DistNetworkError: Connection reset by peer");
    }
  }
}

}  // namespace

tl::expected<wire::DataParallelMaster, std::string> own_data_parallel_master(
    std::string_view handshake_address, int data_parallel_size) {
  auto endpoint = engine::parse_endpoint(handshake_address);
  const bool tcp_host =
      endpoint && endpoint->transport == "tcp" && !engine::is_wildcard_host(endpoint->host);
  return wire::pick_data_parallel_master(tcp_host ? endpoint->host : "127.0.0.1",
                                         data_parallel_size);
}

tl::expected<DpGroup, std::string> form_dp_group(const DpGroupRequest& request,
                                                 const std::atomic<bool>& stop) {
  wire::DataParallelMaster ports = request.master;
  const std::int64_t group_port = wire::next_dp_init_port(ports);
  return request.rank == 0 ? serve_group(request, group_port, stop)
                           : join_group(request, group_port, stop);
}

}  // namespace vllmd::reference
