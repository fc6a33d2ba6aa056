// Generations through EngineClient (client_requests.cpp) against fake engines made of raw
// ZeroMQ sockets: the ADD on the wire, outputs demultiplexed to each request's sink (logprobs
// in extra frames included), aborts, engines lost mid-request, balancing and pinning, and the
// liveness probe held back by outputs.

#include <doctest/doctest.h>

#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/engine/client.hpp"
#include "common/engine/client_impl.hpp"
#include "common/wire/generation_output.hpp"
#include "common/wire/generation_request.hpp"
#include "tests/unit/engine/fake_engine.hpp"

namespace {

using namespace std::chrono_literals;
using vllmd::engine::ClientOptions;
using vllmd::engine::Closed;
using vllmd::engine::EngineClient;
using vllmd::engine::EngineState;
using vllmd::engine::Generation;
using vllmd::engine::RequestSink;
using vllmd::test::eventually;
using vllmd::test::FakeEngine;
using vllmd::test::make_client;
namespace wire = vllmd::wire;

// What a sink heard, copied out of the views while they are valid.
class RecordingSink final : public RequestSink {
 public:
  void on_sent(int rank) override {
    std::lock_guard lock(mutex_);
    rank_ = rank;
  }
  void on_output(const wire::OutputView& output) override {
    std::lock_guard lock(mutex_);
    CHECK_FALSE(ended_);
    for (const std::int64_t token : output.new_token_ids) tokens_.push_back(token);
    if (output.logprobs) {
      for (std::size_t i = 0; i < output.logprobs->token_ids.size(); ++i) {
        logprobs_.push_back(output.logprobs->logprobs.real(i));
      }
    }
    if (output.finish_reason) {
      finish_ = output.finish_reason;
      ended_ = true;
    }
  }
  void on_closed(Closed why, std::string_view message) override {
    std::lock_guard lock(mutex_);
    CHECK_FALSE(ended_);
    closed_ = why;
    message_ = message;
    ended_ = true;
  }

  bool ended() const {
    std::lock_guard lock(mutex_);
    return ended_;
  }
  std::vector<std::int64_t> tokens() const {
    std::lock_guard lock(mutex_);
    return tokens_;
  }
  std::vector<double> logprobs() const {
    std::lock_guard lock(mutex_);
    return logprobs_;
  }
  std::optional<std::int64_t> finish() const {
    std::lock_guard lock(mutex_);
    return finish_;
  }
  std::optional<Closed> closed() const {
    std::lock_guard lock(mutex_);
    return closed_;
  }
  std::string message() const {
    std::lock_guard lock(mutex_);
    return message_;
  }
  std::optional<int> rank() const {
    std::lock_guard lock(mutex_);
    return rank_;
  }

 private:
  mutable std::mutex mutex_;
  std::optional<int> rank_;
  std::vector<std::int64_t> tokens_;
  std::vector<double> logprobs_;
  std::optional<std::int64_t> finish_;
  std::optional<Closed> closed_;
  std::string message_;
  bool ended_ = false;
};

wire::EngineCoreRequest request(std::string id) {
  wire::EngineCoreRequest request;
  request.request_id = std::move(id);
  request.prompt_token_ids = {1, 2, 3};
  request.sampling_params = wire::SamplingParams{};
  request.sampling_params->max_tokens = 4;
  request.arrival_time = 1.5;
  return request;
}

std::shared_ptr<RecordingSink> generate(EngineClient& client, std::string id,
                                        std::optional<int> rank = std::nullopt) {
  auto sink = std::make_shared<RecordingSink>();
  client.generate(Generation{request(std::move(id)), rank, sink, {}});
  return sink;
}

wire::OutputToSend step(std::string id, std::vector<std::int64_t> tokens,
                        std::optional<wire::FinishReason> finish = std::nullopt) {
  wire::OutputToSend output;
  output.request_id = std::move(id);
  output.new_token_ids = std::move(tokens);
  output.finish_reason = finish;
  return output;
}

std::vector<std::string> message(std::vector<wire::OutputToSend> outputs, int engine_index = 0,
                                 std::size_t threshold = 256) {
  wire::OutputsToSend message;
  message.engine_index = engine_index;
  message.outputs = std::move(outputs);
  return wire::encode_outputs(message, {.zero_copy_threshold = threshold});
}

// The ADD the engine received next, decoded.
wire::EngineCoreRequest next_add(
    FakeEngine& engine, const wire::RequestLayout& layout = wire::newest_request_layout()) {
  auto received = engine.next_message(5s);
  REQUIRE(received);
  REQUIRE(received->first == wire::RequestType::kAdd);
  auto decoded = wire::decode_engine_core_request(received->second, layout);
  REQUIRE(decoded);
  return *decoded;
}

struct Attached {
  explicit Attached(ClientOptions options = {}, int engines = 1)
      : client([&] {
          options.data_parallel_size = engines;
          return make_client(std::move(options));
        }()) {
    for (int rank = 0; rank < engines; ++rank) {
      fakes.push_back(std::make_unique<FakeEngine>(*client, rank));
      fakes.back()->start();
    }
    REQUIRE(client->wait_all_ready(5s));
  }
  std::unique_ptr<EngineClient> client;
  std::vector<std::unique_ptr<FakeEngine>> fakes;
};

}  // namespace

TEST_CASE("an ADD reaches the engine, and its outputs reach the sink step by step") {
  Attached link;
  auto sink = generate(*link.client, "req-a");
  CHECK(next_add(*link.fakes[0]) == request("req-a"));
  CHECK(eventually([&] { return sink->rank() == 0; }));
  CHECK(link.client->pending_calls() == 0);  // a generation is no utility call
  CHECK(link.client->loads()[0].requests_in_flight == 1);

  link.fakes[0]->send_frames(message({step("req-a", {7})}));
  link.fakes[0]->send_frames(message({step("req-a", {8, 9})}));
  // The last step's logprobs in extra frames (threshold 1), as a real engine sends large ones.
  wire::OutputToSend last = step("req-a", {10}, wire::FinishReason::kLength);
  last.logprobs = wire::LogprobRows{1, 2, {10, 11}, {-0.5F, -1.5F}, {1}};
  const auto frames = message({last}, 0, 1);
  REQUIRE(frames.size() == 4);
  link.fakes[0]->send_frames(frames);
  REQUIRE(eventually([&] { return sink->ended(); }));
  CHECK(sink->tokens() == std::vector<std::int64_t>{7, 8, 9, 10});
  CHECK(sink->finish() == 1);
  CHECK(sink->logprobs() == std::vector<double>{-0.5, -1.5});
  CHECK(eventually([&] { return link.client->loads()[0].requests_in_flight == 0; }));
}

TEST_CASE("outputs for ids not in flight are dropped; requests are told apart by id") {
  Attached link;
  auto first = generate(*link.client, "one");
  auto second = generate(*link.client, "two");
  (void)next_add(*link.fakes[0]);
  (void)next_add(*link.fakes[0]);
  link.fakes[0]->send_frames(message(
      {step("stranger", {1}), step("two", {5}), step("one", {4}, wire::FinishReason::kStop)}));
  REQUIRE(eventually([&] { return first->ended(); }));
  // Outputs after the finish, and for an id never sent, go nowhere.
  link.fakes[0]->send_frames(
      message({step("one", {99}), step("two", {6}, wire::FinishReason::kLength)}));
  REQUIRE(eventually([&] { return second->ended(); }));
  CHECK(first->tokens() == std::vector<std::int64_t>{4});
  CHECK(first->finish() == 0);
  CHECK(second->tokens() == std::vector<std::int64_t>{5, 6});
}

TEST_CASE("abort closes the sink at once and sends the engine one ABORT with the ids") {
  Attached link;
  auto a = generate(*link.client, "a");
  auto b = generate(*link.client, "b");
  auto c = generate(*link.client, "c");
  for (int i = 0; i < 3; ++i) (void)next_add(*link.fakes[0]);
  link.client->abort({"a", "c", "never-sent"});
  REQUIRE(eventually([&] { return a->ended() && c->ended(); }));
  CHECK(a->closed() == Closed::kAborted);
  CHECK(c->closed() == Closed::kAborted);
  auto abort = link.fakes[0]->next_message(5s);
  REQUIRE(abort);
  CHECK(abort->first == wire::RequestType::kAbort);
  CHECK(wire::decode_abort(abort->second).value() == std::vector<std::string>{"a", "c"});
  // b goes on; a late output for a is dropped.
  link.fakes[0]->send_frames(message({step("a", {1}), step("b", {2}, wire::FinishReason::kStop)}));
  REQUIRE(eventually([&] { return b->ended(); }));
  CHECK(a->tokens().empty());
  CHECK(b->tokens() == std::vector<std::int64_t>{2});
}

TEST_CASE("an engine's death ends its requests, and a duplicate id or a bad rank is refused") {
  Attached link;
  auto sink = generate(*link.client, "x");
  (void)next_add(*link.fakes[0]);
  auto duplicate = generate(*link.client, "x");
  REQUIRE(eventually([&] { return duplicate->ended(); }));
  CHECK(duplicate->closed() == Closed::kRefused);
  CHECK(duplicate->message().find("already in flight") != std::string::npos);
  auto out_of_range = generate(*link.client, "y", 3);
  REQUIRE(eventually([&] { return out_of_range->ended(); }));
  CHECK(out_of_range->closed() == Closed::kRefused);
  CHECK(out_of_range->message().find("out of range") != std::string::npos);

  link.fakes[0]->send_output(std::string(wire::kEngineCoreDead));
  REQUIRE(eventually([&] { return sink->ended(); }));
  CHECK(sink->closed() == Closed::kEngineLost);
  CHECK(sink->message().find("engine rank 0 is dead") != std::string::npos);
  // With no engine ready, a new request is refused at once rather than left waiting.
  auto late = generate(*link.client, "z");
  REQUIRE(eventually([&] { return late->ended(); }));
  CHECK(late->closed() == Closed::kRefused);
  CHECK(late->message().find("no engine is ready") != std::string::npos);
}

TEST_CASE("requests go to the least loaded engine, by in-flight count and scheduler stats") {
  Attached link({}, 2);
  auto first = generate(*link.client, "r0");
  CHECK(next_add(*link.fakes[0]).request_id == "r0");  // a tie: the lower rank
  auto second = generate(*link.client, "r1");
  CHECK(next_add(*link.fakes[1]).request_id == "r1");
  // Rank 1 reports a long queue: the next two go to rank 0.
  wire::OutputsToSend stats;
  stats.engine_index = 1;
  stats.scheduler_stats = wire::SchedulerStats{4, 6};
  link.fakes[1]->send_frames(wire::encode_outputs(stats));
  REQUIRE(eventually([&] { return link.client->loads()[1].waiting == 6; }));
  auto third = generate(*link.client, "r2");
  CHECK(next_add(*link.fakes[0]).request_id == "r2");
  // Pinned to rank 1 whatever its load.
  auto pinned = generate(*link.client, "r3", 1);
  CHECK(next_add(*link.fakes[1]).request_id == "r3");
  CHECK(eventually([&] { return pinned->rank() == 1; }));
  CHECK(vllmd::engine::load_score({0, 2, 0, 0}) == 2);
  CHECK(vllmd::engine::load_score({1, 2, 4, 6}) == 28);
}

TEST_CASE("outputs count as signs of life: a streaming engine is not probed") {
  ClientOptions options;
  options.probe_interval = 400ms;
  options.probe_timeout = 5s;
  Attached link(options);
  auto sink = generate(*link.client, "s");
  (void)next_add(*link.fakes[0]);
  // 1.2 s of outputs every 40 ms: idle, the engine would have had two or three probes.
  int probes = 0;
  for (int i = 0; i < 30; ++i) {
    link.fakes[0]->send_frames(message({step("s", {i})}));
    if (auto received = link.fakes[0]->next_message(40ms)) {
      probes += received->first == wire::RequestType::kUtility ? 1 : 0;
    }
  }
  CHECK(probes == 0);
  CHECK(link.client->engines()[0].state == EngineState::kReady);
  CHECK(eventually([&] { return sink->tokens().size() == 30; }));
  // Idle again, it is probed.
  auto probe = link.fakes[0]->next_message(2s);
  REQUIRE(probe);
  CHECK(probe->first == wire::RequestType::kUtility);
}

TEST_CASE("the ADD follows the layout of the engine's registered vLLM version") {
  auto client = make_client();
  FakeEngine engine(*client);
  engine.vllm_version = "0.19.1";
  engine.start();
  REQUIRE(client->wait_all_ready(5s));
  auto sink = std::make_shared<RecordingSink>();
  wire::EngineCoreRequest sent = request("old");
  sent.priority = 2;
  client->generate(Generation{sent, std::nullopt, sink, {}});
  const wire::RequestLayout& older = wire::request_layout_for(std::string("0.19.1"));
  CHECK(older.name == "2025");
  CHECK(next_add(engine, older) == sent);
}

namespace {

// Notes, in one list shared by several sinks, which sink heard an output when.
// What the OrderSinks of a test heard, in order, from the IO thread.
struct Heard {
  std::mutex mutex;
  std::vector<std::string> names;

  void add(std::string name) {
    std::lock_guard lock(mutex);
    names.push_back(std::move(name));
  }
  std::vector<std::string> now() {
    std::lock_guard lock(mutex);
    return names;
  }
};

class OrderSink final : public RequestSink {
 public:
  // `on_output` runs first on each output (on the IO thread), as a caller's code would.
  OrderSink(std::string name, Heard& heard, bool record_sent = false,
            std::function<void()> on_output = nullptr)
      : name_(std::move(name)), heard_(heard), record_sent_(record_sent),
        on_output_(std::move(on_output)) {}
  void on_sent(int /*rank*/) override {
    if (record_sent_) heard_.add(name_ + " sent");
  }
  void on_output(const wire::OutputView& /*output*/) override {
    if (on_output_) std::exchange(on_output_, nullptr)();
    heard_.add(name_);
  }
  void on_closed(Closed /*why*/, std::string_view /*message*/) override {}

 private:
  std::string name_;
  Heard& heard_;
  bool record_sent_;
  std::function<void()> on_output_;
};

}  // namespace

TEST_CASE("a request's first output is handed on before the step's other deltas") {
  Attached link;
  Heard heard;
  link.client->generate(
      Generation{request("old"), std::nullopt, std::make_shared<OrderSink>("old", heard), {}});
  (void)next_add(*link.fakes[0]);
  link.fakes[0]->send_frames(message({step("old", {1})}));
  REQUIRE(eventually([&] { return heard.now().size() == 1; }));
  link.client->generate(
      Generation{request("new"), std::nullopt, std::make_shared<OrderSink>("new", heard), {}});
  (void)next_add(*link.fakes[0]);
  // The engine lists the running request first, as its batch holds it; the new one's first
  // token still goes out ahead.
  link.fakes[0]->send_frames(message({step("old", {2}), step("new", {9})}));
  REQUIRE(eventually([&] { return heard.now().size() == 3; }));
  CHECK(heard.now() == std::vector<std::string>{"old", "new", "old"});
}

TEST_CASE("an ADD that comes while a step's outputs are handed on goes out before they are") {
  Attached link;
  Heard heard;
  // r0's first output stands for a request that another thread submits mid-step.
  const auto submit_late = [&] {
    link.client->generate(Generation{
        request("late"), std::nullopt, std::make_shared<OrderSink>("late", heard, true), {}});
  };
  link.client->generate(Generation{request("r0"),
                                   std::nullopt,
                                   std::make_shared<OrderSink>("r0", heard, false, submit_late),
                                   {}});
  (void)next_add(*link.fakes[0]);
  constexpr std::size_t kRunning = 300;
  std::vector<wire::OutputToSend> firsts;
  std::vector<wire::OutputToSend> seconds;
  for (std::size_t i = 1; i < kRunning; ++i) {
    const std::string id = "r" + std::to_string(i);
    link.client->generate(
        Generation{request(id), std::nullopt, std::make_shared<OrderSink>(id, heard), {}});
    (void)next_add(*link.fakes[0]);
    firsts.push_back(step(id, {1}));
    seconds.push_back(step(id, {2}));
  }
  link.fakes[0]->send_frames(message(std::move(firsts)));
  REQUIRE(eventually([&] { return heard.now().size() == kRunning - 1; }));
  seconds.push_back(step("r0", {1}));
  link.fakes[0]->send_frames(message(std::move(seconds)));
  CHECK(next_add(*link.fakes[0]).request_id == "late");
  REQUIRE(eventually([&] { return heard.now().size() == 2 * kRunning; }));
  // The late ADD went out after r0's first output and before the step's 299 other deltas.
  const std::vector<std::string> all = heard.now();
  CHECK(all[kRunning - 1] == "r0");
  CHECK(all[kRunning] == "late sent");
  CHECK(all.back() == "r" + std::to_string(kRunning - 1));
}
