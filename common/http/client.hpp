#pragma once
// A small blocking HTTP/1.1 client for vllmd's API, on Poco::Net::HTTPClientSession. One
// connection per request: CLI calls are few and long, keep-alive buys nothing. Transport
// failures are values, split into the kinds a caller maps to distinct exit codes. http:// and
// https:// (the server's certificate checked against a CA file or the system's CAs).

#include <Poco/AutoPtr.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <utility>
#include <vector>

namespace Poco::Net {
class Context;
}

namespace vllmd::http {

struct Endpoint {
  std::string scheme;  // "http" or "https"
  std::string host;    // without brackets for IPv6
  std::uint16_t port = 0;
  std::string base_path;  // "" or "/prefix" (a reverse proxy's mount point), no trailing '/'

  std::string url() const;  // scheme://host:port/base_path
};

// Parses "http[s]://host[:port][/prefix]". Errors name what is wrong with the URL.
tl::expected<Endpoint, std::string> parse_endpoint(std::string_view url);

enum class TransportErrorKind {
  kConnectFailed,  // nothing was sent: resolve or connect failed (or timed out)
  kTimeout,        // sent, but no complete reply within the timeout
  kTls,            // TLS handshake failed: mostly an untrusted certificate (retrying won't help)
  kOther,          // connection reset, malformed reply, ...
};
// "connect_failed", "timeout", "tls", "other"
std::string_view kind_name(TransportErrorKind kind);

struct TransportError {
  TransportErrorKind kind = TransportErrorKind::kOther;
  std::string message;
  int attempts = 1;
};

struct Reply {
  int status = 0;
  std::string body;
};

// Called while a body is sent: bytes written so far and the total.
using Progress = std::function<void(std::size_t sent, std::size_t total)>;

struct Request {
  std::string_view method;  // "GET", "POST"
  std::string_view path;    // route path; the endpoint's base path is prepended
  std::vector<std::pair<std::string, std::string>> query;
  // A JSON body, sent as is; nullopt sends no body and no Content-Type at all.
  std::optional<std::string_view> body;
  Progress progress;
  bool retry = true;  // false: one attempt even for a GET (a snapshot that must be quick)
  // Sent as `Vllmd-Session`: the weight-update session this request belongs to (empty: none).
  std::string_view session = {};
  // Set: a 2xx body is handed over line by line as it arrives (a server-sent event stream),
  // and Reply::body stays empty. Other statuses are read whole, as usual.
  std::function<void(std::string_view line)> on_line = {};
};

struct RetryPolicy {
  int retries = 3;                             // after the first attempt
  std::chrono::milliseconds first_delay{200};  // doubled after each retry
};

struct ClientOptions {
  std::string token;                           // "Authorization: Bearer" when not empty
  std::chrono::milliseconds timeout{300'000};  // connect, and each send/receive
  RetryPolicy retry;
  std::function<void(std::string_view line)> trace;  // one line per attempt (-v)
  std::string ca_file;  // https: PEM CAs the server's certificate must chain to; empty: system's
  // false: any certificate is accepted, for a liveness check of our own listener only.
  bool verify_peer = true;
};

class Client {
 public:
  // Throws std::runtime_error when the CA file cannot be loaded.
  Client(Endpoint endpoint, ClientOptions options);
  ~Client();
  Client(Client&&) noexcept;
  Client(const Client&);

  // Sends one request. Idempotent GETs are retried with exponential backoff when the
  // connection fails or the server answers 503; nothing else is ever retried, since a
  // POST that reached the engine must not run twice.
  tl::expected<Reply, TransportError> request(const Request& request) const;

  const Endpoint& endpoint() const { return endpoint_; }

 private:
  tl::expected<Reply, TransportError> attempt(const Request& request) const;
  std::string target(const Request& request) const;
  void trace(const std::string& line) const;

  Endpoint endpoint_;
  ClientOptions options_;
  Poco::AutoPtr<Poco::Net::Context> tls_;  // https only
};

}  // namespace vllmd::http
