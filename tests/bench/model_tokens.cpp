// The reference engine's model speed: tokens per second from the scheduler generating with a
// Llama (dummy weights), without sockets, so the figure is the model's own. The size
// by default: hidden 64, 2 layers, vocabulary 512.
//
//   build/tests/bench/model_tokens [--requests N] [--tokens N] [--prompt N] [--hidden N]
//                                  [--layers N] [--vocab N] [--rounds N]
//
// Prints one JSON line per round and the median.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "common/reference/llama.hpp"
#include "common/reference/scheduler.hpp"

namespace {

using namespace vllmd::reference;

double round_tokens_per_second(const LlamaModel& model, int requests, int tokens, int prompt,
                               bool sample) {
  SchedulerOptions options;
  options.max_model_len = prompt + tokens + 1;
  Scheduler scheduler(options);
  scheduler.set_model(&model);
  for (int r = 0; r < requests; ++r) {
    vllmd::wire::EngineCoreRequest request;
    request.request_id = "r" + std::to_string(r);
    for (int i = 0; i < prompt; ++i) request.prompt_token_ids.push_back((r * 31 + i * 7) % 500);
    vllmd::wire::SamplingParams params;
    params.max_tokens = tokens;
    params.temperature = sample ? 1.0 : 0.0;
    params.logprobs = 1;
    params.seed = r;
    request.sampling_params = params;
    scheduler.add(std::move(request));
  }
  const auto begin = std::chrono::steady_clock::now();
  std::size_t generated = 0;
  while (scheduler.has_work()) {
    for (const auto& output : scheduler.step(0).outputs) generated += output.new_token_ids.size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return static_cast<double>(generated) / seconds;
}

int run(int argc, char** argv) {
  CLI::App app{"The reference engine's Llama: generated tokens per second"};
  int requests = 16, tokens = 128, prompt = 16, hidden = 64, layers = 2, vocab = 512, rounds = 5;
  bool sample = false;
  app.add_option("--requests", requests, "Requests running together")->capture_default_str();
  app.add_option("--tokens", tokens, "Tokens generated per request")->capture_default_str();
  app.add_option("--prompt", prompt, "Prompt length")->capture_default_str();
  app.add_option("--hidden", hidden, "hidden_size")->capture_default_str();
  app.add_option("--layers", layers, "num_hidden_layers")->capture_default_str();
  app.add_option("--vocab", vocab, "vocab_size")->capture_default_str();
  app.add_option("--rounds", rounds, "Rounds; the median is reported")->capture_default_str();
  app.add_flag("--sample", sample, "Temperature 1 sampling instead of greedy");
  CLI11_PARSE(app, argc, argv);

  const std::string json = "{\"vocab_size\":" + std::to_string(vocab) +
                           ",\"hidden_size\":" + std::to_string(hidden) +
                           ",\"intermediate_size\":" + std::to_string(2 * hidden) +
                           ",\"num_hidden_layers\":" + std::to_string(layers) +
                           ",\"num_attention_heads\":4,\"num_key_value_heads\":2}";
  auto config = parse_llama_config(json);
  if (!config) {
    std::fprintf(stderr, "%s\n", config.error().c_str());
    return 2;
  }
  LlamaModel model(*config);
  model.init_dummy(1234);
  std::vector<double> results;
  for (int round = 0; round < rounds; ++round) {
    results.push_back(round_tokens_per_second(model, requests, tokens, prompt, sample));
    std::printf("{\"round\":%d,\"tokens_per_second\":%.0f}\n", round, results.back());
  }
  std::sort(results.begin(), results.end());
  std::printf(
      "{\"median_tokens_per_second\":%.0f,\"requests\":%d,\"tokens\":%d,\"hidden\":%d,"
      "\"layers\":%d,\"vocab\":%d,\"sample\":%s}\n",
      results[results.size() / 2], requests, tokens, hidden, layers, vocab,
      sample ? "true" : "false");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "model_tokens: %s\n", error.what());
    return 1;
  }
}
