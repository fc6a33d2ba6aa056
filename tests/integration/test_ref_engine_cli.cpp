// vllm-ref-engine processes driven by a raw ZeroMQ frontend: the flags for coordinated DP
// (the DP group, its --record line, the startup failure without a master) and --inject-hold.

#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/support/process.hpp"
#include "tests/unit/reference/frontend.hpp"

using namespace std::chrono_literals;
using vllmd::test::Frontend;
using vllmd::testing::ChildProcess;
namespace wire = vllmd::wire;

namespace {

ChildProcess start_engine(const Frontend& frontend, std::vector<std::string> extra) {
  std::vector<std::string> argv = {VLLM_REF_ENGINE_PATH, "--handshake", frontend.handshake_address};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return ChildProcess(argv);
}

std::string record_path(int rank) {
  return "/tmp/vllmd-test-" + std::to_string(::getpid()) + "-record-" + std::to_string(rank);
}

std::string read_file(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The --record line of a DP group formed at `master`.
std::string dp_group_line(int rank, const wire::DataParallelMaster& master) {
  std::string ports;
  for (std::int64_t port : master.port_list) {
    ports += (ports.empty() ? "" : ",") + std::to_string(port);
  }
  return "{\"dp_group\":{\"rank\":" + std::to_string(rank) +
         ",\"size\":2,\"master_ip\":\"127.0.0.1\",\"master_port\":" + std::to_string(master.port) +
         ",\"port_list\":[" + ports +
         "],\"group_port\":" + std::to_string(master.port_list.back()) +
         ",\"master_from_init\":true}}\n";
}

// Flags of a coordinated DP rank of two, recording into a fresh file.
std::vector<std::string> coordinated_flags(int rank) {
  ::unlink(record_path(rank).c_str());
  return {"--rank", std::to_string(rank), "--dp",
          "2",      "--coordinated-dp",   "--dp-group-timeout",
          "2",      "--record",           record_path(rank)};
}

}  // namespace

TEST_CASE("coordinated DP engines form their group at INIT's master and record it") {
  Frontend frontend;
  ChildProcess engines[] = {start_engine(frontend, coordinated_flags(0)),
                            start_engine(frontend, coordinated_flags(1))};
  auto master = wire::pick_data_parallel_master("127.0.0.1", 2);
  REQUIRE(master);
  const auto registrations = frontend.connect_all(2, *master);
  for (const auto& entry : registrations) {
    const int rank = entry.first;
    const auto& frame = entry.second;
    CAPTURE(rank);
    auto registration = wire::decode_registration(frame);
    REQUIRE(registration);
    CHECK(registration->data_parallel_size == 2);
    CHECK(read_file(record_path(rank)) == dp_group_line(rank, *master));
    ::unlink(record_path(rank).c_str());
  }
}

TEST_CASE("coordinated DP engines without a DP master in INIT exit at startup") {
  Frontend frontend;
  ChildProcess engines[] = {start_engine(frontend, coordinated_flags(0)),
                            start_engine(frontend, coordinated_flags(1))};
  for (int i = 0; i < 2; ++i) {
    auto hello = Frontend::receive(frontend.handshake);
    REQUIRE(hello);
    Frontend::send(frontend.handshake, {(*hello)[0], frontend.init()});  // parallel_config {}
  }
  for (ChildProcess& engine : engines) CHECK(engine.wait(10s) == 1);
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(read_file(record_path(rank)).empty());
    ::unlink(record_path(rank).c_str());
  }
}

TEST_CASE("--inject-hold answers late without blocking the engine") {
  Frontend frontend;
  ChildProcess engine = start_engine(frontend, {"--inject-hold", "pause_scheduler=0.5"});
  frontend.connect();
  const auto sent = std::chrono::steady_clock::now();
  frontend.call(1, "pause_scheduler", R"(["wait",false])");
  frontend.call(2, "is_scheduler_paused", "[]");
  CHECK(frontend.reply().call_id == wire::CallId{2, false});
  CHECK(frontend.reply().call_id == wire::CallId{1, false});
  CHECK(std::chrono::steady_clock::now() - sent >= 500ms);
}
