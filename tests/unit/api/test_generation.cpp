// GenerationService and its Rollouts (common/api/generation.*, rollout.*): what reaches the
// engines for a request, and how each engine step becomes the client's answer: one body in
// vLLM's Python shape, or SSE events merged while the client has not taken the last one.
// Engines below the EngineRequests interface are a recorder; the outputs they feed are real
// EngineCoreOutputs frames, encoded and decoded by common/wire.

#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/api/generation.hpp"
#include "common/api/table.hpp"
#include "common/wire/generation_output.hpp"
#include "tests/unit/api/fake_engines.hpp"

namespace api = vllmd::api;
namespace engine = vllmd::engine;
namespace wire = vllmd::wire;

namespace {

class RecordingRequests final : public engine::EngineRequests {
 public:
  void generate(engine::Generation generation) override {
    generations.push_back(std::move(generation));
  }
  void generate_all(std::vector<engine::Generation> all) override {
    for (auto& generation : all) generations.push_back(std::move(generation));
  }
  void abort(std::vector<std::string> request_ids) override {
    aborts.insert(aborts.end(), request_ids.begin(), request_ids.end());
  }
  std::vector<engine::EngineLoad> loads() const override { return {}; }

  std::vector<engine::Generation> generations;
  std::vector<std::string> aborts;
};

class RecordingStream final : public api::ResponseStream {
 public:
  void begin(int status, std::string_view content_type) override {
    head = std::to_string(status) + " " + std::string(content_type);
  }
  void write(std::string bytes) override { events.push_back(std::move(bytes)); }
  std::size_t backlog() const override { return pending; }
  bool writable() const override { return pending < 65536; }
  void on_cancel(std::function<void()> cancelled) override { cancel = std::move(cancelled); }
  void abort() override { aborted = true; }

  std::string head;
  std::vector<std::string> events;
  std::size_t pending = 0;
  std::function<void()> cancel;
  bool aborted = false;
};

struct Fixture {
  Fixture() : engines(2), service(requests, engines, model()) {}

  static api::ModelInfo model() {
    api::ModelInfo info;
    info.name = "m";
    info.vocab_size = 1000;
    info.eos_token_id = 2;
    return info;
  }

  // Calls the route with `body`; the response, once Done ran, lands in `responses`.
  std::shared_ptr<RecordingStream> call(api::Operation operation, std::string body,
                                        std::optional<std::string> request_id = std::nullopt,
                                        std::optional<std::string> rank = std::nullopt) {
    auto call = std::make_shared<api::Call>();
    call->route = &api::route_for(operation);
    call->body = std::move(body);
    call->request_id_header = std::move(request_id);
    call->data_parallel_rank_header = std::move(rank);
    auto stream = std::make_shared<RecordingStream>();
    call->stream = stream;
    service.handle(call,
                   [this](api::Response response) { responses.push_back(std::move(response)); });
    return stream;
  }

  // One engine step for the n-th generation sent.
  void step(std::size_t n, wire::OutputToSend output) {
    output.request_id = requests.generations.at(n).request.request_id;
    wire::OutputsToSend message;
    message.outputs.push_back(std::move(output));
    const std::vector<std::string> frames = wire::encode_outputs(message);
    std::vector<std::string_view> views(frames.begin(), frames.end());
    auto decoded = wire::decode_outputs(views);
    REQUIRE(decoded);
    requests.generations.at(n).sink->on_output(decoded->outputs.at(0));
  }

  RecordingRequests requests;
  vllmd::test::FakeEngines engines;
  api::GenerationService service;
  std::vector<api::Response> responses;
};

wire::OutputToSend tokens(std::vector<std::int64_t> ids,
                          std::optional<wire::FinishReason> finish = std::nullopt) {
  wire::OutputToSend output;
  output.new_token_ids = std::move(ids);
  output.finish_reason = finish;
  return output;
}

constexpr std::string_view kPlain = R"({"token_ids":[5,6,7],"sampling_params":{"max_tokens":4}})";

}  // namespace

TEST_CASE("a generation goes to the engines once, under a unique engine id") {
  Fixture f;
  f.call(api::Operation::kGenerate, std::string(kPlain), "abc");
  REQUIRE(f.requests.generations.size() == 1);
  const wire::EngineCoreRequest& request = f.requests.generations[0].request;
  CHECK(request.prompt_token_ids == std::vector<std::int64_t>{5, 6, 7});
  CHECK(request.external_req_id == "generate-tokens-abc");
  CHECK(request.request_id.rfind("generate-tokens-abc-", 0) == 0);
  CHECK(request.request_id.size() == std::string("generate-tokens-abc-").size() + 8);
  CHECK(request.sampling_params->max_tokens == 4);
  CHECK(request.sampling_params->eos_token_id == 2);
  CHECK_FALSE(f.requests.generations[0].rank.has_value());
  CHECK(f.service.in_flight() == 1);

  // The same id again while the first is in flight: refused, and nothing reaches an engine.
  f.call(api::Operation::kGenerate, std::string(kPlain), "abc");
  REQUIRE(f.responses.size() == 1);
  CHECK(f.responses[0].status == 400);
  CHECK(f.responses[0].body.find("\"param\":\"X-Request-Id\"") != std::string::npos);
  CHECK(f.requests.generations.size() == 1);
}

TEST_CASE("ids: the header, else the body's request_id, else a fresh one") {
  Fixture f;
  f.call(api::Operation::kGenerate,
         R"({"token_ids":[1],"request_id":"body-id","sampling_params":{"max_tokens":1}})");
  f.call(api::Operation::kGenerate, std::string(kPlain));
  f.call(api::Operation::kGenerate, std::string(kPlain));
  REQUIRE(f.requests.generations.size() == 3);
  CHECK(f.requests.generations[0].request.external_req_id == "generate-tokens-body-id");
  const std::string fresh1 = *f.requests.generations[1].request.external_req_id;
  const std::string fresh2 = *f.requests.generations[2].request.external_req_id;
  CHECK(fresh1.size() == std::string("generate-tokens-").size() + 32);
  CHECK(fresh1 != fresh2);
}

TEST_CASE("X-data-parallel-rank pins the engine; anything else is a 400 reaching no engine") {
  Fixture f;
  f.call(api::Operation::kGenerate, std::string(kPlain), std::nullopt, "1");
  REQUIRE(f.requests.generations.size() == 1);
  CHECK(f.requests.generations[0].rank == 1);
  for (const char* bad : {"2", "-1", "x", "", "99999999999"}) {
    CAPTURE(bad);
    f.responses.clear();
    f.call(api::Operation::kGenerate, std::string(kPlain), std::nullopt, bad);
    REQUIRE(f.responses.size() == 1);
    CHECK(f.responses[0].status == 400);
    CHECK(f.responses[0].body.find("\"param\":\"X-data-parallel-rank\"") != std::string::npos);
  }
  CHECK(f.requests.generations.size() == 1);
}

TEST_CASE("a non-streamed answer in vLLM's Python shape, with usage and cached tokens") {
  Fixture f;
  f.call(api::Operation::kGenerate, std::string(kPlain), "r1");
  f.step(0, tokens({11, 12}));
  CHECK(f.responses.empty());
  wire::OutputToSend last = tokens({13}, wire::FinishReason::kStop);
  last.stop_token = 13;
  last.num_cached_tokens = 2;
  f.step(0, last);
  REQUIRE(f.responses.size() == 1);
  CHECK(f.responses[0].status == 200);
  CHECK(f.responses[0].tokens == 3);
  CHECK(f.responses[0].first_token_seconds.has_value());
  const std::string created =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  std::string body = f.responses[0].body;
  const std::size_t at = body.find("\"created\":");
  REQUIRE(at != std::string::npos);
  body.replace(at + 10, body.find(',', at) - at - 10, "T");
  CHECK(body ==
        R"({"request_id":"generate-tokens-r1","model":"m","created":T,"choices":[{"index":0,)"
        R"("logprobs":null,"finish_reason":"stop","stop_reason":13,"token_ids":[11,12,13]}],)"
        R"("usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3,)"
        R"("prompt_tokens_details":{"cached_tokens":2}},"prompt_logprobs":null,)"
        R"("prompt_token_ids":[5,6,7],"kv_transfer_params":null})");
  CHECK(f.service.in_flight() == 0);
}

TEST_CASE("logprobs: placeholder tokens, the sampled one first, clamped, k distinct tokens") {
  Fixture f;
  f.call(api::Operation::kGenerate,
         R"({"token_ids":[5],"sampling_params":{"max_tokens":2,"logprobs":1}})");
  wire::OutputToSend out = tokens({40}, wire::FinishReason::kLength);
  // Sampled 40, then the top 2: 40 again (counted once) and 41.
  out.logprobs = wire::LogprobRows{1, 3, {40, 40, 41}, {-0.5F, -0.5F, -1e30F}, {1}};
  f.step(0, out);
  REQUIRE(f.responses.size() == 1);
  const std::string& body = f.responses[0].body;
  CHECK(body.find(R"("logprobs":{"content":[{"token":"token_id:40","logprob":-0.5,"bytes":null,)"
                  R"("top_logprobs":[{"token":"token_id:40","logprob":-0.5,"bytes":null}]}]})") !=
        std::string::npos);

  f.call(api::Operation::kGenerate,
         R"({"token_ids":[5],"sampling_params":{"max_tokens":2,"logprobs":5}})");
  f.step(1, out);
  REQUIRE(f.responses.size() == 2);
  CHECK(f.responses[1].body.find(
            R"("top_logprobs":[{"token":"token_id:40","logprob":-0.5,"bytes":null},)"
            R"({"token":"token_id:41","logprob":-9999.0,"bytes":null}]})") != std::string::npos);
}

TEST_CASE("prompt logprobs: null first, then each position keyed by token id") {
  Fixture f;
  f.call(api::Operation::kGenerate,
         R"({"token_ids":[5,6],"sampling_params":{"max_tokens":1,"prompt_logprobs":1}})");
  wire::OutputToSend out = tokens({9}, wire::FinishReason::kLength);
  out.prompt_logprobs = wire::LogprobRows{1, 2, {6, 8}, {-2.0F, -0.25F}, {3}};
  f.step(0, out);
  REQUIRE(f.responses.size() == 1);
  CHECK(
      f.responses[0].body.find(
          R"("prompt_logprobs":[null,{"6":{"logprob":-2.0,"rank":3,"decoded_token":"token_id:6"},)"
          R"("8":{"logprob":-0.25,"rank":1,"decoded_token":"token_id:8"}}])") != std::string::npos);
}

TEST_CASE(
    "a stream: head once an engine took it, one event per step, terminal chunk, usage, DONE") {
  Fixture f;
  auto stream = f.call(api::Operation::kGenerate,
                       R"({"token_ids":[5],"stream":true,"stream_options":{"include_usage":true},)"
                       R"("sampling_params":{"max_tokens":3}})",
                       "s");
  CHECK(stream->head.empty());
  f.requests.generations[0].sink->on_sent(0);
  CHECK(stream->head == "200 text/event-stream");
  f.step(0, tokens({21}));
  f.step(0, tokens({}));  // a step without tokens writes nothing
  f.step(0, tokens({22, 23}, wire::FinishReason::kLength));
  REQUIRE(stream->events.size() == 2);
  CHECK(stream->events[0] ==
        "data: {\"request_id\":\"generate-tokens-s\",\"choices\":[{\"index\":0,\"logprobs\":null,"
        "\"finish_reason\":null,\"stop_reason\":null,\"token_ids\":[21]}],\"usage\":null}\n\n");
  CHECK(
      stream->events[1] ==
      "data: {\"request_id\":\"generate-tokens-s\",\"choices\":[{\"index\":0,\"logprobs\":null,"
      "\"finish_reason\":\"length\",\"stop_reason\":null,\"token_ids\":[22,23]}],\"usage\":null}"
      "\n\n"
      "data: {\"request_id\":\"generate-tokens-s\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,"
      "\"total_tokens\":4,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":0}}}"
      "\n\n"
      "data: [DONE]\n\n");
  REQUIRE(f.responses.size() == 1);
  CHECK(f.responses[0].streamed);
  CHECK(f.responses[0].tokens == 3);
}

TEST_CASE("a slow reader: deltas merge into one event, and too much waiting cuts it off") {
  Fixture f;
  auto stream = f.call(api::Operation::kGenerate,
                       R"({"token_ids":[5],"stream":true,"sampling_params":{"max_tokens":9}})");
  f.requests.generations[0].sink->on_sent(0);
  stream->pending = 100000;  // the client has not taken what it was sent
  f.step(0, tokens({1}));
  f.step(0, tokens({2}));
  CHECK(stream->events.empty());
  stream->pending = 0;
  f.step(0, tokens({3}));
  REQUIRE(stream->events.size() == 1);
  CHECK(stream->events[0].find("\"token_ids\":[1,2,3]") != std::string::npos);

  stream->pending = std::size_t{8} << 20;  // at the limit: the next delta is one too many
  f.step(0, tokens({4}));
  CHECK(stream->aborted);
  REQUIRE(f.requests.aborts.size() == 1);
  CHECK(f.requests.aborts[0] == f.requests.generations[0].request.request_id);
  // The engine client confirms the abort; the request ends without another byte.
  f.requests.generations[0].sink->on_closed(engine::Closed::kAborted, "aborted");
  REQUIRE(f.responses.size() == 1);
  CHECK(f.responses[0].status == api::kClientClosedRequest);
  CHECK(stream->events.size() == 1);
}

TEST_CASE("a client that leaves aborts its request on the engine, and gets nothing more") {
  Fixture f;
  auto stream = f.call(api::Operation::kGenerate, std::string(kPlain));
  REQUIRE(stream->cancel);
  stream->cancel();
  REQUIRE(f.requests.aborts.size() == 1);
  CHECK(f.requests.aborts[0] == f.requests.generations[0].request.request_id);
  f.requests.generations[0].sink->on_closed(engine::Closed::kAborted, "aborted");
  REQUIRE(f.responses.size() == 1);
  CHECK(f.responses[0].status == api::kClientClosedRequest);
  CHECK(f.service.in_flight() == 0);
}

TEST_CASE("/abort_requests: by either id, or all; each ends with its tokens and \"abort\"") {
  Fixture f;
  f.call(api::Operation::kGenerate, std::string(kPlain), "a");
  f.call(api::Operation::kGenerate, std::string(kPlain), "b");
  f.call(api::Operation::kGenerate, std::string(kPlain), "c");
  f.call(api::Operation::kAbortRequests, R"({"request_ids":["a","generate-tokens-b","zzz"]})");
  REQUIRE(f.responses.size() == 1);
  CHECK(f.responses[0].body == R"({"status":"aborted","aborted":2})");
  REQUIRE(f.requests.aborts.size() == 2);
  CHECK(f.requests.aborts[0] == f.requests.generations[0].request.request_id);
  CHECK(f.requests.aborts[1] == f.requests.generations[1].request.request_id);

  f.step(0, tokens({77}));
  f.requests.generations[0].sink->on_closed(engine::Closed::kAborted, "aborted");
  REQUIRE(f.responses.size() == 2);
  CHECK(f.responses[1].status == 200);
  CHECK(f.responses[1].body.find(
            R"("finish_reason":"abort","stop_reason":null,"token_ids":[77])") != std::string::npos);

  f.call(api::Operation::kAbortRequests, "");
  CHECK(f.responses.back().body == R"({"status":"aborted","aborted":2})");
  f.call(api::Operation::kAbortRequests, R"({"request_ids":"a"})");
  CHECK(f.responses.back().status == 400);
  CHECK(f.responses.back().body.find("\"param\":\"request_ids\"") != std::string::npos);
}

TEST_CASE("engine failures: 500/503 before the stream, an error event and DONE within it") {
  Fixture f;
  f.call(api::Operation::kGenerate, std::string(kPlain));
  f.requests.generations[0].sink->on_closed(engine::Closed::kRefused, "no engine is ready");
  REQUIRE(f.responses.size() == 1);
  CHECK(f.responses[0].status == 503);

  f.call(api::Operation::kGenerate, std::string(kPlain));
  f.step(1, tokens({1}, wire::FinishReason::kError));
  REQUIRE(f.responses.size() == 2);
  CHECK(f.responses[1].status == 500);
  CHECK(f.responses[1].body.find("Internal server error") != std::string::npos);

  auto stream = f.call(api::Operation::kGenerate,
                       R"({"token_ids":[5],"stream":true,"sampling_params":{"max_tokens":9}})");
  f.requests.generations[2].sink->on_sent(1);
  stream->pending = 100000;
  f.step(2, tokens({8}));  // merged, unsent
  f.requests.generations[2].sink->on_closed(engine::Closed::kEngineLost, "engine rank 1 died");
  REQUIRE(stream->events.size() == 1);
  CHECK(stream->events[0].find("\"token_ids\":[8]") != std::string::npos);
  CHECK(stream->events[0].find(R"(data: {"error":{"message":"engine rank 1 died",)"
                               R"("type":"InternalServerError","param":null,"code":500}})") !=
        std::string::npos);
  CHECK(stream->events[0].size() > 14);
  CHECK(stream->events[0].substr(stream->events[0].size() - 14) == "data: [DONE]\n\n");
}

TEST_CASE("abort_all ends every generation in flight") {
  Fixture f;
  f.call(api::Operation::kGenerate, std::string(kPlain));
  f.call(api::Operation::kGenerate, std::string(kPlain));
  CHECK(f.service.abort_all() == 2);
  CHECK(f.requests.aborts.size() == 2);
}

TEST_CASE("n > 1: one engine request per choice, followers of the first, one answer") {
  Fixture f;
  f.call(api::Operation::kGenerate,
         R"({"token_ids":[5,6],"sampling_params":{"max_tokens":4,"n":3,"seed":10}})", "g");
  REQUIRE(f.requests.generations.size() == 3);
  for (std::size_t j = 0; j < 3; ++j) {
    const engine::Generation& generation = f.requests.generations[j];
    CHECK(generation.follows_previous == (j > 0));
    CHECK(generation.request.sampling_params->seed == static_cast<std::int64_t>(10 + j));
    CHECK(generation.request.external_req_id == std::to_string(j) + "_generate-tokens-g");
  }
  CHECK(f.service.in_flight() == 1);  // one answer in flight, not three
  // The choices end out of order; the answer waits for all and lists them by index.
  f.step(2, tokens({30}, wire::FinishReason::kLength));
  f.step(0, tokens({10, 11}, wire::FinishReason::kStop));
  CHECK(f.responses.empty());
  f.step(1, tokens({20}, wire::FinishReason::kLength));
  REQUIRE(f.responses.size() == 1);
  const std::string& body = f.responses[0].body;
  const auto at = [&](std::string_view text) { return body.find(text); };
  CHECK(at(R"("index":0)") < at(R"("index":1)"));
  CHECK(at(R"("index":1)") < at(R"("index":2)"));
  CHECK(at(R"("token_ids":[10,11])") < at(R"("token_ids":[20])"));
  CHECK(at(R"("prompt_tokens":2,"total_tokens":6,"completion_tokens":4)") != std::string::npos);
  CHECK(f.responses[0].tokens == 4);
  CHECK(f.service.in_flight() == 0);
}

TEST_CASE("n > 1: the first choice that fails ends the answer once and aborts the others") {
  Fixture f;
  auto stream = f.call(api::Operation::kGenerate,
                       R"({"token_ids":[5],"sampling_params":{"max_tokens":4,"n":2},)"
                       R"("stream":true})");
  REQUIRE(f.requests.generations.size() == 2);
  f.requests.generations[0].sink->on_sent(0);
  CHECK(stream->head == "200 text/event-stream");
  f.step(0, tokens({7}));
  // The second was never sent (its leader's engine went away meanwhile).
  f.requests.generations[1].sink->on_closed(engine::Closed::kRefused, "no engine is ready");
  REQUIRE(f.responses.size() == 1);
  CHECK(f.responses[0].streamed);
  CHECK(f.responses[0].status == 503);
  REQUIRE(stream->events.size() == 2);
  CHECK(stream->events[1].find("no engine is ready") != std::string::npos);
  CHECK(stream->events[1].find("data: [DONE]") != std::string::npos);
  CHECK(f.requests.aborts.size() == 2);
  // The other choice says nothing more, whatever its engine still sends.
  f.step(0, tokens({8}, wire::FinishReason::kLength));
  f.requests.generations[0].sink->on_closed(engine::Closed::kAborted, "");
  CHECK(f.responses.size() == 1);
  CHECK(stream->events.size() == 2);
  CHECK(f.service.in_flight() == 0);
}
