#include "common/api/model_info.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

namespace {

using Object = msgpack::object;

std::optional<double> number(const Object& object, std::string_view key) {
  const Object* value = wire::find_value(object, key);
  return value == nullptr ? std::nullopt : wire::as_double(*value);
}

std::optional<std::int64_t> integer(const Object& object, std::string_view key) {
  const Object* value = wire::find_value(object, key);
  return value == nullptr ? std::nullopt : wire::as_int64(*value);
}

// eos_token_id: one id or a list of them.
std::vector<std::int64_t> eos_ids(const Object& object) {
  const Object* value = wire::find_value(object, "eos_token_id");
  if (value == nullptr) return {};
  if (auto id = wire::as_int64(*value)) return {*id};
  std::vector<std::int64_t> ids;
  if (value->type == msgpack::type::ARRAY) {
    for (std::uint32_t i = 0; i < value->via.array.size; ++i) {
      if (auto id = wire::as_int64(value->via.array.ptr[i]); id && *id >= 0) ids.push_back(*id);
    }
  }
  return ids;
}

tl::expected<msgpack::object_handle, std::string> parse(std::string_view text,
                                                        std::string_view file,
                                                        wire::Transcoded& holder) {
  auto transcoded = wire::json_to_msgpack(text);
  if (!transcoded) {
    return tl::unexpected(std::string(file) + ": " + transcoded.error().describe());
  }
  if (transcoded->root != wire::JsonKind::kObject) {
    return tl::unexpected(std::string(file) + ": not a JSON object");
  }
  holder = std::move(*transcoded);
  auto handle = wire::decode(holder.msgpack.view());
  if (!handle) return tl::unexpected(std::string(file) + ": " + handle.error());
  return std::move(*handle);
}

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

tl::expected<ModelInfo, std::string> model_info_from_json(std::string_view config,
                                                          std::string_view generation_config,
                                                          std::string name) {
  ModelInfo model;
  model.name = std::move(name);
  wire::Transcoded config_holder;
  auto config_object = parse(config, "config.json", config_holder);
  if (!config_object) return tl::unexpected(config_object.error());
  const Object& root = config_object->get();
  // Multimodal wrappers keep the language model's values under text_config.
  const Object* text = wire::find_value(root, "text_config");
  model.vocab_size = integer(root, "vocab_size");
  if (!model.vocab_size && text != nullptr) model.vocab_size = integer(*text, "vocab_size");
  std::vector<std::int64_t> eos = eos_ids(root);
  if (eos.empty() && text != nullptr) eos = eos_ids(*text);

  if (!generation_config.empty()) {
    wire::Transcoded generation_holder;
    auto generation = parse(generation_config, "generation_config.json", generation_holder);
    if (!generation) return tl::unexpected(generation.error());
    const Object& defaults = generation->get();
    for (std::int64_t id : eos_ids(defaults)) {
      if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    }
    model.temperature = number(defaults, "temperature");
    model.top_p = number(defaults, "top_p");
    model.top_k = integer(defaults, "top_k");
    model.min_p = number(defaults, "min_p");
    model.repetition_penalty = number(defaults, "repetition_penalty");
    model.max_new_tokens = integer(defaults, "max_new_tokens");
  }
  // The first id is the primary EOS (config.json's own, when it has one), the rest extra.
  if (!eos.empty()) {
    model.eos_token_id = eos.front();
    model.extra_eos_token_ids.assign(eos.begin() + 1, eos.end());
  }
  if (model.vocab_size && *model.vocab_size <= 0) {
    return tl::unexpected("config.json: vocab_size must be positive, got " +
                          std::to_string(*model.vocab_size));
  }
  return model;
}

tl::expected<ModelInfo, std::string> load_model_info(const std::string& directory,
                                                     std::string name) {
  const std::string config_path = directory + "/config.json";
  auto config = read_file(config_path);
  if (!config) {
    return tl::unexpected("cannot read " + config_path +
                          ": --model takes a model directory in the Hugging Face layout");
  }
  const std::string generation = read_file(directory + "/generation_config.json").value_or("");
  auto model = model_info_from_json(*config, generation, std::move(name));
  if (!model) return tl::unexpected(directory + "/" + model.error());
  return model;
}

}  // namespace vllmd::api
