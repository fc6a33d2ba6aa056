// Endpoint arithmetic (common/engine/endpoints.*): what the frontend binds next to the
// handshake socket and what it advertises to engines.

#include <doctest/doctest.h>

#include "common/engine/endpoints.hpp"

using namespace vllmd::engine;

TEST_CASE("parse and format tcp and ipc endpoints") {
  auto tcp = parse_endpoint("tcp://10.0.0.5:5570");
  REQUIRE(tcp);
  CHECK(tcp->transport == "tcp");
  CHECK(tcp->host == "10.0.0.5");
  CHECK(tcp->port == "5570");
  CHECK(format_endpoint(*tcp) == "tcp://10.0.0.5:5570");

  auto v6 = parse_endpoint("tcp://[::1]:0");
  REQUIRE(v6);
  CHECK(v6->host == "::1");
  CHECK(v6->ipv6());
  CHECK(format_endpoint(*v6) == "tcp://[::1]:0");

  auto ipc = parse_endpoint("ipc:///run/vllmd/handshake");
  REQUIRE(ipc);
  CHECK(ipc->path == "/run/vllmd/handshake");
  CHECK(format_endpoint(*ipc) == "ipc:///run/vllmd/handshake");

  for (const char* bad : {"udp://x:1", "tcp://host", "tcp://:5", "tcp://[::1]5", "ipc://", ""}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_endpoint(bad));
  }
}

TEST_CASE("input and output bind beside the handshake, on port 0") {
  auto plan = plan_sockets("tcp://127.0.0.1:5570", "", "", "");
  REQUIRE(plan);
  CHECK(plan->input_bind == "tcp://127.0.0.1:0");
  CHECK(plan->output_bind == "tcp://127.0.0.1:0");
  CHECK(plan->advertised_host == "127.0.0.1");

  auto ipc = plan_sockets("ipc:///run/vllmd/hs", "", "", "");
  REQUIRE(ipc);
  CHECK(ipc->input_bind == "ipc:///run/vllmd/hs.input");
  CHECK(ipc->output_bind == "ipc:///run/vllmd/hs.output");

  auto explicit_ports =
      plan_sockets("tcp://10.0.0.5:5570", "tcp://10.0.0.5:5571", "tcp://10.0.0.5:5572", "");
  REQUIRE(explicit_ports);
  CHECK(explicit_ports->input_bind == "tcp://10.0.0.5:5571");
  CHECK(explicit_ports->output_bind == "tcp://10.0.0.5:5572");
}

TEST_CASE("a wildcard handshake needs an advertised host, never advertises the wildcard") {
  for (const char* wildcard : {"tcp://0.0.0.0:5570", "tcp://*:5570", "tcp://[::]:5570"}) {
    CAPTURE(wildcard);
    auto refused = plan_sockets(wildcard, "", "", "");
    REQUIRE_FALSE(refused);
    CHECK(refused.error().find("advertised host") != std::string::npos);
  }
  auto plan = plan_sockets("tcp://0.0.0.0:5570", "", "", "node-7.cluster");
  REQUIRE(plan);
  CHECK(plan->input_bind == "tcp://0.0.0.0:0");
  CHECK(plan->advertised_host == "node-7.cluster");
  CHECK(advertise("tcp://0.0.0.0:41234", plan->advertised_host).value() ==
        "tcp://node-7.cluster:41234");
  CHECK(advertise("ipc:///run/vllmd/hs.input", "").value() == "ipc:///run/vllmd/hs.input");
}
