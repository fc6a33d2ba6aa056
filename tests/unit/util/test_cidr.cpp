// CIDR parsing and matching for server.allowlist (common/util/cidr.*).

#include <doctest/doctest.h>

#include <string>

#include "common/util/cidr.hpp"

using vllmd::util::Cidr;
using vllmd::util::IpAddress;

namespace {

Cidr block(const char* text) {
  auto parsed = Cidr::parse(text);
  REQUIRE_MESSAGE(parsed.has_value(), text);
  return *parsed;
}

bool in(const char* cidr, const char* address) {
  auto parsed = IpAddress::parse(address);
  REQUIRE_MESSAGE(parsed.has_value(), address);
  return block(cidr).contains(*parsed);
}

}  // namespace

TEST_CASE("IPv4 blocks") {
  CHECK(in("10.1.0.0/16", "10.1.0.0"));
  CHECK(in("10.1.0.0/16", "10.1.255.255"));
  CHECK_FALSE(in("10.1.0.0/16", "10.2.0.1"));
  CHECK_FALSE(in("10.1.0.0/16", "11.1.0.1"));
  CHECK(in("127.0.0.0/8", "127.0.0.1"));
  CHECK(in("127.0.0.0/8", "127.255.1.2"));
  CHECK_FALSE(in("127.0.0.0/8", "128.0.0.1"));
  // A prefix that is not a whole number of bytes.
  CHECK(in("192.168.4.0/22", "192.168.7.255"));
  CHECK_FALSE(in("192.168.4.0/22", "192.168.8.0"));
  CHECK_FALSE(in("192.168.4.0/22", "192.168.3.255"));
}

TEST_CASE("/0, /32 and bare addresses") {
  CHECK(in("0.0.0.0/0", "1.2.3.4"));
  CHECK(in("0.0.0.0/0", "255.255.255.255"));
  CHECK_FALSE(in("0.0.0.0/0", "::1"));  // /0 of one family only
  CHECK(in("::/0", "2001:db8::1"));
  CHECK_FALSE(in("::/0", "10.0.0.1"));
  CHECK(in("10.0.0.7/32", "10.0.0.7"));
  CHECK_FALSE(in("10.0.0.7/32", "10.0.0.6"));
  CHECK(block("10.0.0.7").prefix == 32);
  CHECK(in("10.0.0.7", "10.0.0.7"));
  CHECK_FALSE(in("10.0.0.7", "10.0.0.8"));
  CHECK(block("::1").prefix == 128);
}

TEST_CASE("IPv6 blocks and /128") {
  CHECK(in("::1/128", "::1"));
  CHECK_FALSE(in("::1/128", "::2"));
  CHECK(in("2001:db8::/32", "2001:db8:ffff::1"));
  CHECK_FALSE(in("2001:db8::/32", "2001:db9::1"));
  CHECK(in("fe80::/10", "febf::1"));
  CHECK_FALSE(in("fe80::/10", "fec0::1"));
  CHECK(in("2001:db8::5/128", "2001:db8::5"));
  CHECK_FALSE(in("2001:db8::5/128", "2001:db8::4"));
  CHECK_FALSE(in("::1/128", "127.0.0.1"));
}

TEST_CASE("IPv4-mapped IPv6 addresses match IPv4 blocks") {
  CHECK(in("127.0.0.0/8", "::ffff:127.0.0.1"));
  CHECK(in("10.1.0.0/16", "::ffff:10.1.2.3"));
  CHECK_FALSE(in("10.1.0.0/16", "::ffff:10.2.2.3"));
  // A block written mapped is the IPv4 block it carries.
  CHECK(in("::ffff:10.0.0.0/104", "10.1.2.3"));
  CHECK(in("::ffff:10.0.0.0/104", "::ffff:10.1.2.3"));
  CHECK_FALSE(in("::ffff:10.0.0.0/104", "11.0.0.1"));
  CHECK(block("::ffff:10.0.0.0/104").to_string() == "10.0.0.0/8");
  // Raw socket bytes: 16 of them for a mapped peer on a dual-stack listener.
  const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  auto peer = IpAddress::from_bytes(mapped, sizeof mapped);
  REQUIRE(peer.has_value());
  CHECK_FALSE(peer->v6);
  CHECK(block("127.0.0.0/8").contains(*peer));
  const unsigned char v4[4] = {10, 0, 0, 1};
  CHECK(block("10.0.0.0/8").contains(*IpAddress::from_bytes(v4, 4)));
  CHECK_FALSE(IpAddress::from_bytes(v4, 3).has_value());
}

TEST_CASE("host bits are cleared") {
  CHECK(block("10.1.2.3/16").to_string() == "10.1.0.0/16");
  CHECK(block("2001:db8::1/32").to_string() == "2001:db8::/32");
  CHECK(in("10.1.2.3/16", "10.1.9.9"));
}

TEST_CASE("bad blocks are refused with a reason") {
  for (const char* text : {"",
                           "/",
                           "/8",
                           "10.0.0.0/",
                           "10.0.0.0/33",
                           "::/129",
                           "10.0.0/8",
                           "10.0.0.256/8",
                           "10.0.0.0/8x",
                           "10.0.0.0/-1",
                           "10.0.0.0/+8",
                           "10.0.0.0/ 8",
                           " 10.0.0.0/8",
                           "10.0.0.0/8/8",
                           "abc",
                           "localhost/8",
                           "::ffff:10.0.0.0/95",
                           "1:2:3:4:5:6:7:8:9/64",
                           "10.0.0.0/0008",
                           "fe80::1%eth0/64"}) {
    CAPTURE(std::string(text));
    auto parsed = Cidr::parse(text);
    CHECK_FALSE(parsed.has_value());
    if (!parsed) CHECK(parsed.error().find("is not a CIDR block") != std::string::npos);
  }
}

TEST_CASE("loopback listen addresses") {
  CHECK(vllmd::util::is_loopback_host("127.0.0.1"));
  CHECK(vllmd::util::is_loopback_host("127.1.2.3"));
  CHECK(vllmd::util::is_loopback_host("::1"));
  CHECK(vllmd::util::is_loopback_host("[::1]"));
  CHECK(vllmd::util::is_loopback_host("::ffff:127.0.0.1"));
  CHECK(vllmd::util::is_loopback_host("localhost"));
  CHECK_FALSE(vllmd::util::is_loopback_host("0.0.0.0"));
  CHECK_FALSE(vllmd::util::is_loopback_host("::"));
  CHECK_FALSE(vllmd::util::is_loopback_host("10.0.0.1"));
  CHECK_FALSE(vllmd::util::is_loopback_host("example.com"));
  CHECK_FALSE(vllmd::util::is_loopback_host(""));
}

TEST_CASE("host and port as one address") {
  CHECK(vllmd::util::join_host_port("127.0.0.1", "8000") == "127.0.0.1:8000");
  CHECK(vllmd::util::join_host_port("example.com", "0") == "example.com:0");
  CHECK(vllmd::util::join_host_port("::1", "8000") == "[::1]:8000");
  CHECK(vllmd::util::join_host_port("*", "*") == "*:*");
}
