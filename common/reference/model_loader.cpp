#include "common/reference/model_loader.hpp"

#include <algorithm>
#include <filesystem>

#include "common/reference/safetensors.hpp"

namespace vllmd::reference {

namespace {

// Checkpoint entries that are not parameters: the rotary tables some Llama exports carry,
// which the model computes itself (vLLM skips them too).
bool ignored(std::string_view name) { return name.ends_with("rotary_emb.inv_freq"); }

tl::expected<void, std::string> load_safetensors(LlamaModel& model, const std::string& directory) {
  auto tensors = load_safetensors_directory(directory);
  if (!tensors) return tl::unexpected(tensors.error());
  for (const auto& [name, tensor] : *tensors) {
    if (ignored(name)) continue;
    // A tied checkpoint may still carry lm_head.weight; the embedding serves (as in vLLM).
    if (name == "lm_head.weight" && model.config().tie_word_embeddings) continue;
    if (auto loaded = model.set_parameter(name, tensor.dtype, tensor.shape, tensor.bytes);
        !loaded) {
      return tl::unexpected(directory + ": " + loaded.error());
    }
  }
  if (auto missing = model.unset(); !missing.empty()) {
    std::string names;
    for (std::size_t i = 0; i < missing.size() && i < 5; ++i) names += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) names += " and " + std::to_string(missing.size() - 5) + " more";
    return tl::unexpected(directory + ": the checkpoint lacks " + std::to_string(missing.size()) +
                          " of the model's parameters: " + names);
  }
  return {};
}

}  // namespace

bool has_safetensors(const std::string& directory) {
  std::error_code ignored_error;
  return std::filesystem::exists(directory + "/model.safetensors", ignored_error) ||
         std::filesystem::exists(directory + "/model.safetensors.index.json", ignored_error);
}

bool parse_load_format(std::string_view text, LoadFormat& format) {
  if (text == "auto")
    format = LoadFormat::kAuto;
  else if (text == "safetensors")
    format = LoadFormat::kSafetensors;
  else if (text == "dummy")
    format = LoadFormat::kDummy;
  else
    return false;
  return true;
}

tl::expected<std::shared_ptr<LlamaModel>, std::string> load_model(const std::string& directory,
                                                                  LoadFormat format,
                                                                  std::uint64_t dummy_seed) {
  auto config = load_llama_config(directory);
  if (!config) return tl::unexpected(config.error());
  auto model = std::make_shared<LlamaModel>(std::move(*config));
  if (format == LoadFormat::kDummy) {
    model->init_dummy(dummy_seed);
    return model;
  }
  if (auto loaded = load_safetensors(*model, directory); !loaded) {
    return tl::unexpected(loaded.error());
  }
  return model;
}

}  // namespace vllmd::reference
