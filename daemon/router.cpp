#include "daemon/router.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/util/log.hpp"

namespace vllmd::daemon {

namespace {

using Clock = std::chrono::steady_clock;

// Bodies larger than this are validated and transcoded on the executor, not on the loop. Up to
// this size (NCCL update metadata of models up to ~50B parameters) the loop does it in about a
// millisecond, while the body is still in its core's cache: a hand-over would cost a thread
// wake-up and a cold copy, more than it spares the other connections (measured: 1.3 MB updates
// 0.4 ms faster inline, /health p99 meanwhile unchanged).
constexpr std::size_t kInlineBodyBytes = std::size_t{2} << 20;

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

// Whether the request's body is handled on the executor; decided from the head, so the queue
// limit is checked against the same rule that places the work.
bool large_body(const http::RequestHead& head) {
  return head.content_length > kInlineBodyBytes || head.framing == http::BodyFraming::kChunked;
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
  bool large_body = false;
  // Generation routes: X-Request-Id and X-data-parallel-rank, as sent.
  std::optional<std::string> request_id;
  std::optional<std::string> data_parallel_rank;
  std::optional<std::string> affinity;  // X-Session-ID
};

namespace {

std::optional<std::string> field_if_present(const http::RequestHead& head, std::string_view name) {
  if (head.count_named(name) == 0) return std::nullopt;
  return std::string(head.field(name));
}

}  // namespace

// Why the request is refused from its head, or nothing. `headers` gets what the refusal
// carries (Allow, WWW-Authenticate).
std::optional<api::ApiError> Router::refusal(const http::RequestHead& head, const api::Route* route,
                                             const std::optional<util::IpAddress>& peer,
                                             const Policy& policy, http::Headers& headers) const {
  const bool open = route != nullptr && route->open_to_all;
  if (!open && !policy.allowlist.empty() &&
      (!peer || !util::any_contains(policy.allowlist, *peer))) {
    return api::forbidden("client address " + peer_text(peer) + " is not allowed");
  }
  if (route == nullptr || (route->dev_only && !context_.dev_mode)) return api::not_found();
  if (head.method != route->method) {
    headers.emplace_back("Allow", std::string(route->method));
    return api::method_not_allowed();
  }
  if (!open && !policy.api_keys.empty() &&
      !authorized(head.field(http::KnownField::kAuthorization), policy.api_keys)) {
    headers.emplace_back("WWW-Authenticate", "Bearer");
    return api::unauthorized("missing or invalid API key");
  }
  const std::string_view session = head.field("vllmd-session");
  if (!session.empty() &&
      (!api::valid_session_id(session) || head.count_named("vllmd-session") > 1)) {
    return api::invalid_request(
        "the Vllmd-Session header must be one id of 1 to 128 visible ASCII characters");
  }
  if (large_body(head) && context_.executor != nullptr &&
      static_cast<int>(context_.executor->queued()) >= context_.max_queued) {
    return api::server_busy("too many requests waiting (server.max_queued)");
  }
  return std::nullopt;
}

http::Decision Router::decide(const http::RequestHead& head,
                              const std::optional<util::IpAddress>& peer) {
  const std::string_view target = origin_form(head.target);
  const std::size_t question = target.find('?');
  const std::string path = decoded_path(target.substr(0, question));
  const api::Route* route = api::find_route(path);
  http::Decision decision;
  http::Headers headers;
  const std::shared_ptr<const Policy> policy = context_.policy();  // one reload state per request
  if (auto error = refusal(head, route, peer, *policy, headers)) {
    decision.refusal = http::error_response(*error);
    decision.refusal->headers = std::move(headers);
    record(peer, head.method, path, route, error->status, 0, 0, {});
    return decision;
  }
  decision.body_limit = static_cast<std::uint64_t>(policy->max_body_bytes);
  auto match = std::make_shared<RouteMatch>();
  match->route = route;
  if (question != std::string_view::npos) match->query = std::string(target.substr(question + 1));
  match->peer = peer;
  match->large_body = large_body(head);
  if (const std::string_view session = head.field("vllmd-session"); !session.empty()) {
    match->session = std::string(session);
  }
  if (route->handling == api::Handling::kGenerate) {
    // A client that leaves (a plain FIN included) stops the engine's work for it.
    decision.cancel_on_hangup = true;
    match->request_id = field_if_present(head, "x-request-id");
    match->data_parallel_rank = field_if_present(head, "x-data-parallel-rank");
    match->affinity = field_if_present(head, "x-session-id");
  }
  decision.on_request = [this, match](const http::ExchangePtr& exchange) {
    serve(match, exchange);
  };
  return decision;
}

void Router::serve(const std::shared_ptr<RouteMatch>& match, const http::ExchangePtr& exchange) {
  auto call = std::make_shared<api::Call>();
  call->route = match->route;
  call->query = api::parse_query(match->query);
  call->body = std::move(exchange->request().body);
  call->session = match->session;
  const bool generation = call->route->handling == api::Handling::kGenerate;
  if (generation) {
    call->request_id_header = match->request_id;
    call->data_parallel_rank_header = match->data_parallel_rank;
    call->session_header = match->affinity;
    call->stream = exchange;
  }
  const bool on_executor = match->large_body || call->route->blocking;
  auto run = [this, match, exchange, call, generation] {
    auto done = [this, match, exchange](api::Response reply) {
      answer(*match, *exchange, std::move(reply));
    };
    if (generation && context_.generation != nullptr)
      return context_.generation->handle(call, done);
    context_.service->handle(call, done);
  };
  if (on_executor && context_.executor != nullptr) return context_.executor->post(run);
  run();
}

void Router::answer(const RouteMatch& match, http::Exchange& exchange, api::Response reply) {
  const http::Request& request = exchange.request();
  const auto now = Clock::now();
  const double total = milliseconds(now - request.head_at);
  const double read = milliseconds(request.body_at - request.head_at);
  const double engine = reply.engine_seconds * 1e3;
  const Generated generated{reply.tokens, reply.first_token_seconds, std::move(reply.choices)};
  if (reply.streamed || reply.status == api::kClientClosedRequest) {
    // The answer went out as a stream (or nowhere): log it once, then end it.
    record(match.peer, match.route->method, match.route->path, match.route, reply.status, total,
           engine, generated);
    if (reply.streamed) exchange.stream_end();
    return;
  }
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
  // Counted before the answer leaves: a client that has it sees it in /metrics.
  record(match.peer, match.route->method, match.route->path, match.route, response.status, total,
         engine, generated);
  exchange.respond(response);
}

// The access-log line and the request counter, for every request.
void Router::record(const std::optional<util::IpAddress>& peer, std::string_view method,
                    std::string_view path, const api::Route* route, int status, double total_ms,
                    double engine_ms, const Generated& generated) const {
  const bool generation = route != nullptr && (route->operation == api::Operation::kGenerate ||
                                               route->operation == api::Operation::kCompletions);
  if (context_.metrics != nullptr) {
    context_.metrics->count_request(route, status);
    if (generation) {
      context_.metrics->generation_finished(generated.tokens, generated.first_token_seconds,
                                            generated.choices);
    }
  }
  if (!util::log::enabled(util::log::Level::kInfo)) return;
  const auto rounded = [](double ms) { return static_cast<long long>(ms * 1000) / 1000.0; };
  if (generation) {
    return util::log::info(
        peer_text(peer), " ", util::log::escaped(method), " ", util::log::escaped(path), " ",
        status, " ", rounded(total_ms), "ms tokens=", generated.tokens, " ttft=",
        generated.first_token_seconds
            ? std::to_string(rounded(*generated.first_token_seconds * 1e3)) + "ms"
            : std::string("-"));
  }
  util::log::info(peer_text(peer), " ", util::log::escaped(method), " ", util::log::escaped(path),
                  " ", status, " ", rounded(total_ms), "ms engine=", rounded(engine_ms), "ms");
}

}  // namespace vllmd::daemon
