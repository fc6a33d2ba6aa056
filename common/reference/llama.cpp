#include "common/reference/llama.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace vllmd::reference {

namespace {

enum class Dtype { kFloat32, kBFloat16, kFloat16, kFloat64, kUnknown };

// Torch's names as trainers send them, and safetensors' names as files hold them.
Dtype dtype_of(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  if (name == "float32" || name == "float" || name == "F32") return Dtype::kFloat32;
  if (name == "bfloat16" || name == "BF16") return Dtype::kBFloat16;
  if (name == "float16" || name == "half" || name == "F16") return Dtype::kFloat16;
  if (name == "float64" || name == "double" || name == "F64") return Dtype::kFloat64;
  return Dtype::kUnknown;
}

std::size_t width(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat32: return 4;
    case Dtype::kBFloat16:
    case Dtype::kFloat16: return 2;
    case Dtype::kFloat64: return 8;
    case Dtype::kUnknown: break;
  }
  return 0;
}

double half_to_double(std::uint16_t bits) {
  const int sign = (bits >> 15) != 0 ? -1 : 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);  // subnormal
  if (exponent == 31) {
    return mantissa != 0 ? std::numeric_limits<double>::quiet_NaN()
                         : sign * std::numeric_limits<double>::infinity();
  }
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

double element(const char* at, Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat32: {
      float value = 0;
      std::memcpy(&value, at, 4);
      return value;
    }
    case Dtype::kBFloat16: {
      std::uint16_t high = 0;
      std::memcpy(&high, at, 2);
      const std::uint32_t bits = std::uint32_t{high} << 16;
      float value = 0;
      std::memcpy(&value, &bits, 4);
      return value;
    }
    case Dtype::kFloat16: {
      std::uint16_t bits = 0;
      std::memcpy(&bits, at, 2);
      return half_to_double(bits);
    }
    case Dtype::kFloat64: {
      double value = 0;
      std::memcpy(&value, at, 8);
      return value;
    }
    case Dtype::kUnknown: break;
  }
  return 0;
}

// float16 bits of a value float16 holds exactly (one it was loaded from, or a multiple of
// 1/256 below 1).
std::uint16_t half_bits(double value) {
  const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double magnitude = std::fabs(value);
  if (std::isnan(value)) return 0x7e00;
  if (std::isinf(value)) return sign | 0x7c00;
  if (magnitude < 0x1p-14) return sign | static_cast<std::uint16_t>(std::ldexp(magnitude, 24));
  int exponent = 0;
  const double fraction = std::frexp(magnitude, &exponent);  // [0.5, 1) * 2^exponent
  const auto mantissa = static_cast<std::uint16_t>(std::ldexp(fraction, 11) - 1024);
  return sign | static_cast<std::uint16_t>((exponent + 14) << 10) | mantissa;
}

// The inverse of element() for a value `dtype` holds exactly.
void append_element(std::string& out, double value, Dtype dtype) {
  char bytes[8];
  switch (dtype) {
    case Dtype::kFloat32: {
      const auto single = static_cast<float>(value);
      std::memcpy(bytes, &single, 4);
      break;
    }
    case Dtype::kBFloat16: {
      const auto single = static_cast<float>(value);
      std::uint32_t bits = 0;
      std::memcpy(&bits, &single, 4);
      const auto high = static_cast<std::uint16_t>(bits >> 16);
      std::memcpy(bytes, &high, 2);
      break;
    }
    case Dtype::kFloat16: {
      const std::uint16_t bits = half_bits(value);
      std::memcpy(bytes, &bits, 2);
      break;
    }
    case Dtype::kFloat64: std::memcpy(bytes, &value, 8); break;
    case Dtype::kUnknown: return;
  }
  out.append(bytes, width(dtype));
}

std::string shape_text(std::span<const std::int64_t> shape) {
  std::string text = "torch.Size([";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "])";
}

// y = W x with W [out, in] row-major, as nn.Linear computes x Wᵀ.
void linear(const std::vector<double>& weight, std::span<const double> x, std::span<double> y) {
  const std::size_t in = x.size();
  for (std::size_t o = 0; o < y.size(); ++o) {
    const double* row = weight.data() + o * in;
    double sum = 0;
    for (std::size_t i = 0; i < in; ++i) sum += row[i] * x[i];
    y[o] = sum;
  }
}

void rms_norm(std::span<const double> x, const std::vector<double>& weight, double eps,
              std::span<double> out) {
  double squares = 0;
  for (double value : x) squares += value * value;
  const double scale = 1.0 / std::sqrt(squares / static_cast<double>(x.size()) + eps);
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * weight[i];
}

// Hugging Face's rotate-half rotary embedding of one head at `position`.
void rotate(double* head, std::size_t head_dim, const std::vector<double>& inv_freq,
            std::size_t position) {
  const std::size_t half = head_dim / 2;
  for (std::size_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq[i];
    const double c = std::cos(angle);
    const double s = std::sin(angle);
    const double x1 = head[i];
    const double x2 = head[i + half];
    head[i] = x1 * c - x2 * s;
    head[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace

std::size_t ParameterSpec::elements() const {
  std::size_t count = 1;
  for (std::int64_t dim : shape) count *= static_cast<std::size_t>(dim);
  return count;
}

LlamaModel::LlamaModel(LlamaConfig config) : config_(std::move(config)) {
  const std::int64_t hidden = config_.hidden_size;
  const std::int64_t q_width = config_.num_attention_heads * config_.head_dim;
  const std::int64_t kv_width = config_.num_key_value_heads * config_.head_dim;
  const std::int64_t inner = config_.intermediate_size;
  layers_.resize(static_cast<std::size_t>(config_.num_hidden_layers));
  const auto add = [&](std::string name, std::vector<std::int64_t> shape, Slot slot) {
    ParameterSpec spec{std::move(name), std::move(shape)};
    storage(slot).assign(spec.elements(), 0.0);
    by_name_[spec.name] = slot;
    loaded_dtype_[spec.name] = "";
    specs_.push_back(std::move(spec));
  };
  add("model.embed_tokens.weight", {config_.vocab_size, hidden}, {&LlamaModel::embed_});
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    const auto in_layer = [i](std::vector<double> Layer::*field) {
      return Slot{nullptr, i, field};
    };
    add(prefix + "input_layernorm.weight", {hidden}, in_layer(&Layer::input_norm));
    add(prefix + "self_attn.q_proj.weight", {q_width, hidden}, in_layer(&Layer::q));
    add(prefix + "self_attn.k_proj.weight", {kv_width, hidden}, in_layer(&Layer::k));
    add(prefix + "self_attn.v_proj.weight", {kv_width, hidden}, in_layer(&Layer::v));
    add(prefix + "self_attn.o_proj.weight", {hidden, q_width}, in_layer(&Layer::o));
    add(prefix + "post_attention_layernorm.weight", {hidden}, in_layer(&Layer::post_norm));
    add(prefix + "mlp.gate_proj.weight", {inner, hidden}, in_layer(&Layer::gate));
    add(prefix + "mlp.up_proj.weight", {inner, hidden}, in_layer(&Layer::up));
    add(prefix + "mlp.down_proj.weight", {hidden, inner}, in_layer(&Layer::down));
  }
  add("model.norm.weight", {hidden}, {&LlamaModel::norm_});
  if (!config_.tie_word_embeddings) {
    add("lm_head.weight", {config_.vocab_size, hidden}, {&LlamaModel::lm_head_});
  }

  const auto head_dim = static_cast<std::size_t>(config_.head_dim);
  for (std::size_t i = 0; i < head_dim / 2; ++i) {
    inv_freq_.push_back(1.0 / std::pow(config_.rope_theta,
                                       static_cast<double>(2 * i) / static_cast<double>(head_dim)));
  }
  x_.resize(static_cast<std::size_t>(hidden));
  h_.resize(x_.size());
  out_.resize(x_.size());
  q_.resize(static_cast<std::size_t>(q_width));
  attn_.resize(q_.size());
  k_.resize(static_cast<std::size_t>(kv_width));
  v_.resize(k_.size());
  gate_.resize(static_cast<std::size_t>(inner));
  up_.resize(gate_.size());
}

std::vector<double>& LlamaModel::storage(const Slot& slot) {
  return slot.top != nullptr ? this->*slot.top : layers_[slot.layer].*slot.field;
}

const std::vector<double>& LlamaModel::storage(const Slot& slot) const {
  return slot.top != nullptr ? this->*slot.top : layers_[slot.layer].*slot.field;
}

std::vector<double>* LlamaModel::find(std::string_view name) {
  const auto found = by_name_.find(name);
  return found == by_name_.end() ? nullptr : &storage(found->second);
}

const std::vector<double>& LlamaModel::head() const {
  return config_.tie_word_embeddings ? embed_ : lm_head_;
}

tl::expected<void, std::string> LlamaModel::check(std::string_view name, std::string_view dtype,
                                                  std::span<const std::int64_t> shape) const {
  const auto spec = std::find_if(specs_.begin(), specs_.end(),
                                 [&](const ParameterSpec& s) { return s.name == name; });
  if (spec == specs_.end()) {
    return tl::unexpected("KeyError: '" + std::string(name) +
                          "': the model has no parameter of that name");
  }
  if (!std::equal(shape.begin(), shape.end(), spec->shape.begin(), spec->shape.end())) {
    return tl::unexpected("AssertionError: Attempted to load weight (" + shape_text(shape) +
                          ") into parameter (" + shape_text(spec->shape) + ") " +
                          std::string(name));
  }
  if (dtype_of(dtype) == Dtype::kUnknown) {
    return tl::unexpected("tensor " + std::string(name) + ": cannot load dtype '" +
                          std::string(dtype) +
                          "' into a floating-point parameter (float32, bfloat16, float16 or "
                          "float64)");
  }
  return {};
}

tl::expected<void, std::string> LlamaModel::set_parameter(std::string_view name,
                                                          std::string_view dtype,
                                                          std::span<const std::int64_t> shape,
                                                          std::string_view bytes) {
  if (auto checked = check(name, dtype, shape); !checked) return checked;
  std::vector<double>& storage = *find(name);
  const Dtype type = dtype_of(dtype);
  if (bytes.size() != storage.size() * width(type)) {
    return tl::unexpected("tensor " + std::string(name) + ": " + std::to_string(bytes.size()) +
                          " bytes for " + std::to_string(storage.size()) + " elements of " +
                          std::string(dtype));
  }
  for (std::size_t i = 0; i < storage.size(); ++i) {
    storage[i] = element(bytes.data() + i * width(type), type);
  }
  loaded_dtype_.find(name)->second = std::string(dtype);
  return {};
}

void LlamaModel::init_dummy(std::uint64_t seed) {
  std::mt19937_64 random(seed);
  for (const ParameterSpec& spec : specs_) {
    for (double& value : *find(spec.name)) {
      const double unit = static_cast<double>(random() >> 11) * 0x1p-53;  // [0, 1)
      value = static_cast<float>(-1e-3 + 2e-3 * unit);
    }
    loaded_dtype_[spec.name] = "float32";
  }
}

void LlamaModel::reset_weights(std::uint64_t seed) {
  std::mt19937_64 random(seed);
  for (const ParameterSpec& spec : specs_) {
    for (double& value : *find(spec.name)) value = static_cast<double>(random() >> 56) / 256.0;
  }
}

void LlamaModel::discard_weights() {
  for (const ParameterSpec& spec : specs_) {
    std::vector<double>& values = *find(spec.name);
    std::fill(values.begin(), values.end(), 0.0);
  }
}

std::string LlamaModel::parameter_dtype(std::string_view name) const {
  const auto found = loaded_dtype_.find(name);
  // Never loaded: zeros, held as float32 as dummy weights are.
  return found == loaded_dtype_.end() || found->second.empty() ? "float32" : found->second;
}

std::string LlamaModel::parameter_bytes(std::string_view name) const {
  const auto found = by_name_.find(name);
  if (found == by_name_.end()) return {};
  const Dtype dtype = dtype_of(parameter_dtype(name));
  std::string bytes;
  bytes.reserve(storage(found->second).size() * width(dtype));
  for (double value : storage(found->second)) append_element(bytes, value, dtype);
  return bytes;
}

std::vector<std::string> LlamaModel::unset() const {
  std::vector<std::string> names;
  for (const auto& [name, dtype] : loaded_dtype_) {
    if (dtype.empty()) names.push_back(name);
  }
  return names;
}

void LlamaModel::forward(KvCache& cache, std::int64_t token, std::span<double> logits) const {
  const auto vocab = config_.vocab_size;
  token %= vocab;
  if (token < 0) token += vocab;  // out of range ids wrap, as the token formula's do
  const std::size_t hidden = x_.size();
  const auto head_dim = static_cast<std::size_t>(config_.head_dim);
  const auto heads = static_cast<std::size_t>(config_.num_attention_heads);
  const auto kv_heads = static_cast<std::size_t>(config_.num_key_value_heads);
  const std::size_t group = heads / kv_heads;
  const std::size_t kv_width = k_.size();
  const std::size_t position = cache.length;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (cache.keys.size() != layers_.size()) {
    cache.keys.resize(layers_.size());
    cache.values.resize(layers_.size());
  }

  std::copy_n(
      embed_.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(token) * hidden),
      hidden, x_.begin());
  scores_.resize(position + 1);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    rms_norm(x_, layer.input_norm, config_.rms_norm_eps, h_);
    linear(layer.q, h_, q_);
    linear(layer.k, h_, k_);
    linear(layer.v, h_, v_);
    for (std::size_t h = 0; h < heads; ++h)
      rotate(&q_[h * head_dim], head_dim, inv_freq_, position);
    for (std::size_t h = 0; h < kv_heads; ++h)
      rotate(&k_[h * head_dim], head_dim, inv_freq_, position);
    std::vector<double>& keys = cache.keys[l];
    std::vector<double>& values = cache.values[l];
    keys.resize(position * kv_width);  // drop what a failed step may have left
    values.resize(position * kv_width);
    keys.insert(keys.end(), k_.begin(), k_.end());
    values.insert(values.end(), v_.begin(), v_.end());

    for (std::size_t h = 0; h < heads; ++h) {
      const double* query = &q_[h * head_dim];
      const std::size_t offset = (h / group) * head_dim;
      double top = -std::numeric_limits<double>::infinity();
      for (std::size_t t = 0; t <= position; ++t) {
        const double* key = &keys[t * kv_width + offset];
        double dot = 0;
        for (std::size_t i = 0; i < head_dim; ++i) dot += query[i] * key[i];
        scores_[t] = dot * scale;
        top = std::max(top, scores_[t]);
      }
      double total = 0;
      for (std::size_t t = 0; t <= position; ++t) {
        scores_[t] = std::exp(scores_[t] - top);
        total += scores_[t];
      }
      double* out = &attn_[h * head_dim];
      std::fill_n(out, head_dim, 0.0);
      for (std::size_t t = 0; t <= position; ++t) {
        const double weight = scores_[t] / total;
        const double* value = &values[t * kv_width + offset];
        for (std::size_t i = 0; i < head_dim; ++i) out[i] += weight * value[i];
      }
    }
    linear(layer.o, attn_, out_);
    for (std::size_t i = 0; i < hidden; ++i) x_[i] += out_[i];

    rms_norm(x_, layer.post_norm, config_.rms_norm_eps, h_);
    linear(layer.gate, h_, gate_);
    linear(layer.up, h_, up_);
    for (std::size_t i = 0; i < gate_.size(); ++i) {
      gate_[i] = gate_[i] / (1.0 + std::exp(-gate_[i])) * up_[i];  // silu(gate) * up
    }
    linear(layer.down, gate_, out_);
    for (std::size_t i = 0; i < hidden; ++i) x_[i] += out_[i];
  }
  cache.length = position + 1;
  if (logits.empty()) return;
  rms_norm(x_, norm_, config_.rms_norm_eps, h_);
  linear(head(), h_, logits);
}

void log_softmax(std::span<const double> logits, std::span<double> out) {
  double top = -std::numeric_limits<double>::infinity();
  for (double value : logits) top = std::max(top, value);
  double total = 0;
  for (double value : logits) total += std::exp(value - top);
  const double log_total = top + std::log(total);
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_total;
}

}  // namespace vllmd::reference
