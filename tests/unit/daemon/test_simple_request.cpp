// The poller's parser for simple requests: what it accepts, and that anything unusual is left
// to Poco (nullopt) rather than guessed.
#include <doctest/doctest.h>

#include <string>

#include "daemon/simple_request.hpp"

using vllmd::daemon::parse_simple_request;

TEST_CASE("a plain GET, its target, Authorization and keep-alive") {
  const std::string header =
      "GET /weight_info?x=1 HTTP/1.1\r\nHost: h\r\nauthorization:  Bearer k \r\n\r\n";
  const auto request = parse_simple_request(header);
  REQUIRE(request);
  CHECK(request->method == "GET");
  CHECK(request->target == "/weight_info?x=1");
  CHECK(request->authorization == "Bearer k");
  CHECK(request->keep_alive);
}

TEST_CASE("keep-alive follows the version and the Connection header") {
  CHECK_FALSE(parse_simple_request("GET / HTTP/1.0\r\n\r\n")->keep_alive);
  CHECK(parse_simple_request("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")->keep_alive);
  CHECK_FALSE(parse_simple_request("GET / HTTP/1.1\r\nCONNECTION: close\r\n\r\n")->keep_alive);
}

TEST_CASE("anything unusual is left to Poco") {
  const char* const unusual[] = {
      "GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
      "GET / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
      "GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
      "GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
      "GET / HTTP/1.1\r\nno colon\r\n\r\n",
      "GET / HTTP/1.1\r\nName : value\r\n\r\n",
      "GET / HTTP/1.1\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n",
      "GET / HTTP/1.1\r\nConnection: upgrade\r\n\r\n",
      "GET / HTTP/2.0\r\n\r\n",
      "GET /  HTTP/1.1\r\n\r\n",
      "GET / HTTP/1.1 extra\r\n\r\n",
      "GET\r\n\r\n",
      "GET /a\x01 HTTP/1.1\r\n\r\n",
      "GET /\xc3\xa9 HTTP/1.1\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: h\r\n",  // no blank line
      "",
  };
  for (const char* header : unusual) {
    INFO(header);
    CHECK_FALSE(parse_simple_request(header));
  }
}
