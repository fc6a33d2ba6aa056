// Engine client + real reference-engine processes over tcp loopback (DP=2, TP=2): the
// handshake, the weight lifecycle fanned out, failures reported per rank, a killed engine
// noticed at once, and a restarted one admitted again.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <thread>

#include "common/engine/client.hpp"
#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_to_json.hpp"
#include "tests/support/process.hpp"

using namespace std::chrono_literals;
using vllmd::engine::CallErrorKind;
using vllmd::engine::CallOptions;
using vllmd::engine::EngineClient;
using vllmd::engine::EngineReply;
using vllmd::engine::EngineState;
using vllmd::testing::ChildProcess;

namespace {

// Keeps the transcoded args alive for the duration of the test case.
std::deque<std::string> arg_store;

EngineClient::ArgParts args(std::string_view json) {
  auto transcoded = vllmd::wire::json_to_msgpack(json);
  REQUIRE(transcoded);
  arg_store.push_back(transcoded->msgpack.str());
  return {arg_store.back()};
}

std::string as_json(const EngineReply& reply) {
  REQUIRE(reply.value);
  auto json = vllmd::wire::msgpack_to_json(*reply.value);
  REQUIRE(json);
  return *json;
}

ChildProcess start_engine(const EngineClient& client, int rank,
                          std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {VLLM_REF_ENGINE_PATH,
                                   "--handshake",
                                   client.handshake_endpoint(),
                                   "--rank",
                                   std::to_string(rank),
                                   "--tp",
                                   "2",
                                   "--dp",
                                   "2",
                                   "--backend",
                                   "nccl"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return ChildProcess(argv);
}

std::unique_ptr<EngineClient> make_client() {
  vllmd::engine::ClientOptions options;
  options.handshake_address = "tcp://127.0.0.1:0";
  options.data_parallel_size = 2;
  auto client = EngineClient::create(options);
  REQUIRE_MESSAGE(client, (client ? "" : client.error()));
  return std::move(*client);
}

const CallOptions kQuick{5s, false};

// Whether every call has left the client's pending table (it is counted after each IO round,
// which may end just after a failed call returned).
bool no_call_pending(const EngineClient& client) {
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (client.pending_calls() != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// A call to rank 0 made again while the rank's earlier garbage burst fails it; the burst is
// eight frames, so a ninth failure would be the call's own.
EngineReply call_past_garbage(EngineClient& client, std::string_view method,
                              const EngineClient::ArgParts& call_args) {
  for (int attempt = 0;; ++attempt) {
    EngineReply reply = client.call(0, method, call_args, kQuick);
    const bool garbled =
        !reply.value && reply.value.error().message.find("undecodable") != std::string::npos;
    if (!garbled || attempt == 8) return reply;
  }
}

void expect_all_ok(const std::vector<EngineReply>& replies, std::string_view value_json) {
  REQUIRE(replies.size() == 2);
  for (const EngineReply& reply : replies) {
    INFO("rank " << reply.rank << ": " << (reply.value ? "" : reply.value.error().message));
    REQUIRE(reply.value);
    CHECK(as_json(reply) == value_json);
  }
}

}  // namespace

TEST_CASE("DP=2 TP=2: handshake, fanned-out lifecycle, failures, death and restart") {
  auto client = make_client();
  CHECK(client->handshake_endpoint().starts_with("tcp://127.0.0.1:"));
  CHECK(client->input_endpoint().starts_with("tcp://127.0.0.1:"));
  CHECK_FALSE(client->all_ready());

  ChildProcess engine0 = start_engine(*client, 0, {"--inject-fail", "start_draft_weight_update"});
  ChildProcess engine1 = start_engine(*client, 1, {"--inject-delay", "is_scheduler_paused=30"});
  REQUIRE(client->wait_all_ready(20s));

  SUBCASE("registration fields are kept per engine") {
    for (const auto& engine : client->engines()) {
      CHECK(engine.state == EngineState::kReady);
      CHECK(engine.registration.world_size == 2);
      CHECK(engine.registration.data_parallel_size == 1);  // dense ranks: DP collapsed to 1
      CHECK(engine.registration.data_parallel_rank == engine.rank);
      CHECK(engine.registration.weight_transfer_backend == "nccl");
      CHECK(engine.registration.vllm_version.has_value());
      CHECK(engine.admissions == 1);
    }
  }

  SUBCASE("the whole weight lifecycle reaches both engines, versions agree") {
    expect_all_ok(client->call_all("collective_rpc",
                                   args(R"(["init_weight_transfer_engine",null,[],{"init_info":)"
                                        R"({"master_address":"127.0.0.1","master_port":29500,)"
                                        R"("rank_offset":1,"world_size":5}}])"),
                                   kQuick),
                  "[null,null]");
    expect_all_ok(
        client->call_all("collective_rpc", args(R"(["start_weight_update",null,[],{}])"), kQuick),
        "[null,null]");
    expect_all_ok(client->call_all("collective_rpc",
                                   args(R"(["update_weights",null,[],{"update_info":)"
                                        R"({"names":["w"],"dtype_names":["bfloat16"],)"
                                        R"("shapes":[[2,2]]}}])"),
                                   kQuick),
                  "[null,null]");
    expect_all_ok(
        client->call_all("collective_rpc", args(R"(["finish_weight_update",null,[],{}])"), kQuick),
        "[null,null]");
    expect_all_ok(client->call_all("set_weight_version", args(R"(["step-1"])"), kQuick), "null");
    expect_all_ok(client->call_all("get_weight_version", args("[]"), kQuick), R"("step-1")");

    // The engine's own state machine error comes back as the engine's failure message, as
    // TP=2 workers raise it through MultiprocExecutor.
    const auto replies =
        client->call_all("collective_rpc", args(R"(["finish_weight_update",null,[],{}])"), kQuick);
    for (const EngineReply& reply : replies) {
      REQUIRE_FALSE(reply.value);
      CHECK(reply.value.error().kind == CallErrorKind::kFailed);
      CHECK(reply.value.error().message ==
            "Call to collective_rpc method failed: Worker failed with error "
            "'finish_weight_update called without a matching start_weight_update.', please "
            "check the stack trace above for the root cause");
    }
  }

  SUBCASE("an injected failure is reported with the engine's rank") {
    const auto replies = client->call_all(
        "collective_rpc", args(R"(["start_draft_weight_update",null,[],{}])"), kQuick);
    REQUIRE(replies.size() == 2);
    CHECK(replies[0].rank == 0);
    REQUIRE_FALSE(replies[0].value);
    CHECK(replies[0].value.error().kind == CallErrorKind::kFailed);
    CHECK(replies[0].value.error().message.find("injected failure") != std::string::npos);
    CHECK(replies[1].rank == 1);
    CHECK(replies[1].value);
  }

  SUBCASE("a killed engine is noticed within 1 s, its pending call fails, a restart is admitted") {
    std::optional<EngineReply> pending;
    std::thread caller([&] {
      pending = client->call(1, "is_scheduler_paused", args("[]"), CallOptions{60s, false});
    });
    std::this_thread::sleep_for(300ms);  // the call is now blocked inside engine 1
    const auto killed_at = std::chrono::steady_clock::now();
    engine1.kill_and_reap();
    caller.join();
    const auto noticed = std::chrono::steady_clock::now() - killed_at;
    CHECK(noticed < 1s);
    REQUIRE(pending);
    REQUIRE_FALSE(pending->value);
    CHECK(pending->value.error().kind == CallErrorKind::kUnavailable);
    // Its connection dropped: disconnected (ZeroMQ might reconnect it) until a restart.
    CHECK(client->engines()[1].state == EngineState::kDisconnected);
    CHECK_FALSE(client->all_ready());

    // Calls to the dead engine fail at once; the live one keeps working.
    const auto replies = client->call_all("get_weight_version", args("[]"), kQuick);
    CHECK(replies[0].value);
    REQUIRE_FALSE(replies[1].value);
    CHECK(replies[1].value.error().kind == CallErrorKind::kUnavailable);

    engine1 = start_engine(*client, 1);
    REQUIRE(client->wait_all_ready(20s));
    CHECK(client->engines()[1].admissions == 2);
    expect_all_ok(client->call_all("get_weight_version", args("[]"), kQuick), R"("default")");
  }
}

TEST_CASE("ENGINE_CORE_DEAD marks the engine dead and fails its call at once") {
  vllmd::engine::ClientOptions options;
  auto created = EngineClient::create(options);
  REQUIRE(created);
  auto& client = *created;
  ChildProcess engine({VLLM_REF_ENGINE_PATH, "--handshake", client->handshake_endpoint(), "--rank",
                       "0", "--inject-dead", "update_weights"});
  REQUIRE(client->wait_all_ready(20s));
  // The first reply teaches the client which output connection is this engine's.
  REQUIRE(client->call(0, "get_weight_version", args("[]"), kQuick).value);
  const auto started = std::chrono::steady_clock::now();
  const auto reply = client->call(
      0, "collective_rpc",
      args(
          R"(["update_weights",null,[],{"update_info":{"names":[],"dtype_names":[],"shapes":[]}}])"),
      CallOptions{60s, true});
  CHECK(std::chrono::steady_clock::now() - started < 1s);
  REQUIRE_FALSE(reply.value);
  CHECK(reply.value.error().kind == CallErrorKind::kUnavailable);
  CHECK(client->engines()[0].state == EngineState::kDead);
  CHECK(no_call_pending(*client));
}

TEST_CASE("malformed engine frames fail the waiting call and leave nothing pending") {
  vllmd::engine::ClientOptions options;
  auto created = EngineClient::create(options);
  REQUIRE(created);
  auto& client = *created;
  ChildProcess engine({VLLM_REF_ENGINE_PATH, "--handshake", client->handshake_endpoint(), "--rank",
                       "0", "--inject-garbage", "start_weight_update", "--inject-fail",
                       "finish_weight_update"});
  REQUIRE(client->wait_all_ready(20s));
  REQUIRE(client->call(0, "get_weight_version", args("[]"), kQuick).value);
  const auto garbled =
      client->call(0, "collective_rpc", args(R"(["start_weight_update",null,[],{}])"), kQuick);
  REQUIRE_FALSE(garbled.value);
  CHECK(garbled.value.error().kind == CallErrorKind::kFailed);
  CHECK(garbled.value.error().message.find("undecodable") != std::string::npos);
  // The burst goes on after the first bad frame failed the call: each later bad frame fails
  // whatever call is then in flight. The engine answers in order, so once a reply is not the
  // burst's, the burst is over.
  const auto failed =
      call_past_garbage(*client, "collective_rpc", args(R"(["finish_weight_update",null,[],{}])"));
  REQUIRE_FALSE(failed.value);
  CHECK(failed.value.error().kind == CallErrorKind::kFailed);
  CHECK(failed.value.error().message.find("injected failure in finish_weight_update") !=
        std::string::npos);
  // The link survived it all: the engine is attached and answers.
  CHECK(client->engines()[0].state == EngineState::kReady);
  CHECK(as_json(client->call(0, "get_weight_version", args("[]"), kQuick)) == R"("default")");
  CHECK(no_call_pending(*client));
}

TEST_CASE("a timed-out lifecycle call marks the engine dead until it answers again") {
  vllmd::engine::ClientOptions options;
  auto created = EngineClient::create(options);
  REQUIRE(created);
  auto& client = *created;
  ChildProcess engine({VLLM_REF_ENGINE_PATH, "--handshake", client->handshake_endpoint(), "--rank",
                       "0", "--inject-delay", "start_weight_update=1"});
  REQUIRE(client->wait_all_ready(20s));

  const auto read_only =
      client->call(0, "collective_rpc", args(R"(["start_weight_update",null,[],{}])"),
                   CallOptions{200ms, false});
  REQUIRE_FALSE(read_only.value);
  CHECK(read_only.value.error().kind == CallErrorKind::kTimeout);
  CHECK(client->engines()[0].state == EngineState::kReady);

  const auto lifecycle = client->call(
      0, "collective_rpc", args(R"(["start_weight_update",null,[],{}])"), CallOptions{200ms, true});
  REQUIRE_FALSE(lifecycle.value);
  CHECK(lifecycle.value.error().kind == CallErrorKind::kTimeout);
  CHECK(client->engines()[0].state == EngineState::kDead);
  // The engine answers the timed-out calls after its delay: it is alive again.
  CHECK(client->wait_all_ready(10s));
  CHECK(no_call_pending(*client));
}

TEST_CASE("an older engine: empty registration, READY before registration, 5-field replies") {
  vllmd::engine::ClientOptions options;
  options.handshake_address = "ipc:///tmp/vllmd-test-" + std::to_string(::getpid()) + "-hs";
  auto created = EngineClient::create(options);
  REQUIRE_MESSAGE(created, (created ? "" : created.error()));
  auto& client = *created;
  CHECK(client->input_endpoint() == options.handshake_address + ".input");
  ChildProcess engine({VLLM_REF_ENGINE_PATH, "--handshake", client->handshake_endpoint(), "--rank",
                       "0", "--empty-registration", "--ready-first", "--reply-fields", "5"});
  REQUIRE(client->wait_all_ready(20s));
  CHECK(client->engines()[0].registration.empty);
  const auto reply = client->call(0, "get_weight_version", args("[]"), kQuick);
  CHECK(as_json(reply) == R"("default")");
}

TEST_CASE("calls to an engine that never connected fail at once as unavailable") {
  vllmd::engine::ClientOptions options;
  auto created = EngineClient::create(options);
  REQUIRE(created);
  const auto started = std::chrono::steady_clock::now();
  const auto reply = (*created)->call(0, "get_weight_version", args("[]"), kQuick);
  CHECK(std::chrono::steady_clock::now() - started < 500ms);
  REQUIRE_FALSE(reply.value);
  CHECK(reply.value.error().kind == CallErrorKind::kUnavailable);
  CHECK(reply.value.error().message.find("waiting") != std::string::npos);
}

TEST_CASE("a TCP client probing the handshake port is never taken for the engine") {
  // libzmq gives the engine's handshake connection the fd the prober's connection just freed.
  // With the IO thread busy meanwhile, the prober's DISCONNECTED event and the engine's HELLO
  // wait for the same round: the event happened first, and must not end the engine's handshake.
  vllmd::engine::ClientOptions options;
  auto created = EngineClient::create(options);
  REQUIRE(created);
  auto& client = *created;
  const std::string& endpoint = client->handshake_endpoint();
  const std::string port = endpoint.substr(endpoint.rfind(':') + 1);

  // A completion runs on the IO thread: this one keeps it busy until released.
  std::atomic<bool> busy{false};
  std::atomic<bool> release{false};
  client->call_all_async("get_weight_version", args("[]"), kQuick,
                         [&](const std::vector<EngineReply>&) {
                           busy = true;
                           while (!release) std::this_thread::sleep_for(5ms);
                         });
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!busy && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  REQUIRE(busy);

  // Out of process, so that only the accepted side of its connection takes an fd here.
  ChildProcess prober({"/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/" + port + "; exec 3<&-"});
  REQUIRE(prober.wait(5s) == 0);
  std::this_thread::sleep_for(100ms);  // libzmq's own thread sees the hang-up, frees the fd
  ChildProcess engine({VLLM_REF_ENGINE_PATH, "--handshake", endpoint, "--rank", "0"});
  std::this_thread::sleep_for(300ms);  // its HELLO now waits behind the prober's events
  release = true;
  CHECK(client->wait_all_ready(10s));
  CHECK(client->engines()[0].admissions == 1);
}
