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
#include <ctime>
#include <functional>
#include <istream>
#include <optional>

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

// "/path?query" from a request target, also from the absolute form a proxy may send
// ("http://host:port/path?query").
std::string_view origin_form(std::string_view target) {
  if (target.empty() || target.front() == '/') return target;
  const std::size_t scheme = target.find("://");
  if (scheme == std::string_view::npos) return target;
  const std::size_t path = target.find('/', scheme + 3);
  return path == std::string_view::npos ? std::string_view("/") : target.substr(path);
}

// The path with %XX escapes decoded, as vLLM's server matches routes ("/weight%5Finfo").
std::string decoded_path(std::string_view path) {
  std::string decoded;
  if (path.find('%') == std::string_view::npos) return std::string(path);
  try {
    Poco::URI::decode(std::string(path), decoded);
  } catch (const Poco::Exception&) {
    return std::string(path);  // a malformed escape matches no route: 404
  }
  return decoded;
}

// What routing needs from a request, whoever parsed it: Poco (workers) or the poller's own
// parser for simple GETs (SimpleRequest).
struct RequestFacts {
  std::string_view method;
  std::string_view target;  // path and query
  std::optional<util::IpAddress> peer;
  std::string_view authorization;
  bool has_body = false;
};

// Besides the reply: what the HTTP layer must add to the response.
struct Outcome {
  std::string path;
  std::string allow;  // for 405
  bool close = false;  // the connection cannot carry another request
};

// The routing shared by both paths: allowlist, body limit, 404/405, API keys, then the
// service. `read_body` is called (once) after the allowlist; the poller path has no body.
class Router {
 public:
  using BodyReader = std::function<bool(std::int64_t limit, std::string& body, bool& in_sync)>;

  explicit Router(ServerContext& context) : context_(context) {}

  api::Response answer(const RequestFacts& request, const BodyReader& read_body,
                       Outcome& outcome) {
    const std::string_view target = origin_form(request.target);
    outcome.path = decoded_path(target.substr(0, target.find('?')));
    const std::shared_ptr<const Policy> policy = context_.policy();
    const api::Route* found = api::find_route(outcome.path);
    // The allowlist comes first: a peer outside it gets nothing else, not even its body read.
    const bool health = found != nullptr && found->operation == api::Operation::kHealth;
    if (!health && !policy->allowlist.empty() &&
        (!request.peer || !util::any_contains(policy->allowlist, *request.peer))) {
      outcome.close = request.has_body;  // the body stays unread
      return api::error_response(api::forbidden(
          "client address " + (request.peer ? request.peer->to_string() : "?") +
          " is not allowed"));
    }
    std::string body;
    bool in_sync = true;
    const auto reading = std::chrono::steady_clock::now();
    const bool fits = !read_body || read_body(policy->max_body_bytes, body, in_sync);
    if (!body.empty()) {
      body_read_ms_ = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - reading).count();
    }
    outcome.close = !in_sync;
    if (!fits) {
      return api::error_response(api::payload_too_large(
          "request body exceeds the limit of " + std::to_string(policy->max_body_bytes) +
          " bytes"));
    }
    if (found == nullptr || (found->dev_only && !context_.dev_mode)) {
      return api::error_response(api::not_found());
    }
    if (request.method != found->method) {
      outcome.allow = std::string(found->method);
      return api::error_response(api::method_not_allowed());
    }
    if (found->operation != api::Operation::kHealth && !policy->api_keys.empty() &&
        !authorized(request.authorization, policy->api_keys)) {
      return api::error_response(api::unauthorized("missing or invalid API key"));
    }
    if (found->operation == api::Operation::kMetrics) return metrics();
    if (found->operation == api::Operation::kReload) return reload();
    const std::size_t question = target.find('?');
    const api::Query query = api::parse_query(
        question == std::string_view::npos ? std::string_view() : target.substr(question + 1));
    if (!read_body) return context_.service->handle_without_waiting(*found, query);
    return context_.service->handle(*found, query, body);
  }

  // The access-log line and the request counter, for every request.
  void record(const RequestFacts& request, const Outcome& outcome, const api::Response& reply,
              std::chrono::steady_clock::time_point started) const {
    if (context_.metrics != nullptr) context_.metrics->count_request(outcome.path, reply.status);
    if (!log::enabled(log::Level::kInfo)) return;
    const double total_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
    log::info(request.method, " ", outcome.path.empty() ? request.target : outcome.path, " ",
              reply.status, " ", static_cast<long long>(total_ms * 1000) / 1000.0, "ms engine=",
              static_cast<long long>(reply.engine_seconds * 1e6) / 1000.0, "ms");
  }

  // Where the time went (W3C Server-Timing, milliseconds): receiving the body, waiting for
  // the engines, and vllmd's own work in between (validation, transcoding, framing). Empty
  // when there is nothing to split.
  std::string server_timing(std::chrono::steady_clock::time_point started,
                            double engine_seconds) const {
    if (body_read_ms_ <= 0 && engine_seconds <= 0) return {};
    const double total =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    const double engine = engine_seconds * 1e3;
    char text[160];
    std::snprintf(text, sizeof text, "read;dur=%.3f, engine;dur=%.3f, vllmd;dur=%.3f", body_read_ms_,
                  engine, std::max(0.0, total - body_read_ms_ - engine));
    return text;
  }

 private:
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

  static bool authorized(std::string_view header, const std::vector<std::string>& keys) {
    constexpr std::string_view kBearer = "Bearer ";
    if (header.size() <= kBearer.size() || header.substr(0, kBearer.size()) != kBearer) {
      return false;
    }
    const std::string_view token = header.substr(kBearer.size());
    bool match = false;
    for (const std::string& key : keys) match = same_secret(token, key) || match;
    return match;
  }

  ServerContext& context_;
  double body_read_ms_ = 0;  // one router per request
};

api::Response guarded(const std::function<api::Response()>& answer, const RequestFacts& request) {
  try {
    return answer();
  } catch (const std::exception& error) {
    log::error("request ", request.method, " ", request.target, " failed: ", error.what());
    return api::error_response(api::server_error(std::string("internal error: ") + error.what()));
  } catch (...) {
    return api::error_response(api::server_error("internal error"));
  }
}

// Requests Poco parsed, on a worker.
class RouteHandler final : public HTTPRequestHandler {
 public:
  explicit RouteHandler(ServerContext& context) : context_(context) {}

  void handleRequest(HTTPServerRequest& request, HTTPServerResponse& response) override {
    const auto started = std::chrono::steady_clock::now();
    const Poco::Net::IPAddress host = request.clientAddress().host();
    const std::string authorization = request.get("Authorization", "");
    RequestFacts facts;
    facts.method = request.getMethod();
    facts.target = request.getURI();
    facts.peer = util::IpAddress::from_bytes(host.addr(), host.length());
    facts.authorization = authorization;
    facts.has_body = request.getContentLength64() > 0 || request.getChunkedTransferEncoding();
    Router router(context_);
    Outcome outcome;
    const api::Response reply = guarded(
        [&] {
          return router.answer(
              facts,
              [&request](std::int64_t limit, std::string& body, bool& in_sync) {
                return read_body(request, limit, body, in_sync);
              },
              outcome);
        },
        facts);
    try {
      const auto status = static_cast<Poco::Net::HTTPResponse::HTTPStatus>(reply.status);
      response.setStatusAndReason(status, Poco::Net::HTTPResponse::getReasonForStatus(status));
      if (const std::string timing = router.server_timing(started, reply.engine_seconds);
          !timing.empty()) {
        response.set("Server-Timing", timing);
      }
      if (!outcome.allow.empty()) response.set("Allow", outcome.allow);
      if (outcome.close) response.setKeepAlive(false);
      response.setContentType(reply.content_type);
      response.setContentLength64(static_cast<std::int64_t>(reply.body.size()));
      response.send().write(reply.body.data(), static_cast<std::streamsize>(reply.body.size()));
    } catch (const std::exception& error) {
      log::debug("could not send the response: ", error.what());
    }
    router.record(facts, outcome, reply, started);
  }

 private:
  ServerContext& context_;
};

// "Sun, 29 Nov 2026 12:00:00 GMT", formatted once per second.
std::string_view http_date() {
  thread_local std::time_t formatted_at = 0;
  thread_local char text[40] = {};
  const std::time_t now = std::time(nullptr);
  if (now != formatted_at) {
    std::tm utc{};
    gmtime_r(&now, &utc);
    std::strftime(text, sizeof text, "%a, %d %b %Y %H:%M:%S GMT", &utc);
    formatted_at = now;
  }
  return text;
}

// Simple GETs the poller parsed: answered in place when the route reads vllmd's own state
// (nothing to wait for), as complete HTTP/1.1 response bytes; nullopt leaves the request to
// a worker.
std::optional<std::string> answer_simple(ServerContext& context, const SimpleRequest& request) {
  if (request.method != "GET") return std::nullopt;
  const std::string_view target = origin_form(request.target);
  const api::Route* route = api::find_route(decoded_path(target.substr(0, target.find('?'))));
  if (route == nullptr || (route->dev_only && !context.dev_mode)) return std::nullopt;
  if (route->operation != api::Operation::kMetrics &&
      !context.service->answers_at_once(route->operation)) {
    return std::nullopt;
  }
  const auto started = std::chrono::steady_clock::now();
  RequestFacts facts;
  facts.method = request.method;
  facts.target = request.target;
  facts.peer = request.peer;
  facts.authorization = request.authorization;
  Router router(context);
  Outcome outcome;
  const api::Response reply =
      guarded([&] { return router.answer(facts, nullptr, outcome); }, facts);
  const auto status = static_cast<Poco::Net::HTTPResponse::HTTPStatus>(reply.status);
  std::string out;
  out.reserve(reply.body.size() + 256);
  out.append("HTTP/1.1 ").append(std::to_string(reply.status)).append(" ");
  out.append(Poco::Net::HTTPResponse::getReasonForStatus(status)).append("\r\nDate: ");
  out.append(http_date()).append("\r\nServer: vllmd\r\nContent-Type: ");
  out.append(reply.content_type).append("\r\nContent-Length: ");
  out.append(std::to_string(reply.body.size())).append("\r\n");
  if (!outcome.allow.empty()) out.append("Allow: ").append(outcome.allow).append("\r\n");
  if (!request.keep_alive) out.append("Connection: close\r\n");
  out.append("\r\n").append(reply.body);
  router.record(facts, outcome, reply, started);
  return out;
}

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
  options.answer_simple = [&context](const SimpleRequest& request) {
    return answer_simple(context, request);
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
