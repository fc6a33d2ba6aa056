// POST /inference/v1/generate's body (common/api/generate_request.*): each 400 of
// docs/http-api.md with the parameter it names, and the lowering into the engine's sampling
// map (generation-config defaults, max_tokens against the context, EOS and stop sets).

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "common/api/generate_request.hpp"

using vllmd::api::ApiError;
using vllmd::api::GenerateRequest;
using vllmd::api::ModelInfo;
using vllmd::api::parse_generate_request;

namespace {

// A Qwen-like model: EOS 151645 and 151643, greedy-ish defaults, a 4096-token context.
ModelInfo qwen() {
  ModelInfo model;
  model.name = "qwen";
  model.vocab_size = 151936;
  model.eos_token_id = 151645;
  model.extra_eos_token_ids = {151643};
  model.temperature = 0.7;
  model.top_p = 0.8;
  model.top_k = 20;
  model.repetition_penalty = 1.05;
  model.max_new_tokens = 512;
  model.max_model_len = 4096;
  return model;
}

GenerateRequest ok(const std::string& body, const ModelInfo& model = qwen()) {
  auto parsed = parse_generate_request(body, model);
  if (!parsed) FAIL(parsed.error().body());
  return *parsed;
}

ApiError refused(const std::string& body, const ModelInfo& model = qwen()) {
  auto parsed = parse_generate_request(body, model);
  REQUIRE_FALSE(parsed.has_value());
  return parsed.error();
}

void check_400(const std::string& body, const std::string& param, const std::string& words,
               const ModelInfo& model = qwen()) {
  CAPTURE(body);
  const ApiError error = refused(body, model);
  CHECK(error.status == 400);
  CHECK(error.param == param);
  CHECK_MESSAGE(error.message.find(words) != std::string::npos, error.message);
}

}  // namespace

TEST_CASE("a minimal request is lowered with the model's defaults, EOS and context") {
  const GenerateRequest request = ok(R"({"token_ids":[1,2,3],"sampling_params":{}})");
  CHECK(request.token_ids == std::vector<std::int64_t>{1, 2, 3});
  CHECK_FALSE(request.stream);
  const auto& p = request.sampling;
  CHECK(p.temperature == 0.7);
  CHECK(p.top_p == 0.8);
  CHECK(p.top_k == 20);
  CHECK(p.repetition_penalty == 1.05);
  CHECK(p.max_tokens == 512);  // max_new_tokens, below the 4093 tokens of room
  CHECK(p.eos_token_id == 151645);
  CHECK(p.stop_token_ids == std::vector<std::int64_t>{151643});
  CHECK(p.all_stop_token_ids == std::vector<std::int64_t>{151643, 151645});
  CHECK_FALSE(p.ignore_eos.has_value());
  CHECK(p.extra_args_msgpack.empty());
}

TEST_CASE("the request's own values win, max_tokens is held to the context, ignore_eos") {
  const GenerateRequest request = ok(
      R"({"token_ids":[5,6],"sampling_params":{"temperature":0,"top_p":1,"top_k":-1,
          "max_tokens":9000,"min_tokens":2,"stop_token_ids":[7],"ignore_eos":true,"seed":-1,
          "logprobs":3}})");
  const auto& p = request.sampling;
  CHECK(p.temperature == 0.0);
  CHECK(p.top_p == 1.0);
  CHECK_FALSE(p.top_k.has_value());  // -1: disabled, vLLM's 0, not sent
  CHECK(p.max_tokens == 4094);       // 4096 - 2 prompt tokens
  CHECK(p.min_tokens == 2);
  CHECK_FALSE(p.seed.has_value());
  CHECK(p.ignore_eos == true);
  CHECK_FALSE(p.eos_token_id.has_value());
  CHECK(p.stop_token_ids == std::vector<std::int64_t>{7});  // no extra EOS under ignore_eos
  CHECK(p.all_stop_token_ids == std::vector<std::int64_t>{7, 151643, 151645});
  CHECK(request.logprobs == 3);
  CHECK(p.logprobs == 3);
  // A top_k the vocabulary cannot reach also means "every token".
  CHECK_FALSE(ok(R"({"token_ids":[1],"sampling_params":{"top_k":1000000000000}})")
                  .sampling.top_k.has_value());
}

TEST_CASE("without --model: no EOS, no vocabulary check, the engine's context only") {
  ModelInfo bare;
  bare.name = "served";
  bare.max_model_len = 100;
  const GenerateRequest request =
      ok(R"({"token_ids":[999999999],"sampling_params":{"stop_token_ids":[3]}})", bare);
  CHECK_FALSE(request.sampling.eos_token_id.has_value());
  CHECK(request.sampling.stop_token_ids == std::vector<std::int64_t>{3});
  CHECK(request.sampling.all_stop_token_ids == std::vector<std::int64_t>{3});
  CHECK(request.sampling.max_tokens == 99);
  CHECK_FALSE(request.sampling.temperature.has_value());  // the engine's default
}

TEST_CASE("every validation error is a 400 naming its parameter") {
  check_400(R"({"sampling_params":{}})", "token_ids", "required");
  check_400(R"({"token_ids":[],"sampling_params":{}})", "token_ids", "at least one token ID");
  check_400(R"({"token_ids":[1,-2],"sampling_params":{}})", "token_ids", "negative");
  check_400(R"({"token_ids":[1,"a"],"sampling_params":{}})", "token_ids", "integers");
  check_400(R"({"token_ids":[1,151936],"sampling_params":{}})", "token_ids",
            "[151936] in prompt are out of vocabulary. Vocabulary size: 151936");
  check_400(R"({"token_ids":[1]})", "sampling_params", "required");
  check_400(R"({"token_ids":[1],"sampling_params":[]})", "sampling_params", "JSON object");
  check_400(R"({"token_ids":[1],"sampling_params":{"max_tokens":0}})", "sampling_params.max_tokens",
            "max_tokens must be at least 1, got 0.");
  check_400(R"({"token_ids":[1],"sampling_params":{"max_tokens":"8"}})",
            "sampling_params.max_tokens", "integer");
  check_400(R"({"token_ids":[1],"sampling_params":{"temperature":2.5}})",
            "sampling_params.temperature", "temperature must be in [0, 2], got 2.5.");
  check_400(R"({"token_ids":[1],"sampling_params":{"top_p":0}})", "sampling_params.top_p",
            "top_p must be in (0, 1], got 0.");
  check_400(R"({"token_ids":[1],"sampling_params":{"min_p":1.5}})", "sampling_params.min_p",
            "[0, 1]");
  check_400(R"({"token_ids":[1],"sampling_params":{"presence_penalty":-3}})",
            "sampling_params.presence_penalty", "[-2, 2]");
  check_400(R"({"token_ids":[1],"sampling_params":{"repetition_penalty":0}})",
            "sampling_params.repetition_penalty", "greater than zero");
  check_400(R"({"token_ids":[1],"sampling_params":{"top_k":-2}})", "sampling_params.top_k",
            "-1 (disable)");
  check_400(R"({"token_ids":[1],"sampling_params":{"n":0}})", "sampling_params.n",
            "n must be at least 1");
  check_400(R"({"token_ids":[1],"sampling_params":{"logprobs":21}})", "sampling_params.logprobs",
            "greater than max allowed: 20");
  check_400(R"({"token_ids":[1],"sampling_params":{"prompt_logprobs":-2}})",
            "sampling_params.prompt_logprobs", "non-negative or -1");
  check_400(R"({"token_ids":[1],"sampling_params":{"min_tokens":600}})",
            "sampling_params.min_tokens", "less than or equal to max_tokens=512, got 600.");
  check_400(R"({"token_ids":[1],"sampling_params":{"stop_token_ids":[200000]}})",
            "sampling_params.stop_token_ids", "out of vocabulary");
  check_400(R"({"token_ids":[1],"sampling_params":{"stop":["</s>"]}})", "sampling_params.stop",
            "vllmd has no tokenizer");
  check_400(R"({"token_ids":[1],"sampling_params":{},"features":{"mm_hashes":[]}})", "features",
            "multimodal");
  check_400(R"({"token_ids":[1],"sampling_params":{},"stream_options":{"include_usage":true}})",
            "stream_options", "only supported when stream=true");
  check_400(R"({"token_ids":[1],"stream":true,"sampling_params":{"prompt_logprobs":1}})",
            "sampling_params.prompt_logprobs", "not available when `stream=true`");
  ModelInfo small = qwen();
  small.max_model_len = 3;
  check_400(R"({"token_ids":[1,2,3],"sampling_params":{}})", "token_ids",
            "maximum context length is 3 tokens, but the prompt contains 3 input tokens", small);
  // An unknown model is a 404.
  const ApiError unknown = refused(R"({"model":"llama","token_ids":[1],"sampling_params":{}})");
  CHECK(unknown.status == 404);
  CHECK(unknown.param == "model");
  CHECK(unknown.message == "The model `llama` does not exist.");
  // Malformed JSON.
  CHECK(refused(R"({"token_ids":[1],)").code == "json_parse_error");
}

TEST_CASE("detokenizer-only and unknown keys are accepted and change nothing") {
  const GenerateRequest plain = ok(R"({"token_ids":[1],"sampling_params":{}})");
  const GenerateRequest extra = ok(
      R"({"token_ids":[1],"return_token_ids":true,"whatever":1,"model":"qwen",
          "sampling_params":{"skip_special_tokens":false,"include_stop_str_in_output":true,
          "detokenize":false,"output_kind":2,"return_token_ids":true,"mystery":[1],
          "stop":[],"n":1}})");
  CHECK(extra.sampling == plain.sampling);
  CHECK(extra.token_ids == plain.token_ids);
}

TEST_CASE("stream options, ids, salt, priority and kv_transfer_params are read") {
  const GenerateRequest request = ok(
      R"({"token_ids":[1],"stream":true,"stream_options":{"include_usage":true},
          "request_id":"abc","cache_salt":"s1","priority":-3,
          "kv_transfer_params":{"do_remote_decode":true},
          "sampling_params":{"vllm_xargs":{"x":1}}})");
  CHECK(request.stream);
  CHECK(request.include_usage);
  CHECK_FALSE(request.continuous_usage_stats);
  CHECK(request.request_id == "abc");
  CHECK(request.cache_salt == "s1");
  CHECK(request.priority == -3);
  // extra_args = {"x": 1, "kv_transfer_params": {"do_remote_decode": true}}
  CHECK(request.sampling.extra_args_msgpack ==
        std::string("\x82\xa1x\x01\xb2kv_transfer_params\x81\xb0"
                    "do_remote_decode\xc3",
                    42));
}

TEST_CASE("/v1/completions: the sampling keys at the top level, lowered the same way") {
  auto parsed = vllmd::api::parse_completion_request(
      R"({"prompt":[[5,6,7]],"max_tokens":9,"temperature":0.5,"top_k":-1,"logprobs":0,)"
      R"("return_token_ids":true,"return_tokens_as_token_ids":true,"stop_token_ids":[3],)"
      R"("vllm_xargs":{"x":1},"stream":true,"stream_options":{"include_usage":true}})",
      qwen());
  if (!parsed) FAIL(parsed.error().body());
  REQUIRE(parsed->prompts.size() == 1);  // [[...]]: one prompt
  const GenerateRequest& request = parsed->prompts[0];
  CHECK(request.token_ids == std::vector<std::int64_t>{5, 6, 7});
  CHECK(parsed->return_token_ids);
  CHECK(request.stream);
  CHECK(request.include_usage);
  CHECK(request.logprobs == 0);
  const auto& p = request.sampling;
  CHECK(p.max_tokens == 9);
  CHECK(p.temperature == 0.5);
  CHECK_FALSE(p.top_k.has_value());  // -1: no limit, not the model's 20
  CHECK(p.top_p == 0.8);             // generation_config.json's, as on the other route
  CHECK(p.stop_token_ids == std::vector<std::int64_t>{3, 151643});
  CHECK(p.extra_args_msgpack == std::string("\x81\xa1x\x01"));
  // Params are named as the client sent them: at the top level.
  auto error = [](const std::string& body) {
    auto refused_here = vllmd::api::parse_completion_request(body, qwen());
    REQUIRE_FALSE(refused_here.has_value());
    return refused_here.error();
  };
  CHECK(error(R"({"prompt":[1],"top_p":0})").param == "top_p");
  CHECK(error(R"({"prompt":[1],"min_tokens":-1})").param == "min_tokens");
  CHECK(error(R"({"prompt":[1],"return_token_ids":"yes"})").param == "return_token_ids");
  CHECK(error(R"({"prompt":[1],"bad_words":["x"]})").param == "bad_words");
  CHECK(error(R"({"prompt":[200000]})").param == "prompt");  // past the vocabulary
  CHECK(error(R"({"prompt":[1],"echo":false,"suffix":null,"logprobs":21})").param ==
        "logprobs");  // echo false and a null suffix are no refusal; 21 > max_logprobs
  CHECK(error(R"({"prompt":[[1],[2,-1]]})").param == "prompt");
  CHECK(error(R"({"prompt":[[1],7]})").param == "prompt");
  CHECK(error(R"({"prompt":[1],"n":257})").param == "n");
  CHECK(error(R"({"prompt":[[1],[2],[3],[4],[5]],"n":1000})").param == "n");
  CHECK(error(R"({"prompt":[[1],[2],[3],[4],[5],[6],[7],[8],[9],[10],[11],[12],[13],[14],)"
              R"([15],[16],[17]],"n":256})")
            .param == "prompt");  // 17 x 256 choices > 4096
}

TEST_CASE("/v1/completions: a batch is one request per prompt, each lowered for its length") {
  auto model = qwen();
  model.max_model_len = 10;
  auto parsed = vllmd::api::parse_completion_request(
      R"({"prompt":[[1,2,3],[4,5,6,7,8,9]],"n":3,"seed":4,"temperature":0.5})", model);
  if (!parsed) FAIL(parsed.error().body());
  REQUIRE(parsed->prompts.size() == 2);
  CHECK(parsed->prompts[0].token_ids == std::vector<std::int64_t>{1, 2, 3});
  CHECK(parsed->prompts[1].token_ids == std::vector<std::int64_t>{4, 5, 6, 7, 8, 9});
  for (const GenerateRequest& prompt : parsed->prompts) {
    CHECK(prompt.n == 3);
    CHECK(prompt.sampling.seed == 4);
    CHECK(prompt.sampling.temperature == 0.5);
  }
  // max_tokens is what each prompt leaves of the context.
  CHECK(parsed->prompts[0].sampling.max_tokens == 7);
  CHECK(parsed->prompts[1].sampling.max_tokens == 4);
  auto too_long =
      vllmd::api::parse_completion_request(R"({"prompt":[[1],[1,2,3,4,5,6,7,8,9,10]]})", model);
  REQUIRE_FALSE(too_long.has_value());
  CHECK(too_long.error().param == "prompt");
}
