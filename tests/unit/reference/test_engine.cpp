// ReferenceEngine against a minimal in-test frontend made of raw ZeroMQ sockets: the
// handshake, UTILITY calls and every injected fault. Loopback, port 0, short timeouts.

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/reference/frontend.hpp"

using namespace std::chrono_literals;
using namespace vllmd::test;
using vllmd::reference::ReceivedCall;

TEST_SUITE("reference_engine") {
  TEST_CASE("handshake, registration and utility calls") {
    Frontend frontend;
    auto options = options_for(frontend);
    options.rank = 1;
    options.data_parallel_size = 2;
    options.tensor_parallel_size = 2;
    options.vllm_version = "0.99.0";
    ReferenceEngine engine(options);
    engine.start();

    auto registration = wire::decode_registration(frontend.connect(1));
    REQUIRE(registration);
    CHECK_FALSE(registration->empty);
    CHECK(registration->world_size == 2);
    CHECK(registration->data_parallel_size == 1);  // a dense rank: DP collapsed to 1
    CHECK(registration->tensor_parallel_size == 2);
    CHECK(registration->pipeline_parallel_size == 1);
    CHECK(registration->decode_context_parallel_size == 1);
    CHECK(registration->data_parallel_rank == 1);
    CHECK(registration->vllm_version == "0.99.0");
    CHECK(registration->weight_transfer_backend == "nccl");
    CHECK(registration->supports_draft_weight_updates == true);

    frontend.call(3, "get_weight_version", "[]");
    auto frame = frontend.reply_frame();
    REQUIRE(frame);
    CHECK(field_count(*frame) == 8);  // every field, as msgspec writes them
    auto outputs = wire::decode_engine_core_outputs(*frame);
    REQUIRE(outputs);
    CHECK(outputs->engine_index == 1);
    REQUIRE(outputs->utility_output);
    CHECK(outputs->utility_output->call_id == wire::CallId{3, false});
    CHECK_FALSE(outputs->utility_output->failure_message);
    CHECK(json(outputs->utility_output->value_msgpack) == "\"default\"");

    // Python's random 64-bit call ids come back unchanged.
    frontend.call(UINT64_MAX, "collective_rpc", R"(["start_weight_update",null,[],{}])");
    auto started = frontend.reply();
    CHECK(started.call_id == wire::CallId{UINT64_MAX, false});
    CHECK(json(started.value_msgpack) == "[null,null]");

    frontend.call(5, "collective_rpc", R"(["start_weight_update",null,[],{}])");
    auto again = frontend.reply();
    REQUIRE(again.failure_message);
    CHECK(*again.failure_message ==
          "Call to collective_rpc method failed: Worker failed with error 'start_weight_update "
          "called while a weight update is already active. Call finish_weight_update first.', "
          "please check the stack trace above for the root cause");

    frontend.call(6, "no_such_method", "[]");
    auto unknown = frontend.reply();
    CHECK(unknown.failure_message ==
          "Call to no_such_method method failed: 'EngineCore' object has no attribute "
          "'no_such_method'");

    engine.stop();
    CHECK_FALSE(engine.running());
    CHECK(engine.error().empty());
  }

  TEST_CASE("READY may precede the registration; older engines register empty") {
    Frontend frontend;
    auto options = options_for(frontend);
    options.faults.ready_before_registration = true;
    options.faults.empty_registration = true;
    options.backend = vllmd::reference::Backend::kNone;
    ReferenceEngine engine(options);
    engine.start();
    const std::string registration = frontend.connect();
    CHECK(registration.empty());
    auto decoded = wire::decode_registration(registration);
    REQUIRE(decoded);
    CHECK(decoded->empty);

    frontend.call(1, "is_scheduler_paused", "[]");
    CHECK(json(frontend.reply().value_msgpack) == "false");
  }

  TEST_CASE("backend none registers a nil weight_transfer_backend") {
    Frontend frontend;
    auto options = options_for(frontend);
    options.backend = vllmd::reference::Backend::kNone;
    ReferenceEngine engine(options);
    engine.start();
    auto registration = wire::decode_registration(frontend.connect());
    REQUIRE(registration);
    CHECK_FALSE(registration->empty);
    CHECK_FALSE(registration->weight_transfer_backend);
  }

  TEST_CASE("other request types and extra frames are ignored; calls are recorded") {
    Frontend frontend;
    auto options = options_for(frontend);
    std::vector<ReceivedCall> calls;
    std::mutex calls_mutex;
    options.on_call = [&](const ReceivedCall& call) {
      std::lock_guard lock(calls_mutex);
      calls.push_back(call);
    };
    ReferenceEngine engine(options);
    engine.start();
    frontend.connect();

    Frontend::send(frontend.input, {frontend.identity, std::string(1, '\x01'), "junk"});
    auto args = wire::json_to_msgpack(R"(["finish_weight_update",null,[],null])");
    REQUIRE(args);
    Frontend::send(frontend.input, {frontend.identity, std::string(1, '\x03'),
                                    wire::encode_utility_request(0, {7, false}, "collective_rpc",
                                                                 args->msgpack.view()),
                                    "aux frame"});
    auto reply = frontend.reply();
    CHECK(reply.call_id == wire::CallId{7, false});
    CHECK(reply.failure_message ==
          "Call to collective_rpc method failed: finish_weight_update called without a matching "
          "start_weight_update.");

    std::lock_guard lock(calls_mutex);
    // The malformed ABORT is recorded as received, and ignored.
    REQUIRE(calls.size() == 2);
    CHECK(calls[0].method == "ABORT");
    CHECK(calls[0].args_msgpack == "junk");
    CHECK(calls[1].method == "collective_rpc");
    CHECK(calls[1].worker_method == "finish_weight_update");
    CHECK(calls[1].args_msgpack == args->msgpack.str());
  }

  TEST_CASE("injected failure, keyed by worker method or engine method") {
    Frontend frontend;
    auto options = options_for(frontend);
    options.faults.fail = {"update_weights", "get_weight_version"};
    ReferenceEngine engine(options);
    engine.start();
    frontend.connect();

    frontend.call(1, "collective_rpc", R"(["update_weights",null,[],{"update_info":{}}])");
    CHECK(frontend.reply().failure_message ==
          "Call to collective_rpc method failed: injected failure in update_weights");
    frontend.call(2, "get_weight_version", "[]");
    CHECK(frontend.reply().failure_message ==
          "Call to get_weight_version method failed: injected failure in get_weight_version");
    frontend.call(3, "collective_rpc", R"(["start_weight_update",null,[],{}])");
    CHECK_FALSE(frontend.reply().failure_message);
  }

  TEST_CASE("5-field replies on request, as older peers wrote them") {
    Frontend frontend;
    auto options = options_for(frontend);
    options.faults.reply_fields = 5;
    ReferenceEngine engine(options);
    engine.start();
    frontend.connect();
    frontend.call(2, "set_weight_version", R"(["step-42"])");
    auto frame = frontend.reply_frame();
    REQUIRE(frame);
    CHECK(field_count(*frame) == 5);
    auto outputs = wire::decode_engine_core_outputs(*frame);
    REQUIRE(outputs);
    REQUIRE(outputs->utility_output);
    CHECK(json(outputs->utility_output->value_msgpack) == "null");
  }

  TEST_CASE("send_dead sends ENGINE_CORE_DEAD, then the engine exits") {
    Frontend frontend;
    auto options = options_for(frontend);
    options.faults.send_dead = {"finish_weight_update"};
    ReferenceEngine engine(options);
    engine.start();
    frontend.connect();
    frontend.call(1, "collective_rpc", R"(["finish_weight_update",null,[],null])");
    auto frame = frontend.reply_frame();
    REQUIRE(frame);
    CHECK(*frame == wire::kEngineCoreDead);
    CHECK(wait_until_stopped(engine));
    CHECK(engine.error().empty());
  }

  TEST_CASE("exit_silently exits without a reply and calls on_fault_exit") {
    Frontend frontend;
    auto options = options_for(frontend);
    options.faults.exit_silently = {"pause_scheduler"};
    std::atomic<bool> exited{false};
    options.on_fault_exit = [&] { exited = true; };
    ReferenceEngine engine(options);
    engine.start();
    frontend.connect();
    frontend.call(1, "pause_scheduler", R"(["abort",true])");
    CHECK(wait_until_stopped(engine));
    engine.wait();
    CHECK(exited);
    CHECK_FALSE(frontend.reply_frame(200ms));
  }

  TEST_CASE("an injected delay blocks later calls and stop() interrupts it") {
    Frontend frontend;
    auto options = options_for(frontend);
    options.faults.delay = {{"get_weight_version", 150ms}, {"start_weight_update", 1h}};
    ReferenceEngine engine(options);
    engine.start();
    frontend.connect();

    const auto begin = std::chrono::steady_clock::now();
    frontend.call(1, "get_weight_version", "[]");
    frontend.call(2, "is_scheduler_paused", "[]");
    CHECK(frontend.reply().call_id == wire::CallId{1, false});
    CHECK(frontend.reply().call_id == wire::CallId{2, false});  // served strictly in order
    CHECK(std::chrono::steady_clock::now() - begin >= 150ms);

    frontend.call(3, "collective_rpc", R"(["start_weight_update",null,[],{}])");
    std::this_thread::sleep_for(50ms);
    const auto stop_begin = std::chrono::steady_clock::now();
    engine.stop();
    CHECK(std::chrono::steady_clock::now() - stop_begin < 1s);
    CHECK(engine.error().empty());
  }

  TEST_CASE("stop() is prompt while waiting for INIT; a missing INIT times out") {
    Frontend frontend;
    auto options = options_for(frontend);
    {
      ReferenceEngine engine(options);
      engine.start();
      REQUIRE(Frontend::receive(frontend.handshake));  // HELLO, never answered
      const auto begin = std::chrono::steady_clock::now();
      engine.stop();
      CHECK(std::chrono::steady_clock::now() - begin < 1s);
      CHECK(engine.error().empty());
    }
    options.init_timeout = 150ms;
    ReferenceEngine engine(options);
    engine.start();
    CHECK(wait_until_stopped(engine));
    CHECK(engine.error().find("no INIT") != std::string::npos);
  }

  TEST_CASE("a bad INIT ends the engine with an error") {
    Frontend frontend;
    ReferenceEngine engine(options_for(frontend));
    engine.start();
    auto hello = Frontend::receive(frontend.handshake);
    REQUIRE(hello);
    Frontend::send(frontend.handshake, {(*hello)[0], std::string("\x80", 1)});  // empty map
    CHECK(wait_until_stopped(engine));
    CHECK(engine.error().find("bad INIT") != std::string::npos);
  }
}
