#include "tests/bench/payloads.hpp"

namespace vllmd::bench {

namespace {

// Deterministic pseudo-random numbers (splitmix64): the same body on every run.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = state_ += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_;
};

// Base64 of 3 * groups random bytes (no padding needed).
void append_base64(std::string& out, SplitMix64& random, int groups) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int g = 0; g < groups; ++g) {
    const std::uint64_t bits = random.next();
    for (int shift = 18; shift >= 0; shift -= 6) out.push_back(kAlphabet[(bits >> shift) & 63]);
  }
}

// Writes `"key":[item, item, ...]` with one item per tensor.
template <typename AppendItem> void append_list(std::string& out, std::string_view key,
                                                const std::vector<Tensor>& tensors,
                                                const AppendItem& append_item) {
  out += '"';
  out += key;
  out += "\":[";
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (i > 0) out += ',';
    append_item(tensors[i]);
  }
  out += ']';
}

// names, dtype_names and shapes: the metadata every backend sends.
void append_metadata(std::string& out, const std::vector<Tensor>& tensors) {
  append_list(out, "names", tensors, [&](const Tensor& t) { out += '"' + t.name + '"'; });
  out += ',';
  append_list(out, "dtype_names", tensors, [&](const Tensor&) { out += R"("bfloat16")"; });
  out += ',';
  append_list(out, "shapes", tensors, [&](const Tensor& t) {
    out += '[';
    for (std::size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) out += ',';
      out += std::to_string(t.shape[d]);
    }
    out += ']';
  });
}

}  // namespace

std::vector<Tensor> model_tensors(const MoeModel& m) {
  std::vector<Tensor> tensors;
  tensors.push_back({"model.embed_tokens.weight", {m.vocab, m.hidden}});
  for (std::int64_t layer = 0; layer < m.layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    tensors.push_back({prefix + "input_layernorm.weight", {1, m.hidden}});
    tensors.push_back({prefix + "self_attn.q_proj.weight", {m.heads, m.head_dim, m.hidden}});
    tensors.push_back({prefix + "self_attn.k_proj.weight", {m.kv_heads, m.head_dim, m.hidden}});
    tensors.push_back({prefix + "self_attn.v_proj.weight", {m.kv_heads, m.head_dim, m.hidden}});
    tensors.push_back({prefix + "self_attn.o_proj.weight", {m.hidden, m.heads * m.head_dim}});
    tensors.push_back({prefix + "self_attn.q_norm.weight", {1, m.head_dim}});
    tensors.push_back({prefix + "self_attn.k_norm.weight", {1, m.head_dim}});
    tensors.push_back({prefix + "post_attention_layernorm.weight", {1, m.hidden}});
    tensors.push_back({prefix + "mlp.gate.weight", {m.experts, m.hidden}});
    for (std::int64_t expert = 0; expert < m.experts; ++expert) {
      const std::string expert_prefix = prefix + "mlp.experts." + std::to_string(expert) + ".";
      tensors.push_back({expert_prefix + "gate_proj.weight", {m.moe_inner, m.hidden}});
      tensors.push_back({expert_prefix + "up_proj.weight", {m.moe_inner, m.hidden}});
      tensors.push_back({expert_prefix + "down_proj.weight", {m.hidden, m.moe_inner}});
    }
  }
  tensors.push_back({"model.norm.weight", {1, m.hidden}});
  tensors.push_back({"lm_head.weight", {m.vocab, m.hidden}});
  return tensors;
}

Body nccl_update_body(const MoeModel& model) {
  const std::vector<Tensor> tensors = model_tensors(model);
  Body body;
  body.tensors = tensors.size();
  body.json.reserve(tensors.size() * 96);
  body.json += R"({"update_info":{)";
  append_metadata(body.json, tensors);
  body.json += "}}";
  return body;
}

Body ipc_update_body(const MoeModel& model) {
  static_assert(kIpcHandleChars % 4 == 0);
  const std::vector<Tensor> tensors = model_tensors(model);
  SplitMix64 random(20250601);
  Body body;
  body.tensors = tensors.size();
  std::string& out = body.json;
  out.reserve(tensors.size() * (kIpcGpus * (kIpcHandleChars + 8) + 128));
  out += R"({"update_info":{)";
  append_metadata(out, tensors);
  out += ',';
  append_list(out, "tensor_sizes", tensors, [&](const Tensor& t) {
    std::int64_t bytes = 2;  // bfloat16
    for (std::int64_t extent : t.shape) bytes *= extent;
    out += std::to_string(bytes);
  });
  out += ',';
  append_list(out, "ipc_handles", tensors, [&](const Tensor&) {
    out += '{';
    for (int gpu = 0; gpu < kIpcGpus; ++gpu) {
      if (gpu > 0) out += ',';
      out += '"' + std::to_string(gpu) + "\":\"";
      append_base64(out, random, kIpcHandleChars / 4);
      out += '"';
    }
    out += '}';
  });
  out += "}}";
  return body;
}

const std::vector<PayloadKind>& payload_kinds() {
  static const std::vector<PayloadKind> kKinds = {
      {"nccl-30b", "nccl", [] { return nccl_update_body(kMoe30B); }},
      {"ipc-30b", "ipc", [] { return ipc_update_body(kMoe30B); }},
      {"ipc-235b", "ipc", [] { return ipc_update_body(kMoe235B); }},
  };
  return kKinds;
}

}  // namespace vllmd::bench
