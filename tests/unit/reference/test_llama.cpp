// The reference engine's Llama: config.json accepted and refused, parameters checked by name,
// shape and dtype, dtype conversions, and the forward pass on weights small enough to work
// out by hand (tests/integration/daemon/test_model_alignment.py checks it against an
// independent model in full).

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/reference/llama.hpp"
#include "common/reference/llama_config.hpp"

using namespace vllmd::reference;

namespace {

std::string tiny_config(const std::string& extra = "") {
  return R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":3,)"
         R"("hidden_size":2,"intermediate_size":1,"num_hidden_layers":1,)"
         R"("num_attention_heads":1,"rms_norm_eps":1e-6,"eos_token_id":[2,1])" +
         extra + "}";
}

std::string float32_bytes(const std::vector<double>& values) {
  std::string bytes(values.size() * 4, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto value = static_cast<float>(values[i]);
    std::memcpy(bytes.data() + i * 4, &value, 4);
  }
  return bytes;
}

void set(LlamaModel& model, const std::string& name, const std::vector<double>& values) {
  for (const ParameterSpec& spec : model.parameters()) {
    if (spec.name != name) continue;
    REQUIRE(spec.elements() == values.size());
    auto done = model.set_parameter(name, "float32", spec.shape, float32_bytes(values));
    REQUIRE_MESSAGE(done, done.error());
    return;
  }
  FAIL("no parameter " << name);
}

// RMSNorm of x with weight w, as the definition reads.
std::vector<double> norm(const std::vector<double>& x, const std::vector<double>& w) {
  const double rms = std::sqrt((x[0] * x[0] + x[1] * x[1]) / 2 + 1e-6);
  return {x[0] / rms * w[0], x[1] / rms * w[1]};
}

}  // namespace

TEST_SUITE("reference_llama") {
  TEST_CASE("config.json: defaults, and what the engine cannot run is refused by name") {
    auto config = parse_llama_config(tiny_config());
    REQUIRE_MESSAGE(config, config.error());
    CHECK(config->num_key_value_heads == 1);  // num_attention_heads when absent
    CHECK(config->head_dim == 2);             // hidden_size / num_attention_heads
    CHECK(config->rope_theta == 10000.0);
    CHECK(config->eos_token_ids == std::vector<std::int64_t>{2, 1});
    CHECK(parse_llama_config(tiny_config(R"(,"head_dim":4)"))->head_dim == 4);

    const auto refused = [](const std::string& extra, const std::string& words) {
      auto result = parse_llama_config(tiny_config(extra));
      REQUIRE_FALSE(result);
      CAPTURE(result.error());
      CHECK(result.error().find(words) != std::string::npos);
    };
    refused(R"(,"rope_scaling":{"type":"linear","factor":2.0})", "rope_scaling");
    refused(R"(,"attention_bias":true)", "attention_bias");
    refused(R"(,"hidden_act":"gelu")", "hidden_act");
    refused(R"(,"num_key_value_heads":2,"num_attention_heads":3)",
            "multiple of num_key_value_heads");
    auto other = parse_llama_config(R"({"architectures":["MistralForCausalLM"],"vocab_size":3})");
    REQUIRE_FALSE(other);
    CHECK(other.error().find("MistralForCausalLM") != std::string::npos);
    auto missing = parse_llama_config(R"({"vocab_size":3,"hidden_size":2})");
    REQUIRE_FALSE(missing);
    CHECK(missing.error().find("intermediate_size") != std::string::npos);
  }

  TEST_CASE("parameters carry Hugging Face's names; a misfit is refused naming the tensor") {
    LlamaModel model(*parse_llama_config(tiny_config()));
    std::vector<std::string> names;
    for (const ParameterSpec& spec : model.parameters()) names.push_back(spec.name);
    CHECK(names ==
          std::vector<std::string>{
              "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
              "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
              "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
              "model.layers.0.post_attention_layernorm.weight",
              "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
              "model.layers.0.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"});
    CHECK(model.unset().size() == names.size());
    const std::vector<std::int64_t> shape{3, 2};
    auto unknown = model.check("model.layers.7.mlp.up_proj.weight", "float32", shape);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().find("'model.layers.7.mlp.up_proj.weight'") != std::string::npos);
    const std::vector<std::int64_t> wrong{2, 3};
    auto misshapen = model.check("lm_head.weight", "float32", wrong);
    REQUIRE_FALSE(misshapen);
    CHECK(misshapen.error() ==
          "AssertionError: Attempted to load weight (torch.Size([2, 3])) into parameter "
          "(torch.Size([3, 2])) lm_head.weight");
    auto integer = model.check("lm_head.weight", "int64", shape);
    REQUIRE_FALSE(integer);
    CHECK(integer.error().find("lm_head.weight") != std::string::npos);
    CHECK(model.check("lm_head.weight", "torch.bfloat16", shape));
    LlamaModel tied(*parse_llama_config(tiny_config(R"(,"tie_word_embeddings":true)")));
    CHECK(tied.parameters().back().name == "model.norm.weight");
  }

  TEST_CASE("residual, norms, attention over the cache, the MLP and the head, by hand") {
    LlamaModel model(*parse_llama_config(tiny_config()));
    const std::vector<std::vector<double>> embed{{3, 4}, {-1, 2}, {0.5, -0.25}};
    set(model, "model.embed_tokens.weight", {3, 4, -1, 2, 0.5, -0.25});
    const std::vector<double> w_in{1, 2};
    set(model, "model.layers.0.input_layernorm.weight", w_in);
    // q and k zero: every score is 0, so attention averages the values of the positions so far.
    set(model, "model.layers.0.self_attn.q_proj.weight", {0, 0, 0, 0});
    set(model, "model.layers.0.self_attn.k_proj.weight", {0, 0, 0, 0});
    set(model, "model.layers.0.self_attn.v_proj.weight", {1, 0, 0, 1});
    set(model, "model.layers.0.self_attn.o_proj.weight", {1, 0, 0, 1});
    const std::vector<double> w_post{0.5, 1};
    set(model, "model.layers.0.post_attention_layernorm.weight", w_post);
    set(model, "model.layers.0.mlp.gate_proj.weight", {0.25, -0.125});  // exact in float32
    set(model, "model.layers.0.mlp.up_proj.weight", {1, 1});
    set(model, "model.layers.0.mlp.down_proj.weight", {2, -1});
    const std::vector<double> w_final{1, 0.5};
    set(model, "model.norm.weight", w_final);
    set(model, "lm_head.weight", {1, 0, 0, 1, 1, 1});
    CHECK(model.unset().empty());

    const auto expected_logits = [&](const std::vector<double>& attended,
                                     const std::vector<double>& x) {
      std::vector<double> h{x[0] + attended[0], x[1] + attended[1]};
      const auto n = norm(h, w_post);
      const double gate = 0.25 * n[0] - 0.125 * n[1];
      const double act = gate / (1 + std::exp(-gate)) * (n[0] + n[1]);
      h = {h[0] + 2 * act, h[1] - act};
      const auto f = norm(h, w_final);
      return std::vector<double>{f[0], f[1], f[0] + f[1]};
    };
    KvCache cache;
    std::vector<double> logits(3);
    model.forward(cache, 0, logits);
    const auto v0 = norm(embed[0], w_in);
    auto expected = expected_logits(v0, embed[0]);
    for (int i = 0; i < 3; ++i) CHECK(logits[i] == doctest::Approx(expected[i]).epsilon(1e-12));

    model.forward(cache, 1, logits);
    CHECK(cache.length == 2);
    const auto v1 = norm(embed[1], w_in);
    expected = expected_logits({(v0[0] + v1[0]) / 2, (v0[1] + v1[1]) / 2}, embed[1]);
    for (int i = 0; i < 3; ++i) CHECK(logits[i] == doctest::Approx(expected[i]).epsilon(1e-12));
  }

  TEST_CASE("bfloat16 and float16 bytes load as the values they hold") {
    LlamaModel model(*parse_llama_config(tiny_config(R"(,"tie_word_embeddings":true)")));
    // embed = [[1.0, -2.5], [0.15625, 3.0], [0, 65504]] in each encoding.
    const std::vector<std::uint16_t> bf16{0x3F80, 0xC020, 0x3E20, 0x4040, 0x0000, 0x477F};
    const std::vector<std::uint16_t> f16{0x3C00, 0xC100, 0x3100, 0x4200, 0x0000, 0x7BFF};
    const std::vector<std::int64_t> shape{3, 2};
    for (const auto* bits : {&bf16, &f16}) {
      std::string bytes(12, '\0');
      std::memcpy(bytes.data(), bits->data(), 12);
      REQUIRE(model.set_parameter("model.embed_tokens.weight",
                                  bits == &bf16 ? "bfloat16" : "float16", shape, bytes));
      // With every other weight zero but the final norm, logits are embed · norm(embed[t]).
      set(model, "model.norm.weight", {1, 1});
      KvCache cache;
      std::vector<double> logits(3);
      model.forward(cache, 1, logits);
      const double high = bits == &bf16 ? 65280.0 : 65504.0;  // 0x477F is bf16 65280
      const std::vector<std::vector<double>> embed{{1.0, -2.5}, {0.15625, 3.0}, {0, high}};
      const auto n = norm(embed[1], {1, 1});
      for (int t = 0; t < 3; ++t) {
        CAPTURE(t);
        CHECK(logits[t] == doctest::Approx(embed[t][0] * n[0] + embed[t][1] * n[1]).epsilon(1e-12));
      }
    }
  }

  TEST_CASE("a parameter's bytes are the bytes it was loaded from; reset and discard change them") {
    LlamaModel model(*parse_llama_config(tiny_config(R"(,"tie_word_embeddings":true)")));
    const std::vector<std::int64_t> shape{3, 2};
    // Normal, subnormal, negative, zero and large values in each dtype's own encoding.
    const std::vector<std::pair<std::string, std::vector<std::uint8_t>>> encodings{
        {"torch.float16", {0x00, 0x3C, 0x01, 0x00, 0x00, 0xC1, 0x00, 0x80, 0xFF, 0x7B, 0x55, 0x35}},
        {"BF16", {0x80, 0x3F, 0x01, 0x00, 0x20, 0xC0, 0x00, 0x80, 0x7F, 0x47, 0xAB, 0x3E}},
        {"float32", std::vector<std::uint8_t>(24, 0x3D)},
        {"float64", std::vector<std::uint8_t>(48, 0x01)}};
    for (const auto& encoding : encodings) {
      const std::string& dtype = encoding.first;
      CAPTURE(dtype);
      const std::string bytes(encoding.second.begin(), encoding.second.end());
      REQUIRE(model.set_parameter("model.embed_tokens.weight", dtype, shape, bytes));
      CHECK(model.parameter_bytes("model.embed_tokens.weight") == bytes);
    }
    // Never loaded: zeros, as float32.
    CHECK(model.parameter_bytes("model.norm.weight") == std::string(8, '\0'));
    CHECK(model.parameter_bytes("lm_head.weight").empty());  // tied: no such parameter

    model.init_dummy(7);
    const std::string dummy = model.parameter_bytes("model.embed_tokens.weight");
    CHECK(dummy.size() == 24);  // float32
    model.reset_weights(1);
    const std::string reset = model.parameter_bytes("model.embed_tokens.weight");
    CHECK(reset != dummy);
    for (std::size_t i = 0; i < 6; ++i) {
      float value = 0;
      std::memcpy(&value, reset.data() + i * 4, 4);
      CHECK(value >= 0.0F);
      CHECK(value < 1.0F);
      CHECK(value * 256 == std::floor(value * 256));
    }
    model.reset_weights(2);
    CHECK(model.parameter_bytes("model.embed_tokens.weight") != reset);
    model.discard_weights();
    CHECK(model.parameter_bytes("model.embed_tokens.weight") == std::string(24, '\0'));
  }
}
