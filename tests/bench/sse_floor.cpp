// sse_floor: what one SSE event's write to a loopback TCP socket costs the writer, in CPU
// time split into user and kernel. A reader thread keeps up (it drains the socket as fast as
// it can), so the writer never blocks: this is the kernel's share of every event a frontend
// writes, which no frontend can avoid on this machine. Each round writes --writes events of
// --bytes bytes (one write each) on one connection and reads the writer thread's CPU time
// (getrusage RUSAGE_THREAD for the user/kernel split); the round with the median total is
// reported as one JSON line, per write in microseconds.
//
// With --connections N the writer writes one event to each of N connections per step, a step
// every --step-ms, and one reader thread reads them all through epoll, sleeping between steps:
// the pattern of a frontend feeding N streams an event per engine step, where each write also
// pays for waking the reader (which the one-connection floor, its reader awake, does not).
//
//   sse_floor --bytes 170 --writes 200000 --rounds 5
//   sse_floor --bytes 170 --writes 204800 --rounds 3 --connections 1024 --step-ms 20

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

double seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; }

struct Cost {
  double user_us;
  double system_us;
  double total() const { return user_us + system_us; }
};

// `count` connected pairs over loopback, the writer ends with TCP_NODELAY as the servers set.
void connected_pairs(std::size_t count, std::vector<int>& writers, std::vector<int>& readers) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  socklen_t length = sizeof address;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener, 4096) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw std::runtime_error("cannot listen on 127.0.0.1");
  }
  for (std::size_t i = 0; i < count; ++i) {
    const int writer = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(writer, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      throw std::runtime_error("cannot connect");
    }
    // As the servers set it on their connections: each event goes out at once.
    const int one = 1;
    ::setsockopt(writer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    writers.push_back(writer);
    readers.push_back(::accept(listener, nullptr, nullptr));
  }
  ::close(listener);
}

// Reads every reader until each one ends, sleeping in epoll while none has bytes.
void drain_all(const std::vector<int>& readers) {
  const int epoll = ::epoll_create1(0);
  for (const int fd : readers) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    ::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event);
  }
  std::vector<char> buffer(1 << 16);
  std::vector<epoll_event> ready(256);
  std::size_t open = readers.size();
  while (open > 0) {
    const int n = ::epoll_wait(epoll, ready.data(), static_cast<int>(ready.size()), -1);
    for (int i = 0; i < n; ++i) {
      const int fd = ready[static_cast<std::size_t>(i)].data.fd;
      if (::read(fd, buffer.data(), buffer.size()) <= 0) {
        ::epoll_ctl(epoll, EPOLL_CTL_DEL, fd, nullptr);
        --open;
      }
    }
  }
  ::close(epoll);
}

Cost one_round(std::size_t bytes, long writes, std::size_t connections, double step_ms) {
  std::vector<int> writers;
  std::vector<int> readers;
  connected_pairs(connections, writers, readers);
  std::thread drain([&] { drain_all(readers); });
  const std::string event(bytes, 'x');
  const long steps = std::max(1L, writes / static_cast<long>(connections));
  const auto step = std::chrono::duration<double, std::milli>(step_ms);
  rusage before{};
  rusage after{};
  ::getrusage(RUSAGE_THREAD, &before);
  auto next = std::chrono::steady_clock::now();
  for (long s = 0; s < steps; ++s) {
    for (const int writer : writers) {
      if (::write(writer, event.data(), event.size()) != static_cast<ssize_t>(event.size())) {
        throw std::runtime_error("short write");
      }
    }
    if (step_ms > 0) {
      next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(step);
      std::this_thread::sleep_until(next);
    }
  }
  ::getrusage(RUSAGE_THREAD, &after);
  for (const int writer : writers) ::shutdown(writer, SHUT_WR);
  drain.join();
  for (const int fd : writers) ::close(fd);
  for (const int fd : readers) ::close(fd);
  const double n = static_cast<double>(steps) * static_cast<double>(connections);
  return {(seconds(after.ru_utime) - seconds(before.ru_utime)) * 1e6 / n,
          (seconds(after.ru_stime) - seconds(before.ru_stime)) * 1e6 / n};
}

int run(int argc, char** argv) {
  CLI::App app{"sse_floor: the CPU cost of one SSE event's write to a loopback socket"};
  std::size_t bytes = 170;
  long writes = 200000;
  int rounds = 5;
  std::size_t connections = 1;
  double step_ms = 0;
  app.add_option("--bytes", bytes, "bytes per event, as the frontends write them");
  app.add_option("--connections", connections, "connections written in turn, one event each")
      ->check(CLI::Range(std::size_t{1}, std::size_t{60000}));
  app.add_option("--step-ms", step_ms, "time between rounds of writes over the connections");
  app.add_option("--writes", writes, "writes per round");
  app.add_option("--rounds", rounds, "rounds; the median one is reported")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  std::vector<Cost> costs;
  costs.reserve(static_cast<std::size_t>(std::max(rounds, 0)));
  for (int i = 0; i < rounds; ++i) costs.push_back(one_round(bytes, writes, connections, step_ms));
  std::sort(costs.begin(), costs.end(),
            [](const Cost& a, const Cost& b) { return a.total() < b.total(); });
  const Cost& median = costs[costs.size() / 2];
  std::printf(
      "{\"bytes\":%zu,\"writes\":%ld,\"rounds\":%d,\"connections\":%zu,"
      "\"step_ms\":%.1f,\"user_us\":%.3f,\"system_us\":%.3f,\"total_us\":%.3f,"
      "\"min_total_us\":%.3f,\"max_total_us\":%.3f}\n",
      bytes, writes, rounds, connections, step_ms, median.user_us, median.system_us, median.total(),
      costs.front().total(), costs.back().total());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "sse_floor: %s\n", error.what());
    return 1;
  }
}
