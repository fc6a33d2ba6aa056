// sse_floor: what one SSE event's write to a loopback TCP socket costs the writer, in CPU
// time split into user and kernel. A reader thread keeps up (it drains the socket as fast as
// it can), so the writer never blocks: this is the kernel's share of every event a frontend
// writes, which no frontend can avoid on this machine. Each round writes --writes events of
// --bytes bytes (one write each) on one connection and reads the writer thread's CPU time
// (getrusage RUSAGE_THREAD for the user/kernel split); the round with the median total is
// reported as one JSON line, per write in microseconds.
//
//   sse_floor --bytes 170 --writes 200000 --rounds 5

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
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

void connected_pair(int& writer, int& reader) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  socklen_t length = sizeof address;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw std::runtime_error("cannot listen on 127.0.0.1");
  }
  writer = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(writer, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    throw std::runtime_error("cannot connect");
  }
  reader = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  // As the servers set it on their connections: each event goes out at once.
  const int one = 1;
  ::setsockopt(writer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Cost one_round(std::size_t bytes, long writes) {
  int writer = -1;
  int reader = -1;
  connected_pair(writer, reader);
  std::atomic<bool> stop{false};
  std::thread drain([&] {
    std::vector<char> buffer(1 << 16);
    while (::read(reader, buffer.data(), buffer.size()) > 0) {
    }
  });
  const std::string event(bytes, 'x');
  rusage before{};
  rusage after{};
  ::getrusage(RUSAGE_THREAD, &before);
  for (long i = 0; i < writes; ++i) {
    if (::write(writer, event.data(), event.size()) != static_cast<ssize_t>(event.size())) {
      throw std::runtime_error("short write");
    }
  }
  ::getrusage(RUSAGE_THREAD, &after);
  ::shutdown(writer, SHUT_WR);
  drain.join();
  ::close(writer);
  ::close(reader);
  const double n = static_cast<double>(writes);
  return {(seconds(after.ru_utime) - seconds(before.ru_utime)) * 1e6 / n,
          (seconds(after.ru_stime) - seconds(before.ru_stime)) * 1e6 / n};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sse_floor: the CPU cost of one SSE event's write to a loopback socket"};
  std::size_t bytes = 170;
  long writes = 200000;
  int rounds = 5;
  app.add_option("--bytes", bytes, "bytes per event, as the frontends write them");
  app.add_option("--writes", writes, "writes per round");
  app.add_option("--rounds", rounds, "rounds; the median one is reported");
  CLI11_PARSE(app, argc, argv);
  std::vector<Cost> costs;
  for (int i = 0; i < rounds; ++i) costs.push_back(one_round(bytes, writes));
  std::sort(costs.begin(), costs.end(),
            [](const Cost& a, const Cost& b) { return a.total() < b.total(); });
  const Cost& median = costs[costs.size() / 2];
  std::printf("{\"bytes\":%zu,\"writes\":%ld,\"rounds\":%d,\"user_us\":%.3f,\"system_us\":%.3f,"
              "\"total_us\":%.3f,\"min_total_us\":%.3f,\"max_total_us\":%.3f}\n",
              bytes, writes, rounds, median.user_us, median.system_us, median.total(),
              costs.front().total(), costs.back().total());
  return 0;
}
