// The reference scheduler without sockets: batching, the waiting queue, every stop rule,
// logprob rows, pause modes, client aborts, the generate fault and the weights' effect.

#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/reference/scheduler.hpp"
#include "common/reference/tokens.hpp"

using namespace vllmd::reference;
namespace wire = vllmd::wire;

namespace {

wire::EngineCoreRequest request(const std::string& id, wire::SamplingParams params = {},
                                std::vector<std::int64_t> prompt = {1, 2, 3}) {
  wire::EngineCoreRequest made;
  made.request_id = id;
  made.prompt_token_ids = std::move(prompt);
  made.sampling_params = std::move(params);
  return made;
}

wire::SamplingParams max_tokens(std::int64_t n) {
  wire::SamplingParams params;
  params.max_tokens = n;
  return params;
}

// The tokens tokens.hpp predicts for a request without seed.
std::int64_t expected_token(std::uint64_t fingerprint, const std::string& id,
                            const std::vector<std::int64_t>& prompt, std::int64_t t,
                            std::int64_t vocab = 32000) {
  return token_at(token_base(fingerprint, request_key(std::nullopt, id), prompt_digest(prompt)), t,
                  vocab);
}

const wire::OutputToSend* find(const wire::OutputsToSend& step, const std::string& id) {
  for (const auto& output : step.outputs) {
    if (output.request_id == id) return &output;
  }
  return nullptr;
}

// Steps until `id` finishes; its tokens and last output.
struct Run {
  std::vector<std::int64_t> tokens;
  wire::OutputToSend last;
};
Run run_to_end(Scheduler& scheduler, const std::string& id, int limit = 1000) {
  Run run;
  for (int i = 0; i < limit; ++i) {
    const auto& step = scheduler.step(1.0);
    const auto* output = find(step, id);
    REQUIRE(output != nullptr);
    run.tokens.insert(run.tokens.end(), output->new_token_ids.begin(), output->new_token_ids.end());
    if (output->finish_reason) {
      run.last = *output;
      return run;
    }
  }
  FAIL("request never finished");
  return run;
}

}  // namespace

TEST_SUITE("reference_scheduler") {
  TEST_CASE("tokens follow the documented formula, one per step by default") {
    Scheduler scheduler({});
    scheduler.set_fingerprint(99);
    REQUIRE(scheduler.add(request("r1", max_tokens(4))));
    const auto& first = scheduler.step(12.5);
    CHECK(first.timestamp == 12.5);
    REQUIRE(first.outputs.size() == 1);
    CHECK(first.outputs[0].num_cached_tokens == 0);
    REQUIRE(first.outputs[0].new_token_ids.size() == 1);
    CHECK(first.outputs[0].new_token_ids[0] == expected_token(99, "r1", {1, 2, 3}, 0));
    const Run rest = run_to_end(scheduler, "r1");
    CHECK(rest.tokens == std::vector<std::int64_t>{expected_token(99, "r1", {1, 2, 3}, 1),
                                                   expected_token(99, "r1", {1, 2, 3}, 2),
                                                   expected_token(99, "r1", {1, 2, 3}, 3)});
    CHECK(rest.last.finish_reason == wire::FinishReason::kLength);
    CHECK_FALSE(rest.last.num_cached_tokens);  // only in the first output
    CHECK_FALSE(scheduler.has_work());
  }

  TEST_CASE("a seed replaces the request id; the same seed and prompt give the same tokens") {
    Scheduler scheduler({});
    wire::SamplingParams params = max_tokens(3);
    params.seed = 7;
    scheduler.add(request("a", params));
    scheduler.add(request("b", params));
    scheduler.add(request("c", max_tokens(3)));
    const auto a = run_to_end(scheduler, "a").tokens;
    Scheduler other({});
    other.add(request("b", params));
    CHECK(run_to_end(other, "b").tokens == a);
    const std::uint64_t base = token_base(0, 7, prompt_digest(std::vector<std::int64_t>{1, 2, 3}));
    CHECK(a[2] == token_at(base, 2, 32000));
  }

  TEST_CASE("tokens_per_step tokens per request per step") {
    Scheduler scheduler({.tokens_per_step = 3});
    scheduler.add(request("r", max_tokens(7)));
    CHECK(scheduler.step(0).outputs[0].new_token_ids.size() == 3);
    CHECK(scheduler.step(0).outputs[0].new_token_ids.size() == 3);
    const auto& last = scheduler.step(0);
    CHECK(last.outputs[0].new_token_ids.size() == 1);  // max_tokens cuts the batch short
    CHECK(last.outputs[0].finish_reason == wire::FinishReason::kLength);
  }

  TEST_CASE("max_num_seqs run, the rest wait first come first served") {
    Scheduler scheduler({.max_num_seqs = 2});
    scheduler.add(request("a", max_tokens(1)));
    scheduler.add(request("b", max_tokens(3)));
    scheduler.add(request("c", max_tokens(3)));
    CHECK(scheduler.waiting() == 3);
    const auto& first = scheduler.step(0);
    REQUIRE(first.outputs.size() == 2);
    CHECK(first.outputs[0].request_id == "a");
    CHECK(first.outputs[1].request_id == "b");
    CHECK(first.outputs[0].finish_reason == wire::FinishReason::kLength);
    REQUIRE(first.scheduler_stats);
    CHECK(first.scheduler_stats->running == 1);  // after a finished
    CHECK(first.scheduler_stats->waiting == 1);
    CHECK(first.finished_requests.empty());  // vLLM fills it only with DP > 1
    const auto& second = scheduler.step(0);
    REQUIRE(second.outputs.size() == 2);
    CHECK(second.outputs[0].request_id == "b");
    CHECK(second.outputs[1].request_id == "c");
    CHECK(second.scheduler_stats->running == 2);
    CHECK(second.scheduler_stats->waiting == 0);
  }

  TEST_CASE("a duplicate id in flight is dropped; after it finished the id is free") {
    Scheduler scheduler({});
    CHECK(scheduler.add(request("r", max_tokens(1))));
    CHECK_FALSE(scheduler.add(request("r", max_tokens(5))));
    CHECK(scheduler.waiting() == 1);
    CHECK(scheduler.step(0).outputs.size() == 1);
    CHECK(scheduler.add(request("r", max_tokens(1))));
  }

  TEST_CASE("EOS stops without a stop_reason; a stop token stops with it") {
    const std::vector<std::int64_t> prompt = {1, 2, 3};
    const std::int64_t third = expected_token(0, "e", prompt, 2);
    Scheduler scheduler({});
    wire::SamplingParams eos = max_tokens(100);
    eos.eos_token_id = third;
    scheduler.add(request("e", eos));
    const Run stopped = run_to_end(scheduler, "e");
    CHECK(stopped.tokens.size() == 3);
    CHECK(stopped.tokens.back() == third);  // the stop token is in the output
    CHECK(stopped.last.finish_reason == wire::FinishReason::kStop);
    CHECK_FALSE(stopped.last.stop_token);

    const std::int64_t second = expected_token(0, "s", prompt, 1);
    wire::SamplingParams stop = max_tokens(100);
    stop.stop_token_ids = std::vector<std::int64_t>{5, second};
    scheduler.add(request("s", stop));
    const Run by_stop = run_to_end(scheduler, "s");
    CHECK(by_stop.tokens.size() == 2);
    CHECK(by_stop.last.finish_reason == wire::FinishReason::kStop);
    CHECK(by_stop.last.stop_token == second);
  }

  TEST_CASE("ignore_eos generates through EOS") {
    const std::int64_t first = expected_token(0, "i", {1, 2, 3}, 0);
    Scheduler scheduler({});
    wire::SamplingParams params = max_tokens(4);
    params.eos_token_id = first;
    params.ignore_eos = true;
    scheduler.add(request("i", params));
    const Run run = run_to_end(scheduler, "i");
    CHECK(run.tokens.size() == 4);
    CHECK(run.tokens[0] == first);
    CHECK(run.last.finish_reason == wire::FinishReason::kLength);
  }

  TEST_CASE("min_tokens masks EOS and the stop tokens, then they stop again") {
    const std::vector<std::int64_t> prompt = {1, 2, 3};
    const std::int64_t first = expected_token(0, "m", prompt, 0);
    const std::int64_t third = expected_token(0, "m", prompt, 2);
    Scheduler scheduler({});
    wire::SamplingParams params = max_tokens(100);
    params.min_tokens = 2;
    params.eos_token_id = first;
    params.stop_token_ids = std::vector<std::int64_t>{third};
    params.all_stop_token_ids = std::vector<std::int64_t>{first, third};
    scheduler.add(request("m", params));
    const Run run = run_to_end(scheduler, "m");
    REQUIRE(run.tokens.size() >= 2);
    // Position 0 would have been EOS: masked, the next id is sampled instead.
    CHECK(run.tokens[0] != first);
    CHECK(run.tokens[0] == (first + 1) % 32000);
    if (third != first && expected_token(0, "m", prompt, 1) != first) {
      CHECK(run.tokens.size() == 3);
      CHECK(run.last.stop_token == third);
    }
  }

  TEST_CASE("max_model_len caps prompt plus output") {
    Scheduler scheduler({.max_model_len = 6});
    scheduler.add(request("l", max_tokens(100), {1, 2, 3, 4}));
    const Run run = run_to_end(scheduler, "l");
    CHECK(run.tokens.size() == 2);
    CHECK(run.last.finish_reason == wire::FinishReason::kLength);
  }

  TEST_CASE("sample logprobs: the sampled token first at rank 1, then the top k") {
    Scheduler scheduler({.tokens_per_step = 2, .vocab_size = 100});
    wire::SamplingParams params = max_tokens(2);
    params.logprobs = 3;
    scheduler.add(request("p", params));
    scheduler.add(request("q", max_tokens(2)));
    const auto& step = scheduler.step(0);
    const auto* p = find(step, "p");
    REQUIRE(p != nullptr);
    REQUIRE(p->logprobs);
    const wire::LogprobRows& rows = *p->logprobs;
    CHECK(rows.rows == 2);
    CHECK(rows.columns == 4);
    CHECK(rows.ranks == std::vector<std::int64_t>{1, 1});
    const std::int64_t token = p->new_token_ids[1];
    CHECK(std::vector<std::int64_t>(rows.token_ids.begin() + 4, rows.token_ids.end()) ==
          std::vector<std::int64_t>{token, token, (token + 1) % 100, (token + 2) % 100});
    CHECK(rows.logprobs[4] == -0.5f);
    CHECK(rows.logprobs[7] == -1.5f);
    CHECK_FALSE(p->prompt_logprobs);
    CHECK_FALSE(find(step, "q")->logprobs);
  }

  TEST_CASE("prompt logprobs: one row per prompt token but the first, in the first output") {
    Scheduler scheduler({});
    wire::SamplingParams params = max_tokens(3);
    params.prompt_logprobs = 1;
    scheduler.add(request("p", params, {10, 20, 30, 40}));
    wire::SamplingParams single = max_tokens(3);
    single.prompt_logprobs = 2;
    scheduler.add(request("one", single, {10}));
    const auto& first = scheduler.step(0);
    const auto* p = find(first, "p");
    REQUIRE(p->prompt_logprobs);
    CHECK(p->prompt_logprobs->rows == 3);
    CHECK(p->prompt_logprobs->columns == 2);
    CHECK(p->prompt_logprobs->token_ids == std::vector<std::int64_t>{20, 20, 30, 30, 40, 40});
    CHECK(p->prompt_logprobs->ranks == std::vector<std::int64_t>{1, 1, 1});
    CHECK_FALSE(find(first, "one")->prompt_logprobs);  // no row for a one-token prompt
    CHECK_FALSE(find(scheduler.step(0), "p")->prompt_logprobs);
  }

  TEST_CASE("a request without prompt logprobs gets none from a recycled output") {
    Scheduler scheduler({});
    wire::SamplingParams params = max_tokens(1);
    params.prompt_logprobs = 1;
    scheduler.add(request("first", params, {10, 20, 30}));
    REQUIRE(find(scheduler.step(0), "first")->prompt_logprobs);  // and it finished
    scheduler.add(request("second", max_tokens(1), {10, 20, 30}));
    CHECK_FALSE(find(scheduler.step(0), "second")->prompt_logprobs);
  }

  TEST_CASE("a client abort sends nothing; finished_requests names it when the set is on") {
    Scheduler scheduler({.include_finished_set = true});
    scheduler.add(request("a", max_tokens(10)));
    scheduler.add(request("b", max_tokens(10)));
    scheduler.step(0);
    const std::vector<std::string> ids = {"a", "unknown"};
    scheduler.abort(ids);
    const auto& step = scheduler.step(0);
    REQUIRE(step.outputs.size() == 1);
    CHECK(step.outputs[0].request_id == "b");
    CHECK(step.finished_requests == std::vector<std::string>{"a"});
    CHECK(step.scheduler_stats->running == 1);
  }

  TEST_CASE("a client abort that empties the batch still gets one step: its stats say so") {
    // vLLM's scheduler steps while aborted ids wait to be reported and returns its stats even
    // without outputs; otherwise the frontend's running gauge would keep the aborted ones.
    Scheduler scheduler({});
    scheduler.add(request("a", max_tokens(10)));
    scheduler.step(0);
    scheduler.abort(std::vector<std::string>{"unknown"});
    CHECK(scheduler.has_work());  // "a" still runs
    scheduler.abort(std::vector<std::string>{"a"});
    REQUIRE(scheduler.has_work());
    const auto& step = scheduler.step(0);
    CHECK(step.outputs.empty());
    REQUIRE(step.scheduler_stats);
    CHECK(step.scheduler_stats->running == 0);
    CHECK(step.scheduler_stats->waiting == 0);
    CHECK_FALSE(scheduler.has_work());
    scheduler.abort(std::vector<std::string>{"a"});  // no longer in flight: nothing to report
    CHECK_FALSE(scheduler.has_work());
  }

  TEST_CASE("the generate fault ends a request with ERROR and no tokens") {
    Scheduler scheduler({.include_finished_set = true});
    scheduler.add(request("bad"), true);
    const auto& step = scheduler.step(0);
    REQUIRE(step.outputs.size() == 1);
    CHECK(step.outputs[0].finish_reason == wire::FinishReason::kError);
    CHECK(step.outputs[0].new_token_ids.empty());
    CHECK(step.finished_requests == std::vector<std::string>{"bad"});
    CHECK_FALSE(scheduler.has_work());
  }

  TEST_CASE("pause abort ends running and waiting requests with ABORT outputs") {
    Scheduler scheduler({.max_num_seqs = 1});
    scheduler.add(request("run", max_tokens(10)));
    scheduler.add(request("wait", max_tokens(10)));
    scheduler.set_phantom_requests(2);
    CHECK(scheduler.step(0).outputs.size() == 1);
    scheduler.pause(PauseMode::kAbort);
    CHECK(scheduler.paused());
    CHECK(scheduler.active() == 0);
    REQUIRE(scheduler.has_work());
    const auto& step = scheduler.step(0);
    REQUIRE(step.outputs.size() == 2);
    for (const auto& output : step.outputs) {
      CHECK(output.finish_reason == wire::FinishReason::kAbort);
      CHECK(output.new_token_ids.empty());
    }
    CHECK(step.scheduler_stats->running == 0);
    CHECK(step.scheduler_stats->waiting == 0);
    // ADDs while paused wait until the resume.
    scheduler.add(request("later", max_tokens(1)));
    CHECK_FALSE(scheduler.has_work());
    scheduler.resume();
    CHECK(scheduler.step(0).outputs.size() == 1);
  }

  TEST_CASE("pause wait drains the running requests and starts no new one") {
    Scheduler scheduler({.max_num_seqs = 1});
    scheduler.add(request("run", max_tokens(2)));
    scheduler.add(request("queued", max_tokens(2)));
    scheduler.set_phantom_requests(3);
    scheduler.step(0);
    scheduler.pause(PauseMode::kWait);
    CHECK(scheduler.active() == 1);  // the phantoms ended, the real one drains
    const auto& last = scheduler.step(0);
    REQUIRE(last.outputs.size() == 1);
    CHECK(last.outputs[0].request_id == "run");
    CHECK(last.outputs[0].finish_reason == wire::FinishReason::kLength);
    CHECK(scheduler.running() == 0);
    CHECK(scheduler.waiting() == 1);
    CHECK_FALSE(scheduler.has_work());
    scheduler.resume();
    CHECK(scheduler.step(0).outputs[0].request_id == "queued");
  }

  TEST_CASE("pause keep freezes; a new fingerprint applies from the resume on") {
    Scheduler scheduler({});
    scheduler.set_phantom_requests(1);
    scheduler.add(request("k", max_tokens(4)));
    const std::vector<std::int64_t> prompt = {1, 2, 3};
    CHECK(scheduler.step(0).outputs[0].new_token_ids[0] == expected_token(0, "k", prompt, 0));
    scheduler.pause(PauseMode::kKeep);
    CHECK(scheduler.active() == 2);
    CHECK_FALSE(scheduler.has_work());
    CHECK(scheduler.step(0).outputs.empty());  // nothing steps
    scheduler.set_fingerprint(1234);
    scheduler.resume();
    const auto& resumed = scheduler.step(0);
    REQUIRE(resumed.outputs.size() == 1);
    CHECK(resumed.outputs[0].new_token_ids[0] == expected_token(1234, "k", prompt, 1));
    CHECK(resumed.outputs[0].new_token_ids[0] != expected_token(0, "k", prompt, 1));
  }

  TEST_CASE("the same weights give the same tokens; others change them") {
    const auto tokens = [](std::uint64_t fingerprint) {
      Scheduler scheduler({});
      scheduler.set_fingerprint(fingerprint);
      scheduler.add(request("w", max_tokens(8)));
      return run_to_end(scheduler, "w").tokens;
    };
    CHECK(tokens(5) == tokens(5));
    CHECK(tokens(5) != tokens(6));
  }

  TEST_CASE("outputs reuse their buffers from step to step") {
    Scheduler scheduler({});
    for (int i = 0; i < 64; ++i) scheduler.add(request("req-" + std::to_string(i), max_tokens(8)));
    const auto* before = scheduler.step(0).outputs[0].new_token_ids.data();
    const auto& again = scheduler.step(0);
    CHECK(again.outputs.size() == 64);
    CHECK(again.outputs[0].new_token_ids.data() == before);
  }
}
