#include "daemon/http_server.hpp"

#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerRequestImpl.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/URI.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <istream>

#include "common/util/log.hpp"
#include "common/util/memory.hpp"

namespace vllmd::daemon {

namespace {

using Poco::Net::HTTPRequestHandler;
using Poco::Net::HTTPServerRequest;
using Poco::Net::HTTPServerResponse;

// Reads the whole body, up to `limit` bytes. Returns false when the body is larger; then at
// most `drain` more bytes are read and dropped so keep-alive stays in sync, and `in_sync`
// says whether the connection can carry another request.
bool read_body(HTTPServerRequest& request, std::int64_t limit, std::string& body, bool& in_sync) {
  std::istream& in = request.stream();
  const std::int64_t length = request.getContentLength64();
  in_sync = true;
  if (length > limit) {
    // Draining a modest excess is cheaper for the client than reconnecting; a huge one is not.
    const std::int64_t drain = 4 * limit;
    if (length > drain) {
      in_sync = false;
      return false;
    }
    in.ignore(length);
    return false;
  }
  if (length >= 0) {
    // Straight from the session: its read() hands out what Poco read ahead, then receives
    // into `body` directly. The request stream would go through a 4 KiB buffer: 20,000
    // receive calls and a copy for an 80 MB update.
    body.reserve(static_cast<std::size_t>(length));
    util::advise_huge_pages(body.data(), body.capacity());
    body.resize(static_cast<std::size_t>(length));
    auto& session =
        dynamic_cast<Session&>(static_cast<Poco::Net::HTTPServerRequestImpl&>(request).session());
    std::int64_t got = 0;
    while (got < length) {
      const int chunk = static_cast<int>(std::min<std::int64_t>(length - got, 1 << 30));
      int n = 0;
      try {
        n = session.read_some(body.data() + got, chunk);
      } catch (const Poco::Exception& error) {  // timeout or reset: the body stays short
        log::debug("reading the request body failed: ", error.displayText());
      }
      if (n <= 0) break;
      got += n;
    }
    body.resize(static_cast<std::size_t>(got));
    in_sync = got == length;
    return true;
  }
  // Neither a length nor chunked encoding: an HTTP/1.1 request has no body (RFC 9112 6.3).
  if (!request.getChunkedTransferEncoding()) return true;
  // Chunked: read in slices and stop at the limit.
  char slice[64 * 1024];
  while (in) {
    in.read(slice, sizeof slice);
    body.append(slice, static_cast<std::size_t>(in.gcount()));
    if (static_cast<std::int64_t>(body.size()) > limit) {
      std::string().swap(body);
      std::int64_t drained = 0;
      while (in && drained < 4 * limit) {
        in.read(slice, sizeof slice);
        drained += in.gcount();
      }
      in_sync = !in.good() || in.peek() == std::char_traits<char>::eof();
      return false;
    }
  }
  return true;
}

// Constant-time comparison, so a token cannot be guessed byte by byte from response times.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return difference == 0;
}

class RouteHandler final : public HTTPRequestHandler {
 public:
  explicit RouteHandler(ServerContext& context) : context_(context) {}

  void handleRequest(HTTPServerRequest& request, HTTPServerResponse& response) override {
    const auto started = std::chrono::steady_clock::now();
    api::Response reply;
    std::string path;
    try {
      reply = route(request, response, path);
    } catch (const std::exception& error) {
      log::error("request ", request.getMethod(), " ", request.getURI(), " failed: ", error.what());
      reply = api::error_response(api::server_error(std::string("internal error: ") + error.what()));
    } catch (...) {
      reply = api::error_response(api::server_error("internal error"));
    }
    try {
      const auto status = static_cast<Poco::Net::HTTPResponse::HTTPStatus>(reply.status);
      response.setStatusAndReason(status, Poco::Net::HTTPResponse::getReasonForStatus(status));
      if (body_read_ms_ > 0 || reply.engine_seconds > 0) {
        response.set("Server-Timing", server_timing(started, reply.engine_seconds));
      }
      response.setContentType(reply.content_type);
      response.setContentLength64(static_cast<std::int64_t>(reply.body.size()));
      response.send().write(reply.body.data(), static_cast<std::streamsize>(reply.body.size()));
    } catch (const std::exception& error) {
      log::debug("could not send the response: ", error.what());
    }
    if (context_.metrics != nullptr) context_.metrics->count_request(path, reply.status);
    const double total_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    log::info(request.getMethod(), " ", path.empty() ? request.getURI() : path, " ", reply.status,
              " ", static_cast<long long>(total_ms * 1000) / 1000.0, "ms engine=",
              static_cast<long long>(reply.engine_seconds * 1e6) / 1000.0, "ms");
  }

 private:
  api::Response route(HTTPServerRequest& request, HTTPServerResponse& response,
                      std::string& path) {
    const Poco::URI uri(request.getURI());
    path = uri.getPath();
    std::string body;
    bool in_sync = true;
    const std::shared_ptr<const Policy> policy = context_.policy();
    const api::Route* found = api::find_route(path);
    // The allowlist comes first: a peer outside it gets nothing else, not even its body read.
    const bool health = found != nullptr && found->operation == api::Operation::kHealth;
    if (!health && !policy->allowlist.empty()) {
      const Poco::Net::IPAddress host = request.clientAddress().host();
      const std::optional<util::IpAddress> peer =
          util::IpAddress::from_bytes(host.addr(), host.length());
      if (!peer || !util::any_contains(policy->allowlist, *peer)) {
        if (request.getContentLength64() > 0 || request.getChunkedTransferEncoding()) {
          response.setKeepAlive(false);  // the body stays unread
        }
        return api::error_response(
            api::forbidden("client address " + host.toString() + " is not allowed"));
      }
    }
    const auto reading = std::chrono::steady_clock::now();
    const bool fits = read_body(request, policy->max_body_bytes, body, in_sync);
    if (!body.empty()) {
      body_read_ms_ = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - reading).count();
    }
    if (!in_sync) response.setKeepAlive(false);
    if (!fits) {
      return api::error_response(api::payload_too_large(
          "request body exceeds the limit of " + std::to_string(policy->max_body_bytes) +
          " bytes"));
    }
    if (found == nullptr || (found->dev_only && !context_.dev_mode)) {
      return api::error_response(api::not_found());
    }
    if (request.getMethod() != found->method) {
      response.set("Allow", std::string(found->method));
      return api::error_response(api::method_not_allowed());
    }
    if (found->operation != api::Operation::kHealth && !policy->api_keys.empty() &&
        !authorized(request, policy->api_keys)) {
      return api::error_response(api::unauthorized("missing or invalid API key"));
    }
    if (found->operation == api::Operation::kMetrics) return metrics();
    if (found->operation == api::Operation::kReload) return reload();
    const api::Query query = api::parse_query(uri.getRawQuery());
    if (HttpListener::on_poller_thread()) return context_.service->handle_without_waiting(*found, query);
    return context_.service->handle(*found, query, body);
  }

  // Where the time went (W3C Server-Timing, milliseconds): receiving the body, waiting for
  // the engines, and vllmd's own work in between (validation, transcoding, framing).
  std::string server_timing(std::chrono::steady_clock::time_point started,
                            double engine_seconds) const {
    const double total =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    const double engine = engine_seconds * 1e3;
    char text[160];
    std::snprintf(text, sizeof text, "read;dur=%.3f, engine;dur=%.3f, vllmd;dur=%.3f", body_read_ms_,
                  engine, std::max(0.0, total - body_read_ms_ - engine));
    return text;
  }

  api::Response reload() const {
    if (!context_.reload) return api::error_response(api::not_found());
    if (auto error = context_.reload()) {
      return api::error_response(api::invalid_configuration("reload failed: " + *error));
    }
    return {200, R"({"status":"reloaded"})"};
  }

  api::Response metrics() const {
    ConnectionStats connections;
    if (context_.listener != nullptr) connections = context_.listener->stats();
    api::Response response;
    response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    response.body = context_.metrics->render(context_.engines->engines(),
                                             context_.engines->pending_calls(), connections);
    return response;
  }

  static bool authorized(const HTTPServerRequest& request, const std::vector<std::string>& keys) {
    const std::string header = request.get("Authorization", "");
    constexpr std::string_view kBearer = "Bearer ";
    if (header.size() <= kBearer.size() || header.compare(0, kBearer.size(), kBearer) != 0) {
      return false;
    }
    const std::string_view token = std::string_view(header).substr(kBearer.size());
    bool match = false;
    for (const std::string& key : keys) match = same_secret(token, key) || match;
    return match;
  }

  ServerContext& context_;
  double body_read_ms_ = 0;  // one handler per request
};

class Factory final : public Poco::Net::HTTPRequestHandlerFactory {
 public:
  explicit Factory(ServerContext& context) : context_(context) {}
  HTTPRequestHandler* createRequestHandler(const HTTPServerRequest&) override {
    return new RouteHandler(context_);
  }

 private:
  ServerContext& context_;
};

}  // namespace

HttpServer::HttpServer(const Config& config, ServerContext& context) {
  ListenerOptions options;
  options.host = config.host;
  options.port = config.port;
  options.threads = config.threads;
  options.max_queued = config.max_queued;
  options.max_connections = config.max_connections;
  options.timeout = config.timeout;
  options.keep_alive_timeout = config.keep_alive_timeout;
  options.max_header_bytes = config.max_header_bytes;
  options.tls_cert_file = config.tls_cert_file;
  options.tls_key_file = config.tls_key_file;
  // GETs of vllmd's own state: the poller answers them without waking a worker.
  options.answers_at_once = [&context](std::string_view method, std::string_view target) {
    if (method != "GET") return false;
    const api::Route* route = api::find_route(target.substr(0, target.find('?')));
    if (route == nullptr || (route->dev_only && !context.dev_mode)) return false;
    return route->operation == api::Operation::kMetrics ||
           context.service->answers_at_once(route->operation);
  };
  listener_ = std::make_unique<HttpListener>(options, new Factory(context));
  context.listener = listener_.get();
}

HttpServer::~HttpServer() = default;

void HttpServer::start() { listener_->start(); }

std::uint16_t HttpServer::port() const { return listener_->port(); }

bool HttpServer::secure() const { return listener_->secure(); }

void HttpServer::stop_accepting() { listener_->stop_accepting(); }

bool HttpServer::wait_idle(double seconds) const { return listener_->wait_idle(seconds); }

void HttpServer::abort() { listener_->abort(); }

}  // namespace vllmd::daemon
