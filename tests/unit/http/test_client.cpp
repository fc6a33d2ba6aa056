// The HTTP client (common/http/client.*): URL parsing, and transport failures classified by
// kind with retries only where they are safe. Requests against a live server are covered by
// the vllmctl integration tests.

#include <Poco/Net/ServerSocket.h>
#include <doctest/doctest.h>

#include "common/http/client.hpp"

using namespace vllmd::http;

TEST_CASE("parse_endpoint accepts http URLs, with a default port and a path prefix") {
  auto plain = parse_endpoint("http://127.0.0.1:8000");
  REQUIRE(plain);
  CHECK(plain->host == "127.0.0.1");
  CHECK(plain->port == 8000);
  CHECK(plain->base_path.empty());
  CHECK(plain->url() == "http://127.0.0.1:8000");

  auto defaulted = parse_endpoint("http://vllm.internal/prefix/");
  REQUIRE(defaulted);
  CHECK(defaulted->port == 80);
  CHECK(defaulted->base_path == "/prefix");

  auto ipv6 = parse_endpoint("http://[::1]:9000");
  REQUIRE(ipv6);
  CHECK(ipv6->host == "::1");
  CHECK(ipv6->url() == "http://[::1]:9000");
}

TEST_CASE("parse_endpoint names what is wrong") {
  CHECK(parse_endpoint("127.0.0.1:8000").error().find("not a URL") != std::string::npos);
  CHECK(parse_endpoint("https://h:1").error().find("https") != std::string::npos);
  CHECK(parse_endpoint("ftp://h:1").error().find("unsupported scheme") != std::string::npos);
  CHECK(parse_endpoint("http://:8000").error().find("no host") != std::string::npos);
  CHECK(parse_endpoint("http://u:p@h:1").error().find("credentials") != std::string::npos);
  CHECK(parse_endpoint("http://h:1/?a=b").error().find("query") != std::string::npos);
}

namespace {
// A loopback port nobody listens on: bound to find it, then closed.
std::uint16_t closed_port() {
  Poco::Net::ServerSocket socket(Poco::Net::SocketAddress("127.0.0.1", 0));
  const std::uint16_t port = socket.address().port();
  socket.close();
  return port;
}
}  // namespace

TEST_CASE("a refused connection is connect_failed; GETs are retried, POSTs are not") {
  auto endpoint = parse_endpoint("http://127.0.0.1:" + std::to_string(closed_port()));
  REQUIRE(endpoint);
  ClientOptions options;
  options.retry.retries = 2;
  options.retry.first_delay = std::chrono::milliseconds(1);
  int attempts = 0;
  options.trace = [&attempts](std::string_view line) { attempts += line.rfind("> ", 0) == 0; };
  const Client client(*endpoint, options);

  auto get = client.request(Request{"GET", "/health", {}, std::nullopt, {}});
  REQUIRE(!get);
  CHECK(get.error().kind == TransportErrorKind::kConnectFailed);
  CHECK(kind_name(get.error().kind) == "connect_failed");
  CHECK(get.error().attempts == 3);
  CHECK(attempts == 3);

  attempts = 0;
  auto post = client.request(Request{"POST", "/pause", {}, std::nullopt, {}});
  REQUIRE(!post);
  CHECK(post.error().attempts == 1);
  CHECK(attempts == 1);
  CHECK(post.error().message.find("cannot connect to " + endpoint->url()) == 0);

  attempts = 0;
  Request once{"GET", "/health", {}, std::nullopt, {}};
  once.retry = false;
  CHECK(client.request(once).error().attempts == 1);
  CHECK(attempts == 1);
}
