#pragma once
// Source-address matching for server.allowlist: CIDR blocks of IPv4 and IPv6 addresses.
// IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) are treated as the IPv4 address they carry,
// on both sides, so a dual-stack listener matches IPv4 blocks.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

namespace vllmd::util {

struct IpAddress {
  bool v6 = false;
  std::array<std::uint8_t, 16> bytes{};  // IPv4: the first 4

  // "10.0.0.1", "::1", "::ffff:10.0.0.1" (normalized to IPv4); nullopt when not an address.
  static std::optional<IpAddress> parse(std::string_view text);
  // From raw bytes as a socket gives them: 4 (IPv4) or 16 (IPv6); normalized like parse.
  static std::optional<IpAddress> from_bytes(const void* data, std::size_t length);
  std::string to_string() const;
};

struct Cidr {
  IpAddress network;  // host bits cleared
  int prefix = 0;     // 0..32 (IPv4), 0..128 (IPv6)

  // "a.b.c.d/n", "x::y/n"; a bare address is a single host (/32, /128). Host bits under the
  // prefix are cleared. An error says what is wrong.
  static tl::expected<Cidr, std::string> parse(std::string_view text);
  bool contains(const IpAddress& address) const;
  std::string to_string() const;
};

// Whether any block contains the address.
bool any_contains(const std::vector<Cidr>& blocks, const IpAddress& address);

// Whether a listen address is loopback only: 127.0.0.0/8, ::1, ::ffff:127.0.0.0/104 or
// "localhost". Other names are not (they may resolve to anything).
bool is_loopback_host(std::string_view host);

// "host:port", or "[host]:port" for an IPv6 host (one with a colon), as URLs and ZeroMQ write it.
std::string join_host_port(std::string_view host, std::string_view port);

}  // namespace vllmd::util
