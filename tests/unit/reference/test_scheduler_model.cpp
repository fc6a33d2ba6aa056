// The scheduler generating from a model: the prompt prefilled, each sampled token fed back at
// the next step, logprob rows from the model's log-softmax (rank, top ids), prompt rows, the
// min_tokens ban, seeds, and new weights taking effect at the next step.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/reference/llama.hpp"
#include "common/reference/scheduler.hpp"

using namespace vllmd::reference;
namespace wire = vllmd::wire;

namespace {

LlamaModel tiny_model(std::uint64_t seed) {
  auto config = parse_llama_config(
      R"({"vocab_size":16,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":2,)"
      R"("num_attention_heads":2,"num_key_value_heads":1,"max_position_embeddings":64})");
  REQUIRE_MESSAGE(config, config.error());
  LlamaModel model(*config);
  model.init_dummy(seed);
  return model;
}

wire::EngineCoreRequest request(const std::string& id, wire::SamplingParams params,
                                std::vector<std::int64_t> prompt = {3, 1, 4, 1, 5}) {
  wire::EngineCoreRequest made;
  made.request_id = id;
  made.prompt_token_ids = std::move(prompt);
  made.sampling_params = std::move(params);
  return made;
}

wire::SamplingParams greedy(std::int64_t tokens) {
  wire::SamplingParams params;
  params.max_tokens = tokens;
  params.temperature = 0.0;
  return params;
}

// Greedy decoding straight from the model, one token at a time.
std::vector<std::int64_t> decode(const LlamaModel& model, const std::vector<std::int64_t>& prompt,
                                 int tokens) {
  KvCache cache;
  std::vector<double> logits(16);
  for (std::int64_t token : prompt) model.forward(cache, token, logits);
  std::vector<std::int64_t> out;
  for (int i = 0; i < tokens; ++i) {
    const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    out.push_back(best);
    model.forward(cache, best, logits);
  }
  return out;
}

// The outputs of `id` until it finishes.
std::vector<wire::OutputToSend> run(Scheduler& scheduler, const std::string& id) {
  std::vector<wire::OutputToSend> outputs;
  for (int i = 0; i < 100; ++i) {
    const auto& step = scheduler.step(1.0);
    for (const auto& output : step.outputs) {
      if (output.request_id == id) outputs.push_back(output);
    }
    if (!outputs.empty() && outputs.back().finish_reason) return outputs;
  }
  FAIL("no finish");
  return outputs;
}

std::vector<std::int64_t> tokens_of(const std::vector<wire::OutputToSend>& outputs) {
  std::vector<std::int64_t> tokens;
  for (const auto& output : outputs) {
    tokens.insert(tokens.end(), output.new_token_ids.begin(), output.new_token_ids.end());
  }
  return tokens;
}

}  // namespace

TEST_SUITE("reference_scheduler_model") {
  TEST_CASE("greedy tokens are the model's, with logprob rows from its log-softmax") {
    const LlamaModel model = tiny_model(7);
    Scheduler scheduler(SchedulerOptions{});
    scheduler.set_model(&model);
    wire::SamplingParams params = greedy(6);
    params.logprobs = 3;
    params.prompt_logprobs = 2;
    REQUIRE(scheduler.add(request("g", params)));
    const auto outputs = run(scheduler, "g");
    CHECK(tokens_of(outputs) == decode(model, {3, 1, 4, 1, 5}, 6));
    CHECK(outputs.back().finish_reason == wire::FinishReason::kLength);

    // The first output: prompt rows for tokens 2..5, each naming the prompt token first.
    REQUIRE(outputs.front().prompt_logprobs);
    const wire::LogprobRows& prompt = *outputs.front().prompt_logprobs;
    CHECK(prompt.rows == 4);
    CHECK(prompt.columns == 3);
    CHECK(prompt.token_ids[0] == 1);
    CHECK(prompt.token_ids[3] == 4);
    CHECK_FALSE(outputs.back().prompt_logprobs);
    for (const auto& output : outputs) {
      REQUIRE(output.logprobs);
      const wire::LogprobRows& rows = *output.logprobs;
      CHECK(rows.rows == 1);
      CHECK(rows.columns == 4);
      CHECK(rows.ranks[0] == 1);                            // greedy: the top token
      CHECK(rows.token_ids[1] == output.new_token_ids[0]);  // and the first of the top ones
      CHECK(rows.logprobs[0] == rows.logprobs[1]);
      CHECK(rows.logprobs[1] >= rows.logprobs[2]);
      CHECK(rows.logprobs[2] >= rows.logprobs[3]);
      CHECK(rows.logprobs[0] < 0);
    }
  }

  TEST_CASE("a seed makes sampling reproducible; min_tokens bans the stop ids") {
    const LlamaModel model = tiny_model(11);
    const auto sample = [&](std::int64_t seed, const std::string& id) {
      Scheduler scheduler(SchedulerOptions{});
      scheduler.set_model(&model);
      wire::SamplingParams params;
      params.max_tokens = 24;
      params.seed = seed;
      params.temperature = 1.0;
      params.min_tokens = 24;
      params.stop_token_ids = std::vector<std::int64_t>{0, 1, 2, 3};
      REQUIRE(scheduler.add(request(id, params)));
      return tokens_of(run(scheduler, id));
    };
    const auto first = sample(5, "a");
    CHECK(first == sample(5, "b"));  // the seed decides, not the request id
    CHECK(first != sample(6, "a"));
    CHECK(first.size() == 24);
    CHECK(std::none_of(first.begin(), first.end(), [](std::int64_t t) { return t < 4; }));
  }

  TEST_CASE("weights loaded mid-request are used from the next step on") {
    LlamaModel model = tiny_model(3);
    const LlamaModel old = tiny_model(3);
    const LlamaModel other = tiny_model(4);
    Scheduler scheduler(SchedulerOptions{});
    scheduler.set_model(&model);
    REQUIRE(scheduler.add(request("w", greedy(8))));
    std::vector<std::int64_t> tokens;
    for (int i = 0; i < 3; ++i) {
      const auto& step = scheduler.step(1.0);
      tokens.push_back(step.outputs.at(0).new_token_ids.at(0));
    }
    CHECK(tokens == decode(old, {3, 1, 4, 1, 5}, 3));
    model.init_dummy(4);  // every parameter replaced, as a finished weight update does
    const std::int64_t next = scheduler.step(1.0).outputs.at(0).new_token_ids.at(0);

    // The cache of the earlier positions stays (as in vLLM); the last token is fed, and the
    // next one chosen, under the new weights.
    const auto continued = [&](const LlamaModel& last) {
      KvCache cache;
      std::vector<double> logits(16);
      for (std::int64_t token : {3, 1, 4, 1, 5}) old.forward(cache, token, logits);
      old.forward(cache, tokens[0], logits);
      old.forward(cache, tokens[1], logits);
      last.forward(cache, tokens[2], logits);
      return std::max_element(logits.begin(), logits.end()) - logits.begin();
    };
    REQUIRE(continued(other) != continued(old));  // else these seeds show nothing
    CHECK(next == continued(other));
  }
}
