#include "common/util/cidr.hpp"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>

namespace vllmd::util {

namespace {

constexpr std::array<std::uint8_t, 12> kMappedPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

bool is_mapped(const std::array<std::uint8_t, 16>& bytes) {
  return std::memcmp(bytes.data(), kMappedPrefix.data(), kMappedPrefix.size()) == 0;
}

IpAddress normalized(IpAddress address) {
  if (address.v6 && is_mapped(address.bytes)) {
    IpAddress v4;
    std::memcpy(v4.bytes.data(), address.bytes.data() + 12, 4);
    return v4;
  }
  return address;
}

// The first `prefix` bits of a and b agree.
bool same_prefix(const std::uint8_t* a, const std::uint8_t* b, int prefix) {
  const int whole = prefix / 8;
  if (std::memcmp(a, b, static_cast<std::size_t>(whole)) != 0) return false;
  const int rest = prefix % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

}  // namespace

std::optional<IpAddress> IpAddress::parse(std::string_view text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  const std::string copy(text);
  IpAddress address;
  if (copy.find(':') == std::string::npos) {
    if (inet_pton(AF_INET, copy.c_str(), address.bytes.data()) != 1) return std::nullopt;
    return address;
  }
  address.v6 = true;
  if (inet_pton(AF_INET6, copy.c_str(), address.bytes.data()) != 1) return std::nullopt;
  return normalized(address);
}

std::optional<IpAddress> IpAddress::from_bytes(const void* data, std::size_t length) {
  IpAddress address;
  if (length == 4) {
    std::memcpy(address.bytes.data(), data, 4);
    return address;
  }
  if (length == 16) {
    address.v6 = true;
    std::memcpy(address.bytes.data(), data, 16);
    return normalized(address);
  }
  return std::nullopt;
}

std::string IpAddress::to_string() const {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(v6 ? AF_INET6 : AF_INET, bytes.data(), text, sizeof text);
  return text;
}

tl::expected<Cidr, std::string> Cidr::parse(std::string_view text) {
  const auto invalid = [&](std::string_view why) {
    return tl::unexpected("'" + std::string(text) + "' is not a CIDR block: " + std::string(why));
  };
  const std::size_t slash = text.find('/');
  const std::string_view address_text = text.substr(0, slash);
  std::optional<IpAddress> address = IpAddress::parse(address_text);
  if (!address) return invalid("expected an IPv4 or IPv6 address before the '/'");
  // A mapped address was turned into IPv4: its prefix counts the 96 bits before.
  const bool mapped = address_text.find(':') != std::string_view::npos && !address->v6;
  const int width = address->v6 ? 128 : 32;
  const int written_width = mapped ? 128 : width;
  int prefix = written_width;
  if (slash != std::string_view::npos) {
    const std::string_view digits = text.substr(slash + 1);
    if (digits.empty() || digits.size() > 3 ||
        digits.find_first_not_of("0123456789") != std::string_view::npos) {
      return invalid("expected a prefix length after the '/'");
    }
    std::from_chars(digits.data(), digits.data() + digits.size(), prefix);
    if (prefix > written_width) {
      return invalid("prefix length must be at most " + std::to_string(written_width));
    }
  }
  if (mapped) {
    if (prefix < 96) return invalid("an IPv4-mapped block needs a prefix length of at least 96");
    prefix -= 96;
  }
  Cidr block;
  block.network.v6 = address->v6;
  block.prefix = prefix;
  // Keep the prefix bits, clear the rest.
  for (int bit = 0; bit < prefix; ++bit) {
    const auto mask = static_cast<std::uint8_t>(0x80 >> (bit % 8));
    block.network.bytes[bit / 8] |= address->bytes[bit / 8] & mask;
  }
  (void)width;
  return block;
}

bool Cidr::contains(const IpAddress& address) const {
  const IpAddress peer = normalized(address);
  if (peer.v6 != network.v6) return false;
  return same_prefix(peer.bytes.data(), network.bytes.data(), prefix);
}

std::string Cidr::to_string() const { return network.to_string() + "/" + std::to_string(prefix); }

bool any_contains(const std::vector<Cidr>& blocks, const IpAddress& address) {
  for (const Cidr& block : blocks) {
    if (block.contains(address)) return true;
  }
  return false;
}

bool is_loopback_host(std::string_view host) {
  if (host == "localhost") return true;
  std::string_view bare = host;
  if (bare.size() >= 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  const std::optional<IpAddress> address = IpAddress::parse(bare);
  if (!address) return false;
  static const Cidr kLoopbackV4 = *Cidr::parse("127.0.0.0/8");
  static const Cidr kLoopbackV6 = *Cidr::parse("::1/128");
  return kLoopbackV4.contains(*address) || kLoopbackV6.contains(*address);
}

std::string join_host_port(std::string_view host, std::string_view port) {
  const bool ipv6 = host.find(':') != std::string_view::npos;
  return (ipv6 ? "[" + std::string(host) + "]" : std::string(host)) + ":" + std::string(port);
}

}  // namespace vllmd::util
