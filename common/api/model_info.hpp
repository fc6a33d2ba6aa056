#pragma once
// The model metadata vllmd reads from a local model directory in the Hugging Face layout
// (--model DIR): config.json for the vocabulary size and the EOS ids (at the top level, or
// under text_config for multimodal wrappers), generation_config.json for more EOS ids and the
// sampling defaults vLLM applies when a request sets none. Nothing else of the model is read:
// vllmd has no tokenizer.

#include <string>
#include <tl/expected.hpp>

#include "common/api/generate_request.hpp"

namespace vllmd::api {

// `name` is the served model name. A missing generation_config.json is normal (many models
// have none); a missing or malformed config.json is an error naming the file.
tl::expected<ModelInfo, std::string> load_model_info(const std::string& directory,
                                                     std::string name);

// The same from the two files' contents (generation_config may be empty: none).
tl::expected<ModelInfo, std::string> model_info_from_json(std::string_view config,
                                                          std::string_view generation_config,
                                                          std::string name);

}  // namespace vllmd::api
