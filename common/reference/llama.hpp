#pragma once
// A Llama decoder on the CPU, as Hugging Face's LlamaForCausalLM defines it (no rope scaling,
// no biases), every operation in float64: the reference engine's model when it is given one
// (--model). Parameters keep Hugging Face's names; weights arrive as float32, bfloat16,
// float16 or float64 bytes and are held as float64. One token at a time against a per-request
// KV cache, so a prompt is its tokens fed in order and a step is one more token.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "common/reference/llama_config.hpp"

namespace vllmd::reference {

// What the model holds about one request: keys and values of every position so far, per
// layer, rotary applied to the keys.
struct KvCache {
  std::vector<std::vector<double>> keys;    // [layer][position * kv_width + i]
  std::vector<std::vector<double>> values;  // the same layout
  std::size_t length = 0;                   // positions held
};

// One parameter: its Hugging Face name and shape ([out, in] for projections).
struct ParameterSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t elements() const;
};

class LlamaModel {
 public:
  // Zero weights; load them with set_parameter or init_dummy.
  explicit LlamaModel(LlamaConfig config);

  const LlamaConfig& config() const { return config_; }
  const std::vector<ParameterSpec>& parameters() const { return specs_; }

  // Whether `bytes` of `dtype` (torch's names: "float32", "torch.bfloat16", or safetensors'
  // "F32", "BF16", ...) with `shape` can be loaded into the parameter `name`; the error names
  // the tensor, as vLLM's loader would.
  tl::expected<void, std::string> check(std::string_view name, std::string_view dtype,
                                        std::span<const std::int64_t> shape) const;
  // Loads one parameter (after check): the bytes are little-endian, C order.
  tl::expected<void, std::string> set_parameter(std::string_view name, std::string_view dtype,
                                                std::span<const std::int64_t> shape,
                                                std::string_view bytes);
  // vLLM's dummy load format: every parameter uniform in [-1e-3, 1e-3] from `seed`, rounded
  // to float32 (the dtype dummy weights are held in).
  void init_dummy(std::uint64_t seed);
  // vLLM's reset_weights: every parameter random in [0, 1) (multiples of 1/256, which every
  // dtype holds exactly), so checksums and outputs change until weights are loaded again.
  void reset_weights(std::uint64_t seed);
  // A level-2 sleep: the weights are discarded; zeros until they are loaded again.
  void discard_weights();
  // The parameter as bytes of the dtype it was loaded from (the bytes a trainer sent, what
  // vLLM's compute_weight_checksums hashes); empty for a name the model lacks.
  std::string parameter_bytes(std::string_view name) const;
  // That dtype's name, as it was given ("float32" for dummy weights and for none).
  std::string parameter_dtype(std::string_view name) const;
  // Names of parameters never set (the tied lm_head excepted): a load that missed some.
  std::vector<std::string> unset() const;

  // Feeds `token` at position cache.length and appends its keys and values. With `logits`
  // (vocab_size entries) the next-token logits are written there; without, the lm_head is
  // skipped (a prompt token whose logits nobody reads).
  void forward(KvCache& cache, std::int64_t token, std::span<double> logits = {}) const;

 private:
  struct Layer {
    std::vector<double> input_norm, q, k, v, o, post_norm, gate, up, down;
  };
  // Where a parameter is held, as member pointers rather than addresses, so that a copied or
  // moved model finds its own storage.
  struct Slot {
    std::vector<double> LlamaModel::*top = nullptr;  // embed_, norm_, lm_head_; else a layer's
    std::size_t layer = 0;
    std::vector<double> Layer::*field = nullptr;
  };
  std::vector<double>& storage(const Slot& slot);
  const std::vector<double>& storage(const Slot& slot) const;
  std::vector<double>* find(std::string_view name);
  const std::vector<double>& head() const;

  LlamaConfig config_;
  std::vector<ParameterSpec> specs_;
  std::map<std::string, Slot, std::less<>> by_name_;
  // The dtype each parameter was loaded from, as set_parameter was given it; "" until set.
  std::map<std::string, std::string, std::less<>> loaded_dtype_;
  std::vector<double> embed_, norm_, lm_head_;
  std::vector<Layer> layers_;
  std::vector<double> inv_freq_;  // rope_theta^(-2i/head_dim)
  // Scratch for one token, reused: forward allocates only when a cache grows.
  mutable std::vector<double> x_, h_, q_, k_, v_, attn_, out_, gate_, up_, scores_;
};

// log_softmax of raw logits, in float64 (vLLM's default raw_logprobs).
void log_softmax(std::span<const double> logits, std::span<double> out);

}  // namespace vllmd::reference
