#pragma once
// The transport under vllmd's HTTP routes. Poco parses and writes HTTP; this class decides
// which thread does it. Poco's own HTTPServer gives each connection a worker for as long as it
// lives, so a few hundred idle or slow clients would starve /health. Here one poller thread
// owns every connection that has no complete request yet (epoll, edge-triggered, peeking at
// the header without consuming it), and a connection reaches a worker only when a request's
// header has fully arrived; after the response it goes back to the poller.

#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerSession.h>
#include <Poco/Net/ServerSocket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "daemon/simple_request.hpp"

namespace vllmd::daemon {

// The session every connection gets: Poco's, with two protected members opened up.
class Session final : public Poco::Net::HTTPServerSession {
 public:
  using HTTPServerSession::HTTPServerSession;
  // Poco keeps what it read ahead here; a pipelined request may be waiting in it.
  bool has_buffered_input() const { return buffered() > 0; }
  // Read-ahead bytes first, then one receive straight into `buffer`: large bodies skip the
  // request stream's 4 KiB buffer.
  int read_some(char* buffer, std::streamsize length) { return read(buffer, length); }
};

struct ListenerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  int threads = 16;               // workers: requests handled at once
  int max_queued = 64;            // complete requests waiting for a worker; 503 beyond
  int max_connections = 4096;     // open connections; further ones are closed at once
  double timeout = 10;            // seconds a client may stall mid-request (header or body)
  double keep_alive_timeout = 5;  // seconds a connection may wait for its next request
  int max_header_bytes = 16384;   // request line and headers; 431 beyond
  std::string tls_cert_file;      // set: the listener speaks TLS only
  std::string tls_key_file;       // empty: the key is in the certificate file
  // Answers a simple request in place, as complete response bytes, when it needs nothing
  // to wait for; nullopt hands it to a worker. Called on the poller thread: it must not
  // block. Plain HTTP only.
  std::function<std::optional<std::string>(const SimpleRequest&)> answer_simple;
};

struct ConnectionStats {
  int current = 0;   // open connections
  int busy = 0;      // being served by a worker
  int queued = 0;    // with a complete request, waiting for a worker
  std::uint64_t refused = 0;  // cumulative: over max_connections or max_queued
  std::uint64_t total = 0;    // cumulative: accepted
};

class HttpListener {
 public:
  // Binds now (so the port is known); serves from start(). Throws on bind or TLS errors.
  HttpListener(const ListenerOptions& options, Poco::Net::HTTPRequestHandlerFactory::Ptr factory);
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  void start();
  std::uint16_t port() const { return port_; }
  bool secure() const { return tls_ != nullptr; }
  // Stops accepting and closes idle connections; requests in flight are answered, then
  // their connections close.
  void stop_accepting();
  // Waits up to `seconds` until no connection is open; whether none is.
  bool wait_idle(double seconds) const;
  // Closes everything at once and joins the threads.
  void abort();
  ConnectionStats stats() const;

 private:
  struct Connection;
  using Clock = std::chrono::steady_clock;

  void poll_loop();
  void work_loop();
  void accept_all();
  void watch_listener();
  void on_readable(int fd);
  bool handle_readable(int fd);
  void sweep_idle(Clock::time_point now);
  void park(std::unique_ptr<Connection> connection);
  void dispatch(std::unique_ptr<Connection> connection);
  enum class Served { kNo, kParked, kClosed };
  Served serve_simple(Connection& connection, std::string_view header);
  void serve(Connection& connection);
  bool serve_one(Connection& connection);
  bool next_request_soon(Connection& connection);
  void close_parked();
  void wake() const;  // the poller

  ListenerOptions options_;
  Poco::Net::HTTPRequestHandlerFactory::Ptr factory_;
  Poco::Net::HTTPServerParams::Ptr params_;
  Poco::AutoPtr<Poco::Net::Context> tls_;
  Poco::Net::ServerSocket listen_socket_;
  std::uint16_t port_ = 0;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;         // wakes the poller
  int need_worker_fd_ = -1;  // set while a queued request waits with no idle worker

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::map<int, std::unique_ptr<Connection>> parked_;  // by descriptor; owned by the poller
  std::deque<std::unique_ptr<Connection>> queue_;      // complete requests awaiting a worker
  std::set<Connection*> serving_;                      // owned by a worker
  static constexpr int kLingerMilliseconds = 10;
  std::atomic<int> idle_workers_{0};  // waiting for the queue
  std::atomic<bool> accepting_{true};
  std::atomic<bool> stopping_{false};
  bool listening_ = true;  // the poller's: listen socket still open
  bool accept_paused_ = false;  // the poller's: out of descriptors, listen socket unwatched
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> total_{0};

  std::thread poller_;
  std::vector<std::thread> workers_;
  std::vector<char> peek_buffer_;  // the poller's
};

}  // namespace vllmd::daemon
