// sse_load: many concurrent streaming generations against one server, one epoll loop.
//
// Phase 1 opens --streams connections (--connect-batch at a time, so no listen backlog
// overflows and no SYN is retried a second later). Phase 2 sends one POST per connection,
// spread evenly over --ramp seconds (open loop: a request goes out at its time whatever the
// others do), and reads each SSE answer to `data: [DONE]`. It prints one JSON line:
//  - per stream: time to first token (from the request's last byte written to the first
//    event with tokens read), events with tokens, tokens, first-to-last event span;
//  - tokens/s over the window from the first request sent to the last [DONE];
//  - the step period seen by clients: per stream (last event - first event) / (tokens - 1),
//    exact when every step brings one token (the engine's --tokens-per-step 1), median;
//  - errors: connect, I/O, HTTP status other than 200, streams without [DONE].
// Answers may be chunked (Transfer-Encoding) or close-delimited.
//
//   sse_load --port 8000 --streams 1024 --ramp 1 --body '{"token_ids":[1],...}'

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::chrono::nanoseconds realtime_lead() {
  timespec real{};
  timespec steady{};
  ::clock_gettime(CLOCK_REALTIME, &real);
  ::clock_gettime(CLOCK_MONOTONIC, &steady);
  return std::chrono::seconds(real.tv_sec - steady.tv_sec) +
         std::chrono::nanoseconds(real.tv_nsec - steady.tv_nsec);
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Stream {
  int fd = -1;
  enum class State { kConnecting, kConnected, kSending, kHead, kBody, kDone, kFailed };
  State state = State::kConnecting;
  std::size_t sent = 0;
  Clock::time_point due, request_sent, first_event, last_event;
  // When the first event's bytes reached this socket, by the kernel's receive timestamp.
  Clock::time_point first_arrival;
  bool have_first = false;
  bool chunked = false;
  std::uint64_t chunk_left = 0;  // bytes of the current chunk's data still to come
  bool in_chunk_trailer = false;
  int status = 0;
  std::string in;      // raw bytes not yet parsed
  std::string events;  // decoded body not yet split into events
  std::uint64_t event_count = 0;
  std::uint64_t tokens = 0;
  bool done = false;
};

struct Totals {
  std::uint64_t connect_errors = 0, io_errors = 0, bad_status = 0, parse_errors = 0;
  std::uint64_t event_errors = 0;  // `data: {"error": ...}` events
};

// Tokens in one event's "token_ids":[...] (0 when absent).
std::uint64_t count_tokens(std::string_view event) {
  const std::size_t at = event.find("\"token_ids\":[");
  if (at == std::string_view::npos) return 0;
  std::size_t i = at + 13;
  if (i < event.size() && event[i] == ']') return 0;
  std::uint64_t n = 1;
  for (; i < event.size() && event[i] != ']'; ++i) n += event[i] == ',';
  return n;
}

class Runner {
 public:
  Runner(sockaddr_in address, std::string request, int streams)
      : address_(address), request_(std::move(request)), streams_(streams) {
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  }
  ~Runner() {
    for (auto& s : streams_)
      if (s.fd >= 0) ::close(s.fd);
    ::close(epoll_);
  }

  void connect_all(int batch, double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    std::size_t next = 0;
    std::size_t pending = 0;
    while ((next < streams_.size() || pending > 0) && Clock::now() < deadline) {
      while (next < streams_.size() && pending < static_cast<std::size_t>(batch)) {
        open(streams_[next], next);
        ++next;
        if (streams_[next - 1].state == Stream::State::kConnecting) ++pending;
      }
      epoll_event ready[256];
      const int n = ::epoll_wait(epoll_, ready, 256, 100);
      for (int i = 0; i < n; ++i) {
        Stream& s = streams_[ready[i].data.u64];
        if (s.state != Stream::State::kConnecting) continue;
        int error = 0;
        socklen_t length = sizeof error;
        ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &error, &length);
        --pending;
        if (error != 0) {
          fail(s, totals_.connect_errors);
        } else {
          s.state = Stream::State::kConnected;
          watch(s, ready[i].data.u64, EPOLLIN);
        }
      }
    }
    for (auto& s : streams_)
      if (s.state == Stream::State::kConnecting) fail(s, totals_.connect_errors);
  }

  // Sends each request at its time and reads every answer; returns when all are done or at
  // the deadline.
  void run(double ramp_s, double timeout_s) {
    start_ = Clock::now();
    const auto deadline = start_ + std::chrono::duration<double>(timeout_s);
    const double gap = streams_.size() > 1 ? ramp_s / static_cast<double>(streams_.size()) : 0;
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      streams_[i].due = start_ + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(gap * static_cast<double>(i)));
    }
    std::size_t next_send = 0;
    std::size_t open = 0;
    for (auto& s : streams_) open += s.state == Stream::State::kConnected;
    // Room for every stream: one that is ready is seen in this round, not the next.
    std::vector<epoll_event> ready(std::max<std::size_t>(streams_.size(), 1));
    while (Clock::now() < deadline) {
      const auto now = Clock::now();
      while (next_send < streams_.size() && streams_[next_send].due <= now) {
        Stream& s = streams_[next_send];
        if (s.state == Stream::State::kConnected) {
          s.state = Stream::State::kSending;
          send_some(s, next_send);
        }
        ++next_send;
      }
      if (next_send == streams_.size() && finished_ == open) break;
      int timeout_ms = 100;
      if (next_send < streams_.size()) {
        const auto wait =
            std::chrono::ceil<std::chrono::milliseconds>(streams_[next_send].due - Clock::now());
        timeout_ms = static_cast<int>(std::clamp<std::int64_t>(wait.count(), 0, 100));
      }
      const int n = ::epoll_wait(epoll_, ready.data(), static_cast<int>(ready.size()), timeout_ms);
      const Clock::time_point ready_at = Clock::now();
      for (int i = 0; i < n; ++i) {
        const std::uint64_t index = ready[i].data.u64;
        Stream& s = streams_[index];
        if (s.state == Stream::State::kSending && (ready[i].events & EPOLLOUT)) {
          send_some(s, index);
        }
        if (s.state == Stream::State::kHead || s.state == Stream::State::kBody ||
            s.state == Stream::State::kConnected || s.state == Stream::State::kSending) {
          if (ready[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) receive(s, ready_at);
        }
      }
    }
    end_ = Clock::now();
  }

  // One line per stream that got a first event: its id, when its request's last byte went,
  // when its first event was read and when that event's bytes reached the socket, in
  // CLOCK_MONOTONIC seconds (the engines' clock on this machine).
  void write_times(const std::string& path) const {
    std::FILE* out = std::fopen(path.c_str(), "w");
    if (out == nullptr) return;
    const auto seconds = [](Clock::time_point t) {
      return std::chrono::duration<double>(t.time_since_epoch()).count();
    };
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      const Stream& s = streams_[i];
      if (s.have_first) {
        std::fprintf(out, "s%zu %.6f %.6f %.6f\n", i, seconds(s.request_sent),
                     seconds(s.first_event), seconds(s.first_arrival));
      }
    }
    std::fclose(out);
  }

  void report(double ramp_s) const {
    std::vector<double> ttft, period;
    std::uint64_t events = 0, tokens = 0, done = 0, unfinished = 0, max_events = 0;
    std::uint64_t events_over_tokens = 0;  // streams with more events than tokens
    Clock::time_point first_sent = Clock::time_point::max(), last_done = start_;
    for (const auto& s : streams_) {
      events += s.event_count;
      tokens += s.tokens;
      max_events = std::max(max_events, s.event_count);
      if (s.event_count > s.tokens) ++events_over_tokens;
      if (s.sent > 0 && s.request_sent != Clock::time_point{})
        first_sent = std::min(first_sent, s.request_sent);
      if (s.done) {
        ++done;
        last_done = std::max(last_done, s.last_event);
      } else if (s.state != Stream::State::kFailed) {
        ++unfinished;
      }
      if (s.have_first) ttft.push_back(micros(s.first_event - s.request_sent));
      if (s.done && s.tokens > 1)
        period.push_back(micros(s.last_event - s.first_event) / static_cast<double>(s.tokens - 1));
    }
    auto pct = [](std::vector<double> v, double q) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
    };
    const double window_s =
        first_sent == Clock::time_point::max() ? 0 : micros(last_done - first_sent) / 1e6;
    std::printf(
        "{\"streams\":%zu,\"done\":%llu,\"unfinished\":%llu,\"connect_errors\":%llu,"
        "\"io_errors\":%llu,\"bad_status\":%llu,\"parse_errors\":%llu,\"error_events\":%llu,"
        "\"events\":%llu,\"tokens\":%llu,\"max_events_per_stream\":%llu,"
        "\"streams_with_more_events_than_tokens\":%llu,\"ramp_s\":%.3f,\"window_s\":%.4f,"
        "\"tokens_per_s\":%.1f,\"ttft_us\":{\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,"
        "\"max\":%.1f},\"period_us\":{\"p50\":%.1f,\"p10\":%.1f,\"p90\":%.1f},"
        "\"run_s\":%.3f}\n",
        streams_.size(), static_cast<unsigned long long>(done),
        static_cast<unsigned long long>(unfinished),
        static_cast<unsigned long long>(totals_.connect_errors),
        static_cast<unsigned long long>(totals_.io_errors),
        static_cast<unsigned long long>(totals_.bad_status),
        static_cast<unsigned long long>(totals_.parse_errors),
        static_cast<unsigned long long>(totals_.event_errors),
        static_cast<unsigned long long>(events), static_cast<unsigned long long>(tokens),
        static_cast<unsigned long long>(max_events),
        static_cast<unsigned long long>(events_over_tokens), ramp_s, window_s,
        window_s > 0 ? static_cast<double>(tokens) / window_s : 0.0, pct(ttft, 0.5), pct(ttft, 0.9),
        pct(ttft, 0.99), pct(ttft, 1.0), pct(period, 0.5), pct(period, 0.1), pct(period, 0.9),
        micros(end_ - start_) / 1e6);
  }

 private:
  void open(Stream& s, std::size_t index) {
    s.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s.fd < 0) {
      fail(s, totals_.connect_errors);
      return;
    }
    const int one = 1;
    ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(s.fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&address_), sizeof address_) != 0 &&
        errno != EINPROGRESS) {
      fail(s, totals_.connect_errors);
      return;
    }
    epoll_event event{};
    event.events = EPOLLOUT;
    event.data.u64 = index;
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, s.fd, &event);
  }

  void watch(Stream& s, std::uint64_t index, std::uint32_t events) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = index;
    ::epoll_ctl(epoll_, EPOLL_CTL_MOD, s.fd, &event);
  }

  void fail(Stream& s, std::uint64_t& counter) {
    ++counter;
    if (s.fd >= 0) ::close(s.fd);
    s.fd = -1;
    const bool was_running = s.state != Stream::State::kConnecting &&
                             s.state != Stream::State::kFailed && s.state != Stream::State::kDone;
    s.state = Stream::State::kFailed;
    if (was_running) ++finished_;
  }

  // The request of stream `index`: the shared head, its own X-Request-Id (s<index>), the body.
  void build_request(std::uint64_t index) {
    const std::size_t fields = request_.find("\r\n") + 2;
    one_request_ = request_.substr(0, fields) + "X-Request-Id: s" + std::to_string(index) + "\r\n" +
                   request_.substr(fields);
  }

  void send_some(Stream& s, std::uint64_t index) {
    if (s.sent == 0 || one_request_index_ != index) {
      build_request(index);
      one_request_index_ = index;
    }
    while (s.sent < one_request_.size()) {
      const ssize_t n =
          ::send(s.fd, one_request_.data() + s.sent, one_request_.size() - s.sent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN) {
          watch(s, index, EPOLLIN | EPOLLOUT);
          return;
        }
        fail(s, totals_.io_errors);
        return;
      }
      s.sent += static_cast<std::size_t>(n);
    }
    s.request_sent = Clock::now();
    s.state = Stream::State::kHead;
    watch(s, index, EPOLLIN);
  }

  // `ready_at`: when epoll said the socket was readable. A stream whose head was read
  // earlier was woken by its next event's bytes, which were in the socket by then: a first
  // event read now is timed at `ready_at`, not when this loop got round to the socket among
  // a step's hundreds (this process's own queue is no frontend's doing). Read together with
  // its head, it is timed when read.
  void receive(Stream& s, Clock::time_point ready_at) {
    char buffer[65536];
    bool woken_by_event = s.state == Stream::State::kBody;
    for (;;) {
      Clock::time_point arrived{};
      const ssize_t n = receive_stamped(s.fd, buffer, sizeof buffer, arrived);
      if (n > 0) {
        s.in.append(buffer, static_cast<std::size_t>(n));
        const Clock::time_point now = Clock::now();
        const bool had_first = s.have_first;
        if (!parse(s, now, woken_by_event ? ready_at : now)) return;
        if (!had_first && s.have_first) s.first_arrival = arrived;
        woken_by_event = false;
        if (static_cast<std::size_t>(n) < sizeof buffer) return;
        continue;
      }
      if (n < 0 && errno == EAGAIN) return;
      // Closed: the end of a close-delimited body, or an error.
      if (s.state == Stream::State::kBody && !s.chunked) {
        s.events.append(s.in);
        s.in.clear();
        const Clock::time_point now = Clock::now();
        split_events(s, now, now);
      }
      if (!s.done) fail(s, totals_.io_errors);
      return;
    }
  }

  // recv, with the kernel's receive time of the last segment read (SO_TIMESTAMPNS, on
  // CLOCK_REALTIME) turned into a steady-clock time point: when the frontend's write reached
  // this socket, whatever this process was busy with then. With several segments read at
  // once it is the last one's, so a first event read late is never timed early.
  ssize_t receive_stamped(int fd, char* buffer, std::size_t size, Clock::time_point& arrived) {
    iovec io{buffer, size};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd, &message, 0);
    if (n <= 0) return n;
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
      timespec stamp{};
      std::memcpy(&stamp, CMSG_DATA(c), sizeof stamp);
      const auto since_epoch =
          std::chrono::seconds(stamp.tv_sec) + std::chrono::nanoseconds(stamp.tv_nsec);
      arrived = Clock::time_point(
          std::chrono::duration_cast<Clock::duration>(since_epoch - realtime_ahead_));
    }
    if (arrived == Clock::time_point{}) arrived = Clock::now();
    return n;
  }

  // False once the stream ended (done or failed). A first event found is timed at `first_at`.
  bool parse(Stream& s, Clock::time_point now, Clock::time_point first_at) {
    if (s.state == Stream::State::kHead) {
      const std::size_t end = s.in.find("\r\n\r\n");
      if (end == std::string::npos) return true;
      const std::string_view head(s.in.data(), end);
      if (head.size() < 12 || head.substr(0, 5) != "HTTP/") {
        fail(s, totals_.parse_errors);
        return false;
      }
      s.status = std::atoi(std::string(head.substr(9, 3)).c_str());
      std::string lower(head);
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      s.chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
      s.in.erase(0, end + 4);
      if (s.status != 200) {
        fail(s, totals_.bad_status);
        return false;
      }
      s.state = Stream::State::kBody;
    }
    if (!s.chunked) {
      s.events.append(s.in);
      s.in.clear();
    } else {
      std::size_t at = 0;
      for (;;) {
        if (s.chunk_left > 0) {
          const std::size_t take = std::min<std::size_t>(s.chunk_left, s.in.size() - at);
          s.events.append(s.in, at, take);
          at += take;
          s.chunk_left -= take;
          if (s.chunk_left > 0) break;
          s.in_chunk_trailer = true;
        }
        if (s.in_chunk_trailer) {
          if (s.in.size() - at < 2) break;
          at += 2;  // the CRLF after a chunk's data
          s.in_chunk_trailer = false;
        }
        const std::size_t line_end = s.in.find("\r\n", at);
        if (line_end == std::string::npos) break;
        const std::uint64_t size = std::strtoull(s.in.c_str() + at, nullptr, 16);
        at = line_end + 2;
        if (size == 0) {
          at = s.in.size();  // the last chunk: the stream is over
          break;
        }
        s.chunk_left = size;
      }
      s.in.erase(0, at);
    }
    split_events(s, now, first_at);
    if (s.done) {
      ::close(s.fd);
      s.fd = -1;
      s.state = Stream::State::kDone;
      ++finished_;
      return false;
    }
    return true;
  }

  void split_events(Stream& s, Clock::time_point now, Clock::time_point first_at) {
    std::size_t at = 0;
    for (;;) {
      const std::size_t end = s.events.find("\n\n", at);
      if (end == std::string::npos) break;
      const std::string_view event(s.events.data() + at, end - at);
      at = end + 2;
      if (event.substr(0, 6) != "data: ") continue;
      const std::string_view data = event.substr(6);
      if (data == "[DONE]") {
        s.done = true;
        s.last_event = s.tokens ? s.last_event : now;
        continue;
      }
      if (data.find("\"error\"") != std::string_view::npos) ++totals_.event_errors;
      const std::uint64_t tokens = count_tokens(data);
      if (tokens == 0) continue;
      ++s.event_count;
      s.tokens += tokens;
      if (!s.have_first) {
        s.have_first = true;
        s.first_event = first_at;
      }
      s.last_event = now;
    }
    s.events.erase(0, at);
  }

  // CLOCK_REALTIME's lead on CLOCK_MONOTONIC (steady_clock here), for receive timestamps.
  std::chrono::nanoseconds realtime_ahead_ = realtime_lead();
  sockaddr_in address_;
  std::string request_;
  std::string one_request_;  // the request being sent, with its stream's id
  std::uint64_t one_request_index_ = ~std::uint64_t{0};
  std::vector<Stream> streams_;
  int epoll_ = -1;
  Totals totals_;
  std::size_t finished_ = 0;
  Clock::time_point start_, end_;
};

int run(int argc, char** argv) {
  CLI::App app{"sse_load: concurrent streaming generations, one JSON line of figures"};
  int port = 0;
  int streams = 1024;
  int batch = 256;
  double ramp = 1.0;
  double timeout = 120.0;
  std::string body;
  std::string path = "/inference/v1/generate";
  app.add_option("--port", port, "server port on 127.0.0.1")->required();
  app.add_option("--streams", streams, "concurrent streams (one connection each)");
  app.add_option("--connect-batch", batch, "connections being opened at once");
  app.add_option("--ramp", ramp, "seconds over which the requests are spread");
  app.add_option("--timeout", timeout, "seconds the whole run may take");
  app.add_option("--body", body, "the request body (JSON)")->required();
  app.add_option("--path", path, "the route");
  std::string times;
  app.add_option("--times", times,
                 "write each stream's id (X-Request-Id s<N>), request and first-event times here");
  CLI11_PARSE(app, argc, argv);

  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  std::string request = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                        "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
                        "Content-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body;
  Runner runner(address, request, streams);
  const auto connect_start = Clock::now();
  runner.connect_all(batch, 30.0);
  // Let the server accept what the kernel queued before the first request goes out.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::fprintf(stderr, "sse_load: %d connections opened in %.0f ms\n", streams,
               micros(Clock::now() - connect_start) / 1e3);
  runner.run(ramp, timeout);
  runner.report(ramp);
  if (!times.empty()) runner.write_times(times);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "sse_load: %s\n", error.what());
    return 1;
  }
}
