#include "daemon/http_server.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/util/log.hpp"

namespace vllmd::daemon {

namespace {

using Clock = std::chrono::steady_clock;

// Bodies larger than this are validated and transcoded on the executor, not on the loop.
constexpr std::size_t kInlineBodyBytes = 256 * 1024;

// Constant-time comparison, so a token cannot be guessed byte by byte from response times.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return difference == 0;
}

bool authorized(std::string_view header, const std::vector<std::string>& keys) {
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() <= kBearer.size() || header.substr(0, kBearer.size()) != kBearer) {
    return false;
  }
  const std::string_view token = header.substr(kBearer.size());
  bool match = false;
  for (const std::string& key : keys) match = same_secret(token, key) || match;
  return match;
}

// "/path?query" from a request target, also from the absolute form a proxy may send
// ("http://host:port/path?query").
std::string_view origin_form(std::string_view target) {
  if (target.front() == '/') return target;
  const std::size_t scheme = target.find("://");
  const std::size_t path = target.find('/', scheme + 3);
  return path == std::string_view::npos ? std::string_view("/") : target.substr(path);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The path with %XX escapes decoded, as vLLM's server matches routes ("/weight%5Finfo"); a
// malformed escape is kept as it is (and matches no route).
std::string decoded_path(std::string_view path) {
  if (path.find('%') == std::string_view::npos) return std::string(path);
  std::string decoded;
  decoded.reserve(path.size());
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 2 < path.size() && hex_value(path[i + 1]) >= 0 &&
        hex_value(path[i + 2]) >= 0) {
      decoded.push_back(static_cast<char>(hex_value(path[i + 1]) * 16 + hex_value(path[i + 2])));
      i += 2;
    } else {
      decoded.push_back(path[i]);
    }
  }
  return decoded;
}

double milliseconds(Clock::duration duration) {
  return std::chrono::duration<double, std::milli>(duration).count();
}

std::string peer_text(const std::optional<util::IpAddress>& peer) {
  return peer ? peer->to_string() : "-";
}

}  // namespace

// What the router learned from an accepted request's head, carried to its answer. The route
// matched its method and path exactly, so the table's strings name them.
struct RouteMatch {
  const api::Route* route = nullptr;
  std::string query;  // raw, after '?'
  std::optional<util::IpAddress> peer;
  std::optional<std::string> session;  // Vllmd-Session
};

class Router {
 public:
  explicit Router(ServerContext& context) : context_(context) {}
  void set_server(const http::Server* server) { server_ = server; }

  http::Decision decide(const http::RequestHead& head, const std::optional<util::IpAddress>& peer) {
    const std::string_view target = origin_form(head.target);
    const std::size_t question = target.find('?');
    const std::string path = decoded_path(target.substr(0, question));
    const api::Route* route = api::find_route(path);
    const std::shared_ptr<const Policy> policy = context_.policy();
    const auto refuse = [&](const api::ApiError& error, http::Headers headers = {}) {
      http::Decision decision;
      decision.refusal = http::error_response(error);
      decision.refusal->headers = std::move(headers);
      record(peer, head.method, path, error.status, 0, 0);
      return decision;
    };

    const bool health = route != nullptr && route->operation == api::Operation::kHealth;
    if (!health && !policy->allowlist.empty() &&
        (!peer || !util::any_contains(policy->allowlist, *peer))) {
      return refuse(api::forbidden("client address " + peer_text(peer) + " is not allowed"));
    }
    if (route == nullptr || (route->dev_only && !context_.dev_mode)) {
      return refuse(api::not_found());
    }
    if (head.method != route->method) {
      return refuse(api::method_not_allowed(), {{"Allow", std::string(route->method)}});
    }
    if (!health && !policy->api_keys.empty() &&
        !authorized(head.field(http::KnownField::kAuthorization), policy->api_keys)) {
      return refuse(api::unauthorized("missing or invalid API key"),
                    {{"WWW-Authenticate", "Bearer"}});
    }
    const std::string_view session = head.field("vllmd-session");
    if (!session.empty() &&
        (!api::valid_session_id(session) || head.count_named("vllmd-session") > 1)) {
      return refuse(api::invalid_request(
          "the Vllmd-Session header must be one id of 1 to 128 visible ASCII characters"));
    }
    const bool to_executor =
        head.content_length > kInlineBodyBytes || head.framing == http::BodyFraming::kChunked;
    if (to_executor && context_.executor != nullptr &&
        static_cast<int>(context_.executor->queued()) >= context_.max_queued) {
      return refuse(api::server_busy("too many requests waiting (server.max_queued)"));
    }
    http::Decision decision;
    decision.body_limit = static_cast<std::uint64_t>(policy->max_body_bytes);
    auto match = std::make_shared<RouteMatch>();
    match->route = route;
    if (question != std::string_view::npos) match->query = std::string(target.substr(question + 1));
    match->peer = peer;
    if (!session.empty()) match->session = std::string(session);
    decision.on_request = [this, match](http::ExchangePtr exchange) {
      serve(match, std::move(exchange));
    };
    return decision;
  }

 private:
  void serve(const std::shared_ptr<RouteMatch>& match, http::ExchangePtr exchange) {
    const api::Route& route = *match->route;
    if (route.operation == api::Operation::kMetrics) return answer(*match, *exchange, metrics());
    if (route.operation == api::Operation::kReload) {
      auto run = [this, match, exchange] { answer(*match, *exchange, reload()); };
      return context_.executor != nullptr ? context_.executor->post(run) : run();
    }
    const api::Query query = api::parse_query(match->query);
    if (exchange->request().body.empty() && context_.service->answers_at_once(route.operation)) {
      return answer(*match, *exchange, context_.service->handle_without_waiting(route, query));
    }
    auto run = [this, match, exchange, query] {
      context_.service->handle(*match->route, query, std::move(exchange->request().body),
                               api::RequestContext{match->session},
                               [this, match, exchange](api::Response reply) {
                                 answer(*match, *exchange, std::move(reply));
                               });
    };
    if (exchange->request().body.size() > kInlineBodyBytes && context_.executor != nullptr) {
      return context_.executor->post(run);
    }
    run();
  }

  void answer(const RouteMatch& match, http::Exchange& exchange, api::Response reply) {
    const http::Request& request = exchange.request();
    const auto now = Clock::now();
    const double total = milliseconds(now - request.head_at);
    const double read = milliseconds(request.body_at - request.head_at);
    const double engine = reply.engine_seconds * 1e3;
    http::Response response;
    response.status = reply.status;
    response.content_type = std::move(reply.content_type);
    response.body = std::move(reply.body);
    if (read > 0 || engine > 0) {
      // Where the time went (W3C Server-Timing, milliseconds): receiving the body, waiting
      // for the engines, and vllmd's own work in between (validation, transcoding, framing).
      char timing[160];
      std::snprintf(timing, sizeof timing, "read;dur=%.3f, engine;dur=%.3f, vllmd;dur=%.3f", read,
                    engine, std::max(0.0, total - read - engine));
      response.headers.emplace_back("Server-Timing", timing);
    }
    const int status = response.status;
    exchange.respond(std::move(response));
    record(match.peer, match.route->method, match.route->path, status, total, engine);
  }

  // The access-log line and the request counter, for every request.
  void record(const std::optional<util::IpAddress>& peer, std::string_view method,
              std::string_view path, int status, double total_ms, double engine_ms) const {
    if (context_.metrics != nullptr) context_.metrics->count_request(path, status);
    if (!log::enabled(log::Level::kInfo)) return;
    log::info(peer_text(peer), " ", log::escaped(method), " ", log::escaped(path), " ", status, " ",
              static_cast<long long>(total_ms * 1000) / 1000.0,
              "ms engine=", static_cast<long long>(engine_ms * 1000) / 1000.0, "ms");
  }

  api::Response reload() const {
    if (!context_.reload) return api::error_response(api::not_found());
    if (auto error = context_.reload()) {
      return api::error_response(api::invalid_configuration("reload failed: " + *error));
    }
    return {200, R"({"status":"reloaded"})"};
  }

  api::Response metrics() const {
    ConnectionGauges connections;
    if (server_ != nullptr) {
      const http::ServerStats stats = server_->stats();
      connections = {stats.connections, stats.handling,
                     context_.executor ? static_cast<int>(context_.executor->queued()) : 0,
                     stats.refused, stats.total};
    }
    api::Response response;
    response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    response.body = context_.metrics->render(context_.engines->engines(),
                                             context_.engines->pending_calls(), connections);
    return response;
  }

  ServerContext& context_;
  const http::Server* server_ = nullptr;
};

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
  router_->set_server(server_.get());
}

HttpServer::~HttpServer() {
  server_.reset();  // the loop first: it calls into the router
  router_.reset();
}

void HttpServer::start() { server_->start(); }
std::uint16_t HttpServer::port() const { return server_->port(); }
bool HttpServer::secure() const { return server_->secure(); }
void HttpServer::stop_accepting() { server_->stop_accepting(); }
bool HttpServer::wait_idle(double seconds) const { return server_->wait_idle(seconds); }
void HttpServer::abort() { server_->abort(); }

}  // namespace vllmd::daemon
