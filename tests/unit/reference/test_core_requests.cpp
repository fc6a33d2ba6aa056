// ReferenceCore with real requests in its scheduler: the pauses and cache resets see them, a
// pause in mode wait replies once they drained, and weight updates change the tokens.

#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "common/reference/llama.hpp"
#include "common/reference/tokens.hpp"
#include "tests/unit/reference/core_calls.hpp"

using namespace vllmd::reference;
using namespace vllmd::reference::testing;
namespace wire = vllmd::wire;

namespace {

void add(ReferenceCore& core, const std::string& id, std::int64_t max_tokens) {
  wire::EngineCoreRequest request;
  request.request_id = id;
  request.prompt_token_ids = {1, 2, 3};
  request.sampling_params = wire::SamplingParams{};
  request.sampling_params->max_tokens = max_tokens;
  REQUIRE(core.scheduler().add(std::move(request)));
}

}  // namespace

TEST_SUITE("reference_core_requests") {
  TEST_CASE("running requests hold blocks until they drain; a wait pause replies then") {
    ReferenceCore core(0, 1, Backend::kNccl);
    add(core, "r", 2);
    core.scheduler().step(0);
    CHECK(core.running_requests() == 1);
    CHECK(call(core, "reset_prefix_cache", "[]") == "false");
    CHECK(call(core, "pause_scheduler", R"(["wait",false])") == "null");
    CHECK(core.take_reply_when_idle());
    CHECK_FALSE(core.take_reply_when_idle());  // once
    CHECK(core.paused());
    core.scheduler().step(0);  // the last token
    CHECK(core.running_requests() == 0);
    CHECK(call(core, "reset_prefix_cache", "[]") == "true");
    // Nothing runs: a wait pause replies at once.
    CHECK(call(core, "pause_scheduler", R"(["wait",false])") == "null");
    CHECK_FALSE(core.take_reply_when_idle());
  }

  TEST_CASE("pause abort (the default) and sleep end the requests; wake_up resumes") {
    ReferenceCore core(0, 1, Backend::kNccl);
    add(core, "a", 10);
    core.scheduler().step(0);
    CHECK(call(core, "sleep", R"([1,"abort"])") == "null");
    CHECK(core.running_requests() == 0);
    const auto& step = core.scheduler().step(0);
    REQUIRE(step.outputs.size() == 1);
    CHECK(step.outputs[0].finish_reason == wire::FinishReason::kAbort);
    add(core, "queued", 1);
    CHECK_FALSE(core.scheduler().has_work());  // asleep: it waits
    CHECK(call(core, "wake_up", "[null]") == "true");
    CHECK(core.scheduler().has_work());
  }

  TEST_CASE("a finished weight-update session or a new version changes the fingerprint") {
    ReferenceCore core(0, 2, Backend::kNccl);
    const auto initial = core.scheduler().fingerprint();
    CHECK(initial == weights_fingerprint({}, "default", 0));
    CHECK(call(core, "get_weight_version", "[]") == "\"default\"");
    CHECK(core.scheduler().fingerprint() == initial);
    CHECK(rpc(core, "init_weight_transfer_engine",
              R"({"init_info":{"master_address":"127.0.0.1","master_port":1,"rank_offset":1,)"
              R"("world_size":3}})") == "[null,null]");
    CHECK(rpc(core, "start_weight_update") == "[null,null]");
    CHECK(core.scheduler().fingerprint() == initial);  // not before the session finished
    CHECK(rpc(core, "finish_weight_update") == "[null,null]");
    const auto after_session = core.scheduler().fingerprint();
    CHECK(after_session == weights_fingerprint({}, "default", 1));
    CHECK(call(core, "set_weight_version", R"(["v2"])") == "null");
    CHECK(core.scheduler().fingerprint() == weights_fingerprint({}, "v2", 1));
  }

  TEST_CASE("with a model, checksums cover its parameters; reset and a level-2 sleep reach it") {
    auto config = parse_llama_config(
        R"({"vocab_size":8,"hidden_size":4,"intermediate_size":8,"num_hidden_layers":1,)"
        R"("num_attention_heads":2})");
    REQUIRE(config);
    auto model = std::make_shared<LlamaModel>(*config);
    model->init_dummy(3);
    ReferenceCore core(0, 2, Backend::kTcp);
    core.set_model(model);
    const std::string dummy = rpc(core, "compute_weight_checksums");
    // Every worker lists every parameter (11 with an untied head) under its own prefix.
    CHECK(dummy.find("\"dp0:pp0:pcp0:tp0:ep0:model.layers.0.self_attn.q_proj.weight\"") !=
          std::string::npos);
    CHECK(dummy.find("\"dp0:pp0:pcp0:tp1:ep0:lm_head.weight\"") != std::string::npos);
    CHECK(rpc(core, "compute_weight_checksums") == dummy);
    const std::string embed = model->parameter_bytes("model.embed_tokens.weight");

    CHECK(rpc(core, "reset_weights") == "[null,null]");
    CHECK(model->parameter_bytes("model.embed_tokens.weight") != embed);
    const std::string reset = rpc(core, "compute_weight_checksums");
    CHECK(reset != dummy);

    CHECK(call(core, "sleep", R"([2,"abort"])") == "null");
    CHECK(model->parameter_bytes("model.embed_tokens.weight") == std::string(embed.size(), '\0'));
    CHECK(rpc(core, "compute_weight_checksums") != reset);
  }
}
