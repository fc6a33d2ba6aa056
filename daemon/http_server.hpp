#pragma once
// The HTTP front of vllmd: http::Server carries the connections, the Router decides and
// serves each request.

#include <memory>

#include "daemon/config.hpp"
#include "daemon/http/server.hpp"
#include "daemon/server_context.hpp"

namespace vllmd::daemon {

class Router;

class HttpServer {
 public:
  // Binds the listening socket (throws naming the address when it cannot); serves from
  // start(), when `context` is complete.
  HttpServer(const Config& config, ServerContext& context);
  ~HttpServer();
  void start();
  std::uint16_t port() const;
  bool secure() const;
  http::ServerStats stats() const;
  // Stops accepting; requests in flight go on, keep-alive connections end after theirs.
  void stop_accepting();
  // Waits up to `seconds` for every connection to finish; whether they all did.
  bool wait_idle(double seconds) const;
  void abort();  // closes whatever is left

 private:
  std::unique_ptr<Router> router_;
  std::unique_ptr<http::Server> server_;
};

}  // namespace vllmd::daemon
