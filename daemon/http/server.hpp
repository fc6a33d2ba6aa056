#pragma once
// vllmd's HTTP server core: one event-loop thread owns the listening socket and every
// connection (epoll). It reads and parses each request itself (parser.hpp), asks the
// application what to do from the head alone (refuse, or read a body up to a limit), and
// hands the complete request over as an Exchange. The application answers through the
// Exchange whenever it is ready, from any thread: nothing waits in a thread, neither for a
// client's bytes nor for an engine's reply. Responses may also be streamed (chunked) as
// data arrives.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/util/cidr.hpp"
#include "daemon/http/exchange.hpp"
#include "daemon/http/parser.hpp"
#include "daemon/http/response.hpp"

namespace vllmd::daemon::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  int max_connections = 4096;     // more are answered 503 and closed
  double timeout = 10;            // seconds a started request (or a write) may stall: 408
  double keep_alive_timeout = 5;  // seconds an idle connection is kept
  int max_header_bytes = 16384;   // request line and fields: 431 beyond
  std::string tls_cert_file;      // set: TLS only
  std::string tls_key_file;       // empty: the key is in the certificate file
  // A refused request's body up to this size is read and dropped, so the connection lives
  // on; a larger one (or a chunked one) ends the connection instead.
  std::size_t discard_limit = std::size_t{64} << 10;
};

// What the application decides from a request's head alone, on the loop thread.
struct Decision {
  std::optional<Response> refusal;  // answer this at once: the body is not read
  std::uint64_t body_limit = 0;     // accepted: a larger body is answered 413
  // Accepted: runs on the loop thread with the complete request. Answer through the
  // exchange now or later; hand slow work to other threads.
  std::function<void(ExchangePtr)> on_request;
  // Cancellable work (token generation): while the request is handled or streamed, a client's
  // half-close (FIN, seen through EPOLLRDHUP — not EPOLLIN, which would spin on pipelined bytes)
  // counts as hanging up. Otherwise a half-closed client still gets its answer (weight sync).
  bool cancel_on_hangup = false;
};

using Decide =
    std::function<Decision(const RequestHead& head, const std::optional<util::IpAddress>& peer)>;

struct ServerStats {
  int connections = 0;        // open
  int handling = 0;           // with a request being handled (waiting for its answer)
  std::uint64_t refused = 0;  // cumulative: over max_connections
  std::uint64_t total = 0;    // cumulative: accepted
};

class Server {
 public:
  // Binds and listens now (so the port is known): throws std::runtime_error naming the
  // address when it cannot (e.g. in use), Poco::Exception when the TLS files are unusable.
  Server(ServerOptions options, Decide decide);
  ~Server();  // abort()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();
  std::uint16_t port() const;
  bool secure() const;
  // Stops accepting and closes idle connections; requests being handled are answered, then
  // their connections close.
  void stop_accepting();
  // Waits up to `seconds` until no connection is open; whether none is.
  bool wait_idle(double seconds) const;
  void abort();  // closes everything and joins the loop
  ServerStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace vllmd::daemon::http
