#pragma once
// The router: every request decided from its head alone (allowlist, route, dev mode, method,
// API key, session id, body limit, executor queue) and, once complete, handed to the service
// as a Call: on the event loop when it needs no waiting, on the executor when its body is
// large or the route may block. One access-log line and one counter per request.

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/util/cidr.hpp"
#include "daemon/http/server.hpp"
#include "daemon/server_context.hpp"

namespace vllmd::daemon {

struct RouteMatch;

// A generation's figures for the access log.
struct Generated {
  std::int64_t tokens = 0;
  std::optional<double> first_token_seconds;
  std::vector<api::ChoiceStats> choices;
};

class Router {
 public:
  explicit Router(ServerContext& context) : context_(context) {}

  http::Decision decide(const http::RequestHead& head, const std::optional<util::IpAddress>& peer);

 private:
  std::optional<api::ApiError> refusal(const http::RequestHead& head, const api::Route* route,
                                       const std::optional<util::IpAddress>& peer,
                                       const Policy& policy, http::Headers& headers) const;
  void serve(const std::shared_ptr<RouteMatch>& match, const http::ExchangePtr& exchange);
  void answer(const RouteMatch& match, http::Exchange& exchange, api::Response reply);
  void record(const std::optional<util::IpAddress>& peer, std::string_view method,
              std::string_view path, const api::Route* route, int status, double total_ms,
              double engine_ms, const Generated& generated) const;

  ServerContext& context_;
};

}  // namespace vllmd::daemon
