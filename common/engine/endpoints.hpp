#pragma once
// ZeroMQ endpoint arithmetic for the frontend: where to bind the input/output sockets next to
// the handshake socket, and what to advertise to engines in INIT (never a wildcard host).

#include <string>
#include <string_view>
#include <tl/expected.hpp>

namespace vllmd::engine {

struct Endpoint {
  std::string transport;  // "tcp" or "ipc"
  std::string host;       // tcp: without brackets for IPv6
  std::string port;       // tcp: port (may be "0" or "*")
  std::string path;       // ipc: filesystem path
  bool ipv6() const { return host.find(':') != std::string::npos; }
};

tl::expected<Endpoint, std::string> parse_endpoint(std::string_view address);
std::string format_endpoint(const Endpoint& endpoint);
bool is_wildcard_host(std::string_view host);

struct SocketPlan {
  std::string input_bind;
  std::string output_bind;
  std::string advertised_host;  // empty for ipc
};

// Input/output bind addresses derived from the handshake address unless given explicitly.
tl::expected<SocketPlan, std::string> plan_sockets(std::string_view handshake_address,
                                                   std::string_view input_address,
                                                   std::string_view output_address,
                                                   std::string_view advertised_host);

// A bound endpoint (ZMQ_LAST_ENDPOINT) with its host replaced by the advertised one.
tl::expected<std::string, std::string> advertise(std::string_view bound_endpoint,
                                                 std::string_view advertised_host);

}  // namespace vllmd::engine
