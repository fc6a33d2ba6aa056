#include "common/reference/llama_config.hpp"

#include <fstream>
#include <sstream>

#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::reference {

namespace {

using Object = msgpack::object;
using Result = tl::expected<LlamaConfig, std::string>;

// Large enough for any small model this CPU engine can run in reasonable time; beyond it a
// typo (or a real 70B config) would only exhaust memory.
constexpr std::int64_t kMaxDimension = 1 << 20;

tl::unexpected<std::string> refuse(std::string why) { return tl::unexpected(std::move(why)); }

// A required positive integer, or the error naming it.
tl::expected<std::int64_t, std::string> dimension(const Object& root, std::string_view key,
                                                  std::optional<std::int64_t> fallback = {}) {
  const Object* value = wire::find_value(root, key);
  if (value == nullptr || value->type == msgpack::type::NIL) {
    if (fallback) return *fallback;
    return refuse("config.json has no '" + std::string(key) + "'");
  }
  const auto number = wire::as_int64(*value);
  if (!number || *number <= 0 || *number > kMaxDimension) {
    return refuse("config.json: '" + std::string(key) + "' must be an integer from 1 to " +
                  std::to_string(kMaxDimension));
  }
  return *number;
}

std::vector<std::int64_t> token_ids(const Object* value) {
  if (value == nullptr) return {};
  if (auto id = wire::as_int64(*value)) return {*id};
  std::vector<std::int64_t> ids;
  if (value->type != msgpack::type::ARRAY) return ids;
  for (std::uint32_t i = 0; i < value->via.array.size; ++i) {
    if (auto id = wire::as_int64(value->via.array.ptr[i])) ids.push_back(*id);
  }
  return ids;
}

// The features of LlamaConfig that change the computation and that the engine does not
// implement: refused rather than silently computed wrong.
std::optional<std::string> unsupported(const Object& root) {
  if (const Object* architectures = wire::find_value(root, "architectures");
      architectures != nullptr && architectures->type == msgpack::type::ARRAY) {
    for (std::uint32_t i = 0; i < architectures->via.array.size; ++i) {
      const auto name = wire::as_str(architectures->via.array.ptr[i]);
      if (!name || *name != "LlamaForCausalLM") {
        return "the reference engine runs LlamaForCausalLM only; config.json names " +
               std::string(name.value_or("a non-string architecture"));
      }
    }
  }
  if (const Object* type = wire::find_value(root, "model_type"); type != nullptr) {
    if (const auto name = wire::as_str(*type); !name || *name != "llama") {
      return "the reference engine runs model_type 'llama' only; config.json says '" +
             std::string(name.value_or("?")) + "'";
    }
  }
  if (const Object* scaling = wire::find_value(root, "rope_scaling");
      scaling != nullptr && scaling->type != msgpack::type::NIL) {
    return "config.json sets rope_scaling, which the reference engine does not implement";
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (const Object* bias = wire::find_value(root, key); bias != nullptr) {
      if (wire::as_bool(*bias).value_or(true)) {
        return std::string("config.json sets ") + key +
               ", and the reference engine's model has no biases";
      }
    }
  }
  if (const Object* act = wire::find_value(root, "hidden_act"); act != nullptr) {
    if (const auto name = wire::as_str(*act); !name || *name != "silu") {
      return "config.json: hidden_act must be 'silu' (the SwiGLU MLP), not '" +
             std::string(name.value_or("?")) + "'";
    }
  }
  return std::nullopt;
}

tl::expected<double, std::string> positive_real(const Object& root, std::string_view key,
                                                double fallback) {
  const Object* value = wire::find_value(root, key);
  if (value == nullptr || value->type == msgpack::type::NIL) return fallback;
  const auto number = wire::as_double(*value);
  if (!number || !(*number > 0)) {
    return refuse("config.json: '" + std::string(key) + "' must be a positive number");
  }
  return *number;
}

}  // namespace

Result parse_llama_config(std::string_view json) {
  auto transcoded = wire::json_to_msgpack(json);
  if (!transcoded) return refuse("config.json: " + transcoded.error().describe());
  if (transcoded->root != wire::JsonKind::kObject) return refuse("config.json: not a JSON object");
  auto handle = wire::decode(transcoded->msgpack.view());
  if (!handle) return refuse("config.json: " + handle.error());
  const Object& root = handle->get();
  if (auto why = unsupported(root)) return refuse(*why);

  LlamaConfig config;
  const auto read = [&](std::int64_t& into, std::string_view key,
                        std::optional<std::int64_t> fallback = {}) -> std::optional<std::string> {
    auto value = dimension(root, key, fallback);
    if (!value) return value.error();
    into = *value;
    return std::nullopt;
  };
  for (auto [into, key] :
       {std::pair{&config.vocab_size, "vocab_size"}, std::pair{&config.hidden_size, "hidden_size"},
        std::pair{&config.intermediate_size, "intermediate_size"},
        std::pair{&config.num_hidden_layers, "num_hidden_layers"},
        std::pair{&config.num_attention_heads, "num_attention_heads"}}) {
    if (auto error = read(*into, key)) return refuse(*error);
  }
  if (auto error =
          read(config.num_key_value_heads, "num_key_value_heads", config.num_attention_heads)) {
    return refuse(*error);
  }
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return refuse("config.json: num_attention_heads (" +
                  std::to_string(config.num_attention_heads) +
                  ") must be a multiple of num_key_value_heads (" +
                  std::to_string(config.num_key_value_heads) + ")");
  }
  const bool head_dim_given = wire::find_value(root, "head_dim") != nullptr;
  if (!head_dim_given && config.hidden_size % config.num_attention_heads != 0) {
    return refuse("config.json: hidden_size must be a multiple of num_attention_heads");
  }
  if (auto error =
          read(config.head_dim, "head_dim", config.hidden_size / config.num_attention_heads)) {
    return refuse(*error);
  }
  if (config.head_dim % 2 != 0) return refuse("config.json: head_dim must be even (rotary)");
  if (auto error = read(config.max_position_embeddings, "max_position_embeddings", 2048)) {
    return refuse(*error);
  }
  auto eps = positive_real(root, "rms_norm_eps", 1e-6);
  if (!eps) return refuse(eps.error());
  config.rms_norm_eps = *eps;
  auto theta = positive_real(root, "rope_theta", 10000.0);
  if (!theta) return refuse(theta.error());
  config.rope_theta = *theta;
  if (const Object* tie = wire::find_value(root, "tie_word_embeddings"); tie != nullptr) {
    config.tie_word_embeddings = wire::as_bool(*tie).value_or(false);
  }
  if (const Object* bos = wire::find_value(root, "bos_token_id"); bos != nullptr) {
    config.bos_token_id = wire::as_int64(*bos);
  }
  config.eos_token_ids = token_ids(wire::find_value(root, "eos_token_id"));
  return config;
}

Result load_llama_config(const std::string& directory) {
  const std::string path = directory + "/config.json";
  std::ifstream file(path, std::ios::binary);
  if (!file)
    return refuse("cannot read " + path + ": --model takes a Hugging Face model directory");
  std::ostringstream text;
  text << file.rdbuf();
  auto config = parse_llama_config(text.str());
  if (!config) return refuse(directory + ": " + config.error());
  return config;
}

}  // namespace vllmd::reference
