#pragma once
// The reference engine's model from a Hugging Face model directory, loaded the way vLLM's
// --load-format names: "safetensors" reads the directory's safetensors file(s), "dummy" a
// seeded random initialisation (vLLM's dummy loader: every parameter uniform in ±1e-3), and
// "auto" is safetensors (the only weights format the reference engine reads).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <tl/expected.hpp>

#include "common/reference/llama.hpp"

namespace vllmd::reference {

enum class LoadFormat { kAuto, kSafetensors, kDummy };
bool parse_load_format(std::string_view text, LoadFormat& format);  // auto|safetensors|dummy

// Whether DIR holds safetensors weights (model.safetensors or its index).
bool has_safetensors(const std::string& directory);

// config.json, then the weights. Errors say what is wrong and where (file, tensor).
tl::expected<std::shared_ptr<LlamaModel>, std::string> load_model(const std::string& directory,
                                                                  LoadFormat format,
                                                                  std::uint64_t dummy_seed = 0);

// Where a running model's weights came from: what vLLM's reload_weights reads again.
struct WeightSource {
  std::string directory;  // empty: none (a model built in memory)
  LoadFormat format = LoadFormat::kAuto;
  std::uint64_t dummy_seed = 0;
};

// The source's weights again, into `model`; on any error `model` keeps what it held.
tl::expected<void, std::string> reload_weights(LlamaModel& model, const WeightSource& source);

}  // namespace vllmd::reference
