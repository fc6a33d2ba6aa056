#pragma once
// The part of a Hugging Face config.json (LlamaConfig) that the reference engine's model runs
// on, and the refusal of configs it cannot run: another architecture, rope scaling, biases,
// an activation other than SiLU.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

namespace vllmd::reference {

struct LlamaConfig {
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;  // num_attention_heads when the config has none
  std::int64_t head_dim = 0;             // hidden_size / num_attention_heads unless given
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;
};

// From config.json's text; errors say which key is wrong and why.
tl::expected<LlamaConfig, std::string> parse_llama_config(std::string_view json);
// From DIR/config.json; errors name the file.
tl::expected<LlamaConfig, std::string> load_llama_config(const std::string& directory);

}  // namespace vllmd::reference
