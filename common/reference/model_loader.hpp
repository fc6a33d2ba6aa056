#pragma once
// The reference engine's model from a Hugging Face model directory, loaded the way vLLM's
// --load-format names: "safetensors" reads the directory's safetensors file(s), "dummy" a
// seeded random initialisation (vLLM's dummy loader: every parameter uniform in ±1e-3), and
// "auto" is safetensors (the only weights format the reference engine reads).

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

}  // namespace vllmd::reference
