#include "common/engine/endpoints.hpp"

#include "common/util/cidr.hpp"
#include "common/util/fail.hpp"

namespace vllmd::engine {

using util::fail;

tl::expected<Endpoint, std::string> parse_endpoint(std::string_view address) {
  Endpoint endpoint;
  if (address.starts_with("ipc://")) {
    endpoint.transport = "ipc";
    endpoint.path = std::string(address.substr(6));
    if (endpoint.path.empty()) return fail("ipc address without a path: " + std::string(address));
    return endpoint;
  }
  if (!address.starts_with("tcp://")) {
    return fail("address must start with tcp:// or ipc://: " + std::string(address));
  }
  std::string_view rest = address.substr(6);
  std::size_t colon = std::string_view::npos;
  if (rest.starts_with('[')) {
    const std::size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      return fail("bad IPv6 tcp address (want tcp://[addr]:port): " + std::string(address));
    }
    endpoint.host = std::string(rest.substr(1, close - 1));
    colon = close + 1;
  } else {
    colon = rest.rfind(':');
    if (colon == std::string_view::npos)
      return fail("tcp address without a port: " + std::string(address));
    endpoint.host = std::string(rest.substr(0, colon));
  }
  endpoint.transport = "tcp";
  endpoint.port = std::string(rest.substr(colon + 1));
  if (endpoint.host.empty() || endpoint.port.empty()) {
    return fail("tcp address needs host and port: " + std::string(address));
  }
  return endpoint;
}

std::string format_endpoint(const Endpoint& endpoint) {
  if (endpoint.transport == "ipc") return "ipc://" + endpoint.path;
  return "tcp://" + util::join_host_port(endpoint.host, endpoint.port);
}

bool is_wildcard_host(std::string_view host) {
  return host == "*" || host == "0.0.0.0" || host == "::" || host == "0:0:0:0:0:0:0:0";
}

tl::expected<SocketPlan, std::string> plan_sockets(std::string_view handshake_address,
                                                   std::string_view input_address,
                                                   std::string_view output_address,
                                                   std::string_view advertised_host) {
  auto handshake = parse_endpoint(handshake_address);
  if (!handshake) return fail(handshake.error());
  SocketPlan plan;
  if (handshake->transport == "ipc") {
    plan.input_bind =
        input_address.empty() ? "ipc://" + handshake->path + ".input" : std::string(input_address);
    plan.output_bind = output_address.empty() ? "ipc://" + handshake->path + ".output"
                                              : std::string(output_address);
  } else {
    Endpoint sibling = *handshake;
    sibling.port = "0";
    plan.input_bind = input_address.empty() ? format_endpoint(sibling) : std::string(input_address);
    plan.output_bind =
        output_address.empty() ? format_endpoint(sibling) : std::string(output_address);
    plan.advertised_host = advertised_host.empty() ? handshake->host : std::string(advertised_host);
    if (is_wildcard_host(plan.advertised_host)) {
      return fail("the handshake address " + std::string(handshake_address) +
                  " binds all interfaces; set the advertised host engines should use to reach "
                  "this machine");
    }
  }
  for (const std::string* bind : {&plan.input_bind, &plan.output_bind}) {
    if (auto parsed = parse_endpoint(*bind); !parsed) return fail(parsed.error());
  }
  return plan;
}

tl::expected<std::string, std::string> advertise(std::string_view bound_endpoint,
                                                 std::string_view advertised_host) {
  auto endpoint = parse_endpoint(bound_endpoint);
  if (!endpoint) return fail(endpoint.error());
  if (endpoint->transport == "tcp" && !advertised_host.empty()) {
    endpoint->host = std::string(advertised_host);
  }
  return format_endpoint(*endpoint);
}

}  // namespace vllmd::engine
