// The model metadata of --model DIR (common/api/model_info.*): vocabulary size and EOS ids from
// config.json (or its text_config), EOS ids and sampling defaults from generation_config.json.

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/api/model_info.hpp"

using vllmd::api::load_model_info;
using vllmd::api::model_info_from_json;

TEST_CASE("config.json and generation_config.json as Qwen ships them") {
  auto model = model_info_from_json(
      R"({"architectures":["Qwen2ForCausalLM"],"vocab_size":151936,"eos_token_id":151645,
          "max_position_embeddings":32768})",
      R"({"bos_token_id":151643,"do_sample":true,"eos_token_id":[151645,151643],
          "repetition_penalty":1.05,"temperature":0.7,"top_p":0.8,"top_k":20,
          "max_new_tokens":2048})",
      "qwen");
  REQUIRE(model.has_value());
  CHECK(model->name == "qwen");
  CHECK(model->vocab_size == 151936);
  CHECK(model->eos_token_id == 151645);
  CHECK(model->extra_eos_token_ids == std::vector<std::int64_t>{151643});
  CHECK(model->temperature == 0.7);
  CHECK(model->top_p == 0.8);
  CHECK(model->top_k == 20);
  CHECK(model->repetition_penalty == 1.05);
  CHECK(model->max_new_tokens == 2048);
  CHECK_FALSE(model->min_p.has_value());
}

TEST_CASE("text_config, EOS lists, and no generation_config.json") {
  auto wrapped = model_info_from_json(
      R"({"model_type":"llava","text_config":{"vocab_size":32064,"eos_token_id":[2,32007]}})", "",
      "m");
  REQUIRE(wrapped.has_value());
  CHECK(wrapped->vocab_size == 32064);
  CHECK(wrapped->eos_token_id == 2);
  CHECK(wrapped->extra_eos_token_ids == std::vector<std::int64_t>{32007});
  CHECK_FALSE(wrapped->temperature.has_value());
  CHECK_FALSE(wrapped->max_new_tokens.has_value());
  // No EOS anywhere: nothing stops generation but the request's own stop ids and length.
  auto bare = model_info_from_json(R"({"vocab_size":100})", "", "m");
  REQUIRE(bare.has_value());
  CHECK_FALSE(bare->eos_token_id.has_value());
  CHECK(bare->extra_eos_token_ids.empty());
}

TEST_CASE("malformed files are errors that name them") {
  auto broken = model_info_from_json(R"({"vocab_size":)", "", "m");
  REQUIRE_FALSE(broken.has_value());
  CHECK(broken.error().starts_with("config.json: "));
  auto array = model_info_from_json("[]", "", "m");
  REQUIRE_FALSE(array.has_value());
  CHECK(array.error() == "config.json: not a JSON object");
  auto generation = model_info_from_json("{}", "{", "m");
  REQUIRE_FALSE(generation.has_value());
  CHECK(generation.error().starts_with("generation_config.json: "));
  auto zero = model_info_from_json(R"({"vocab_size":0})", "", "m");
  REQUIRE_FALSE(zero.has_value());
  CHECK(zero.error().find("vocab_size must be positive") != std::string::npos);
}

TEST_CASE("load_model_info reads a directory, and says what a directory lacks") {
  char pattern[] = "/tmp/vllmd-model-XXXXXX";
  const std::string directory = ::mkdtemp(pattern);
  std::ofstream(directory + "/config.json") << R"({"vocab_size":50,"eos_token_id":7})";
  auto model = load_model_info(directory, "tiny");
  REQUIRE(model.has_value());
  CHECK(model->vocab_size == 50);
  CHECK(model->eos_token_id == 7);
  std::ofstream(directory + "/generation_config.json") << R"({"eos_token_id":[7,8],"top_k":5})";
  model = load_model_info(directory, "tiny");
  REQUIRE(model.has_value());
  CHECK(model->extra_eos_token_ids == std::vector<std::int64_t>{8});
  CHECK(model->top_k == 5);
  std::ofstream(directory + "/generation_config.json") << "not json";
  model = load_model_info(directory, "tiny");
  REQUIRE_FALSE(model.has_value());
  CHECK(model.error().starts_with(directory + "/generation_config.json: "));
  ::unlink((directory + "/generation_config.json").c_str());
  ::unlink((directory + "/config.json").c_str());
  model = load_model_info(directory, "tiny");
  REQUIRE_FALSE(model.has_value());
  CHECK(model.error().find("cannot read " + directory + "/config.json") != std::string::npos);
  ::rmdir(directory.c_str());
}
