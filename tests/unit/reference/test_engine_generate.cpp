// ReferenceEngine generating over real ZeroMQ sockets: ADD gives outputs until a finish,
// logprob arrays inline and in frames, ABORT, the pause modes and the generate fault.

#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/reference/tokens.hpp"
#include "common/wire/generation_output.hpp"
#include "common/wire/generation_request.hpp"
#include "tests/unit/reference/frontend.hpp"

using namespace std::chrono_literals;
using namespace vllmd::test;
using namespace vllmd::reference;

namespace {

// One output message as the frontend reads it; the frames outlive the decoded views.
struct Message {
  Frames frames;
  wire::DecodedOutputs decoded;
};

std::optional<Message> next_message(Frontend& frontend,
                                    std::chrono::milliseconds timeout = kTimeout) {
  auto frames = Frontend::receive(frontend.output, timeout);
  if (!frames) return std::nullopt;
  Message message;
  message.frames = std::move(*frames);
  std::vector<std::string_view> views(message.frames.begin(), message.frames.end());
  auto decoded = wire::decode_outputs(views);
  REQUIRE_MESSAGE(decoded, decoded.error());
  message.decoded = std::move(*decoded);
  return message;
}

void add(Frontend& frontend, const std::string& id, wire::SamplingParams params,
         std::vector<std::int64_t> prompt = {1, 2, 3}) {
  wire::EngineCoreRequest request;
  request.request_id = id;
  request.prompt_token_ids = std::move(prompt);
  request.sampling_params = std::move(params);
  const auto& layout = wire::request_layout_for(std::string("0.0.0+reference"));
  Frontend::send(frontend.input, {frontend.identity, std::string(1, '\x00'),
                                  wire::encode_engine_core_request(request, layout)});
}

wire::SamplingParams max_tokens(std::int64_t n) {
  wire::SamplingParams params;
  params.max_tokens = n;
  return params;
}

// What a request got over the wire, until its finish (or `limit` messages).
struct Stream {
  std::vector<std::int64_t> tokens;
  std::optional<std::int64_t> finish_reason;
  int messages = 0;
};

Stream collect(Frontend& frontend, const std::string& id, int limit = 200) {
  Stream stream;
  for (int i = 0; i < limit && !stream.finish_reason; ++i) {
    auto message = next_message(frontend);
    REQUIRE(message);
    ++stream.messages;
    for (const auto& output : message->decoded.outputs) {
      if (output.request_id != id) continue;
      for (const std::int64_t token : output.new_token_ids) stream.tokens.push_back(token);
      stream.finish_reason = output.finish_reason;
    }
  }
  return stream;
}

std::int64_t expected_token(const std::string& id, std::int64_t t, std::int64_t vocab = 32000) {
  const std::vector<std::int64_t> prompt = {1, 2, 3};
  const auto fingerprint = weights_fingerprint({}, "default", 0);
  return token_at(token_base(fingerprint, request_key(std::nullopt, id), prompt_digest(prompt)), t,
                  vocab);
}

auto fast(std::size_t threshold = 256) {
  return [threshold](ReferenceEngineOptions& options) {
    options.step_interval = 1ms;
    options.zero_copy_threshold = threshold;
  };
}

}  // namespace

TEST_SUITE("reference_engine_generate") {
  TEST_CASE("an ADD gives one output per step until it finishes, with predictable tokens") {
    ConnectedEngine test(fast());
    add(test.frontend, "gen-1", max_tokens(5));
    const Stream stream = collect(test.frontend, "gen-1");
    CHECK(stream.finish_reason == static_cast<std::int64_t>(wire::FinishReason::kLength));
    CHECK(stream.messages == 5);
    REQUIRE(stream.tokens.size() == 5);
    for (std::int64_t t = 0; t < 5; ++t) CHECK(stream.tokens[t] == expected_token("gen-1", t));
    // Nothing runs, so nothing more is sent.
    CHECK_FALSE(Frontend::receive(test.frontend.output, 100ms));
  }

  TEST_CASE("stats in every step; a stop token ends the request with its stop_reason") {
    ConnectedEngine test(fast());
    wire::SamplingParams params = max_tokens(50);
    params.stop_token_ids = std::vector<std::int64_t>{expected_token("s", 1)};
    add(test.frontend, "s", params);
    auto first = next_message(test.frontend);
    REQUIRE(first);
    REQUIRE(first->decoded.scheduler_stats);
    CHECK(first->decoded.scheduler_stats->running == 1);
    auto second = next_message(test.frontend);
    REQUIRE(second);
    REQUIRE(second->decoded.outputs.size() == 1);
    CHECK(second->decoded.outputs[0].finish_reason == 0);
    CHECK(second->decoded.outputs[0].stop_token == expected_token("s", 1));
    CHECK(second->decoded.scheduler_stats->running == 0);
  }

  TEST_CASE("logprob arrays decode both inline and from extra frames") {
    for (const std::size_t threshold : {std::size_t{1 << 20}, std::size_t{1}}) {
      CAPTURE(threshold);
      ConnectedEngine test(fast(threshold));
      wire::SamplingParams params = max_tokens(2);
      params.logprobs = 2;
      params.prompt_logprobs = 1;
      add(test.frontend, "lp", params);
      auto message = next_message(test.frontend);
      REQUIRE(message);
      // Inline: one frame. In frames: 3 sample arrays and 3 prompt arrays.
      CHECK(message->frames.size() == (threshold == 1 ? 7u : 1u));
      REQUIRE(message->decoded.outputs.size() == 1);
      const auto& output = message->decoded.outputs[0];
      REQUIRE(output.logprobs);
      CHECK(output.logprobs->rows() == 1);
      CHECK(output.logprobs->columns() == 3);
      const std::int64_t token = expected_token("lp", 0);
      CHECK(output.logprobs->token_ids.integer(0) == token);
      CHECK(output.logprobs->token_ids.integer(2) == (token + 1) % 32000);
      CHECK(output.logprobs->logprobs.real(2) == -1.0);
      CHECK(output.logprobs->ranks.integer(0) == 1);
      REQUIRE(output.prompt_logprobs);
      CHECK(output.prompt_logprobs->rows() == 2);
      CHECK(output.prompt_logprobs->token_ids.integer(0) == 2);
      CHECK(output.prompt_logprobs->token_ids.integer(2) == 3);
      CHECK(output.num_cached_tokens == 0);
    }
  }

  TEST_CASE("after an ABORT the request gets no further output") {
    ConnectedEngine test(fast());
    add(test.frontend, "keep", max_tokens(1000));
    add(test.frontend, "drop", max_tokens(1000));
    REQUIRE(next_message(test.frontend));
    const std::vector<std::string> ids = {"drop"};
    Frontend::send(test.frontend.input,
                   {test.frontend.identity, std::string(1, '\x01'), wire::encode_abort(ids)});
    // Outputs stepped before the ABORT arrived still name it (on a loaded machine that can be
    // many 1 ms steps); once a step leaves it out, no later step names it.
    bool gone = false;
    for (int i = 0; i < 900 && !gone; ++i) {
      auto message = next_message(test.frontend);
      REQUIRE(message);
      gone = message->decoded.outputs.size() == 1;
    }
    REQUIRE(gone);
    for (int i = 0; i < 5; ++i) {
      auto message = next_message(test.frontend);
      REQUIRE(message);
      REQUIRE(message->decoded.outputs.size() == 1);
      CHECK(message->decoded.outputs[0].request_id == "keep");
    }
  }

  TEST_CASE("pause abort: ABORT outputs for every request, then the reply") {
    ConnectedEngine test(fast());
    add(test.frontend, "a", max_tokens(1000));
    REQUIRE(next_message(test.frontend));
    test.frontend.call(1, "pause_scheduler", R"(["abort",false])");
    bool aborted = false;
    for (int i = 0; i < 1000; ++i) {  // steps until the pause arrives, then its reply
      auto message = next_message(test.frontend);
      REQUIRE(message);
      if (message->decoded.utility_output) {
        CHECK(aborted);  // the outputs came first
        break;
      }
      for (const auto& output : message->decoded.outputs) {
        if (output.finish_reason == static_cast<std::int64_t>(wire::FinishReason::kAbort)) {
          aborted = true;
        }
      }
    }
    CHECK(aborted);
    // An ADD while paused waits for the resume.
    add(test.frontend, "later", max_tokens(1));
    CHECK_FALSE(Frontend::receive(test.frontend.output, 100ms));
    test.frontend.call(2, "resume_scheduler", "[]");
    CHECK(test.frontend.reply().call_id == wire::CallId{2, false});
    CHECK(collect(test.frontend, "later").tokens.size() == 1);
  }

  TEST_CASE("pause wait replies once the running requests drained; keep freezes them") {
    ConnectedEngine test(fast());
    add(test.frontend, "w", max_tokens(5));
    REQUIRE(next_message(test.frontend));
    test.frontend.call(1, "pause_scheduler", R"(["wait",false])");
    int outputs_before_reply = 0;
    bool finished = false;
    for (int i = 0; i < 50; ++i) {
      auto message = next_message(test.frontend);
      REQUIRE(message);
      if (message->decoded.utility_output) break;
      for (const auto& output : message->decoded.outputs) {
        ++outputs_before_reply;
        finished = finished || output.finish_reason.has_value();
      }
    }
    CHECK(finished);  // the reply waited for the finish
    CHECK(outputs_before_reply >= 3);

    test.frontend.call(2, "resume_scheduler", "[]");
    test.frontend.reply();
    add(test.frontend, "k", max_tokens(1000));
    REQUIRE(next_message(test.frontend));
    test.frontend.call(3, "pause_scheduler", R"(["keep",false])");
    // The reply comes behind the steps run before the pause arrived (many 1 ms steps on a
    // loaded machine, so "k" is long enough to outlast them); then nothing steps.
    std::size_t tokens_before_pause = 1;
    bool replied = false;
    while (!replied) {
      auto message = next_message(test.frontend);
      REQUIRE(message);
      replied = message->decoded.utility_output.has_value();
      for (const auto& output : message->decoded.outputs) {
        REQUIRE_FALSE(output.finish_reason);  // frozen, not finished
        tokens_before_pause += output.new_token_ids.size();
      }
    }
    CHECK_FALSE(Frontend::receive(test.frontend.output, 100ms));
    test.frontend.call(4, "resume_scheduler", "[]");
    test.frontend.reply();
    const Stream rest = collect(test.frontend, "k", 1000);
    CHECK(rest.finish_reason == static_cast<std::int64_t>(wire::FinishReason::kLength));
    CHECK(tokens_before_pause + rest.tokens.size() == 1000);  // none lost across the pause
  }

  TEST_CASE("--inject-fail generate ends requests with finish_reason error") {
    ConnectedEngine test([](ReferenceEngineOptions& options) {
      options.step_interval = 1ms;
      options.faults.fail = {"generate"};
    });
    add(test.frontend, "bad", max_tokens(5));
    const Stream stream = collect(test.frontend, "bad");
    CHECK(stream.finish_reason == static_cast<std::int64_t>(wire::FinishReason::kError));
    CHECK(stream.tokens.empty());
  }
}
