// EngineClient against an in-test engine made of raw ZeroMQ sockets, so that every frame and
// every connection drop is the test's to choose: unsolicited utility outputs, the incarnation
// guard, liveness probes, a dropped and reconnected input connection, the startup timeout.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/engine/client.hpp"
#include "common/engine/client_impl.hpp"
#include "common/wire/messages.hpp"
#include "common/wire/msgpack_to_json.hpp"
#include "tests/unit/engine/fake_engine.hpp"

namespace {

using namespace std::chrono_literals;
using vllmd::engine::CallErrorKind;
using vllmd::engine::CallOptions;
using vllmd::engine::ClientOptions;
using vllmd::engine::EngineClient;
using vllmd::engine::EngineReply;
using vllmd::engine::EngineState;
using vllmd::engine::EngineStatus;
namespace wire = vllmd::wire;
using vllmd::test::eventually;
using vllmd::test::FakeEngine;
using vllmd::test::make_client;

const std::string kNoArgs = "\x90";
const EngineClient::ArgParts kEmptyArgs = {kNoArgs};

// A client with one fake engine attached and ready.
struct Attached {
  explicit Attached(ClientOptions options = {})
      : client(make_client(std::move(options))), engine(*client) {
    engine.start();
    REQUIRE(client->wait_all_ready(5s));
  }
  std::unique_ptr<EngineClient> client;
  FakeEngine engine;
};

// A blocking call on its own thread, so the test can play the engine meanwhile.
class CallInFlight {
 public:
  CallInFlight(EngineClient& client, std::string method, const CallOptions& options = {5s, false})
      : thread_([&client, method = std::move(method), options, this] {
          reply_ = client.call(0, method, kEmptyArgs, options);
        }) {}
  ~CallInFlight() {
    if (thread_.joinable()) thread_.join();
  }
  EngineReply result() {
    thread_.join();
    return *reply_;
  }

 private:
  std::optional<EngineReply> reply_;
  std::thread thread_;
};

EngineState state_of(const EngineClient& client) { return client.engines()[0].state; }

wire::CallId signed_id(std::int64_t id) { return {static_cast<std::uint64_t>(id), id < 0}; }

}  // namespace

TEST_CASE("call ids -1 (EEP notification) and -2 (FT status) are unsolicited, others are not") {
  CHECK(vllmd::engine::is_unsolicited(signed_id(-1)));
  CHECK(vllmd::engine::is_unsolicited(signed_id(-2)));
  CHECK_FALSE(vllmd::engine::is_unsolicited(signed_id(-3)));
  CHECK_FALSE(vllmd::engine::is_unsolicited({1, false}));
  CHECK_FALSE(vllmd::engine::is_unsolicited({static_cast<std::uint64_t>(-1), false}));  // 2^64-1
}

TEST_CASE("unsolicited utility outputs are ignored and leave the call waiting for its reply") {
  Attached link;
  auto& client = link.client;
  auto& engine = link.engine;

  CallInFlight call(*client, "get_weight_version");
  const auto request = engine.next_call(5s);
  REQUIRE(request);
  for (const std::int64_t id : {-1, -2}) {
    wire::UtilityOutput unsolicited;
    unsolicited.call_id = signed_id(id);
    unsolicited.failure_message = "not a reply";
    engine.send_output(wire::encode_engine_core_outputs(0, unsolicited, 1.0, 8));
    engine.reply(signed_id(id), "\x81\xa5state\xa2ok");  // a status map, as FT sends
  }
  engine.reply(request->call_id,
               "\xa7"
               "default");
  const EngineReply reply = call.result();
  REQUIRE(reply.value);
  CHECK(vllmd::wire::msgpack_to_json(*reply.value).value() == R"("default")");
  CHECK(state_of(*client) == EngineState::kReady);
  CHECK(eventually([&] { return client->pending_calls() == 0; }));
}

TEST_CASE("a call for a stale incarnation fails at once and never reaches the engine") {
  // Declared before the client, so destroyed after it: the client's thread calls the listener
  // until the client is gone (the engines' disconnection at the end of the test, too).
  std::mutex mutex;
  std::vector<std::pair<EngineState, std::uint64_t>> seen;
  auto client = make_client();
  client->set_state_listener([&](const EngineStatus& status) {
    std::lock_guard lock(mutex);
    seen.emplace_back(status.state, status.incarnation);
  });
  auto first = std::make_unique<FakeEngine>(*client);
  first->start();
  REQUIRE(client->wait_all_ready(5s));
  CHECK(client->engines()[0].incarnation == 1);

  first.reset();  // the process is gone; a new one says HELLO under the same rank
  FakeEngine second(*client);
  second.start();
  REQUIRE(eventually([&] { return client->engines()[0].incarnation == 2 && client->all_ready(); }));

  const auto started = std::chrono::steady_clock::now();
  const EngineReply stale = client->call(0, "get_weight_version", kEmptyArgs, {5s, false, {1}});
  CHECK(std::chrono::steady_clock::now() - started < 500ms);
  REQUIRE_FALSE(stale.value);
  CHECK(stale.value.error().kind == CallErrorKind::kUnavailable);
  CHECK(stale.value.error().message == "engine rank 0 restarted (incarnation 1, now 2)");
  CHECK_FALSE(second.next_call(300ms));

  CallInFlight current(*client, "get_weight_version", {5s, false, {2}});
  const auto request = second.next_call(5s);
  REQUIRE(request);
  second.reply(request->call_id);
  CHECK(current.result().value);

  std::lock_guard lock(mutex);
  REQUIRE(seen.size() >= 4);
  CHECK(seen.front() == std::pair{EngineState::kHandshaking, std::uint64_t{0}});
  CHECK(seen.back() == std::pair{EngineState::kReady, std::uint64_t{2}});
}

TEST_CASE("a liveness probe that times out marks the engine dead; its late answer revives it") {
  ClientOptions options;
  options.probe_interval = 100ms;
  options.probe_timeout = 300ms;
  Attached link(options);
  auto& client = link.client;
  auto& engine = link.engine;

  const auto probe = engine.next_call(2s);
  REQUIRE(probe);
  CHECK(probe->method == "is_scheduler_paused");
  CHECK(probe->args_msgpack == kNoArgs);
  CHECK(client->pending_calls() == 0);  // probes are not callers' calls
  REQUIRE(eventually([&] { return state_of(*client) == EngineState::kDead; }));
  CHECK(client->engines()[0].reason == "not answering: liveness probe timed out after 0.3 s");
  const EngineReply refused = client->call(0, "get_weight_version", kEmptyArgs, {5s, false});
  REQUIRE_FALSE(refused.value);
  CHECK(refused.value.error().message.find("liveness probe timed out") != std::string::npos);

  engine.reply(probe->call_id, "\xc2");
  CHECK(eventually([&] { return state_of(*client) == EngineState::kReady; }));
  CHECK(client->engines()[0].incarnation == 1);  // the same process
}

TEST_CASE("no probe while a call is in flight; probes resume when the engine is idle") {
  ClientOptions options;
  options.probe_interval = 100ms;
  Attached link(options);
  auto& client = link.client;
  auto& engine = link.engine;

  CallInFlight call(*client, "get_weight_version");
  const auto request = engine.next_call(5s);
  REQUIRE(request);
  REQUIRE(request->method == "get_weight_version");
  CHECK(eventually([&] { return client->pending_calls() == 1; }));
  CHECK_FALSE(engine.next_call(500ms));  // five probe intervals, and no probe
  engine.reply(request->call_id);
  CHECK(call.result().value);

  const auto probe = engine.next_call(2s);
  REQUIRE(probe);
  CHECK(probe->method == "is_scheduler_paused");
}

TEST_CASE("a dropped input connection: disconnected, calls fail at once, ready after reconnect") {
  ClientOptions options;
  options.probe_interval = 0ms;  // reconnect probes run all the same
  Attached link(options);
  auto& client = link.client;
  auto& engine = link.engine;

  CallInFlight pending(*client, "get_weight_version", {30s, false});
  REQUIRE(engine.next_call(5s));
  engine.drop_input();
  const EngineReply failed = pending.result();
  REQUIRE_FALSE(failed.value);
  CHECK(failed.value.error().kind == CallErrorKind::kUnavailable);
  CHECK(failed.value.error().message.starts_with("engine rank 0 is disconnected"));
  CHECK(state_of(*client) == EngineState::kDisconnected);

  const auto started = std::chrono::steady_clock::now();
  const EngineReply refused = client->call(0, "get_weight_version", kEmptyArgs, {5s, false});
  CHECK(std::chrono::steady_clock::now() - started < 500ms);
  REQUIRE_FALSE(refused.value);
  CHECK(refused.value.error().message.starts_with("engine rank 0 is disconnected"));

  engine.connect_input();
  const auto probe = engine.next_call(3s);
  REQUIRE(probe);
  CHECK(probe->method == "is_scheduler_paused");
  engine.reply(probe->call_id, "\xc2");
  REQUIRE(eventually([&] { return state_of(*client) == EngineState::kReady; }));
  const auto status = client->engines()[0];
  CHECK(status.incarnation == 1);
  CHECK(status.admissions == 1);

  CallInFlight again(*client, "get_weight_version");
  auto request = engine.next_call(5s);
  while (request && request->method == "is_scheduler_paused") request = engine.next_call(5s);
  REQUIRE(request);
  engine.reply(request->call_id);
  CHECK(again.result().value);
}

TEST_CASE("past the startup timeout an engine reads as dead, and a late READY is admitted") {
  ClientOptions options;
  options.startup_timeout = 200ms;
  auto client = make_client(options);
  FakeEngine engine(*client);
  engine.hello();
  REQUIRE(eventually([&] { return state_of(*client) == EngineState::kHandshaking; }));
  CHECK(vllmd::engine::state_name(EngineState::kHandshaking) == "loading");
  REQUIRE(eventually([&] { return state_of(*client) == EngineState::kDead; }));
  CHECK(client->engines()[0].reason == "no READY within 0.2 s");

  engine.register_and_ready();
  REQUIRE(client->wait_all_ready(5s));
  CHECK(client->engines()[0].incarnation == 1);
}

TEST_CASE("mark_dead from outside fails the engine's pending call") {
  Attached link;
  auto& client = link.client;
  auto& engine = link.engine;
  CallInFlight pending(*client, "get_weight_version", {30s, false});
  REQUIRE(engine.next_call(5s));
  client->mark_dead(0, "managed engine process exited");
  const EngineReply failed = pending.result();
  REQUIRE_FALSE(failed.value);
  CHECK(failed.value.error().message == "engine rank 0 is dead: managed engine process exited");
  CHECK(state_of(*client) == EngineState::kDead);
}
