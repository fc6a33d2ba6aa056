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

tl::expected<void, std::string> reload_weights(LlamaModel& model, const WeightSource& source) {
  if (source.directory.empty()) {
    return tl::unexpected(std::string("reload_weights: the model was not loaded from a directory"));
  }
  // All of it first, so that a file gone bad since the start leaves the model untouched.
  auto fresh = load_model(source.directory, source.format, source.dummy_seed);
  if (!fresh) return tl::unexpected("reload_weights: " + fresh.error());
  const auto& specs = model.parameters();
  const auto& loaded = (*fresh)->parameters();
  const bool same = std::equal(specs.begin(), specs.end(), loaded.begin(), loaded.end(),
                               [](const ParameterSpec& a, const ParameterSpec& b) {
                                 return a.name == b.name && a.shape == b.shape;
                               });
  if (!same) {
    return tl::unexpected("reload_weights: " + source.directory +
                          "/config.json no longer describes the running model");
  }
  for (const ParameterSpec& spec : specs) {
    auto set = model.set_parameter(spec.name, (*fresh)->parameter_dtype(spec.name), spec.shape,
                                   (*fresh)->parameter_bytes(spec.name));
    if (!set) return tl::unexpected("reload_weights: " + set.error());  // cannot: same specs
  }
  return {};
}

}  // namespace vllmd::reference
