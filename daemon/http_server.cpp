#include "daemon/http_server.hpp"

#include "daemon/router.hpp"

namespace vllmd::daemon {

HttpServer::HttpServer(const Config& config, ServerContext& context)
    : router_(std::make_unique<Router>(context)) {
  http::ServerOptions options;
  options.host = config.host;
  options.port = config.port;
  options.max_connections = config.max_connections;
  options.timeout = config.timeout;
  options.keep_alive_timeout = config.keep_alive_timeout;
  options.max_header_bytes = config.max_header_bytes;
  options.tls_cert_file = config.tls_cert_file;
  options.tls_key_file = config.tls_key_file;
  server_ = std::make_unique<http::Server>(
      options, [router = router_.get()](const http::RequestHead& head,
                                        const std::optional<util::IpAddress>& peer) {
        return router->decide(head, peer);
      });
}

HttpServer::~HttpServer() {
  server_.reset();  // the loop first: it calls into the router
  router_.reset();
}

void HttpServer::start() { server_->start(); }
std::uint16_t HttpServer::port() const { return server_->port(); }
bool HttpServer::secure() const { return server_->secure(); }
http::ServerStats HttpServer::stats() const { return server_->stats(); }
void HttpServer::stop_accepting() { server_->stop_accepting(); }
bool HttpServer::wait_idle(double seconds) const { return server_->wait_idle(seconds); }
void HttpServer::abort() { server_->abort(); }

}  // namespace vllmd::daemon
