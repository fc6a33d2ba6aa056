// The safetensors reader: headers built in memory (valid ones, and one for each refusal, its
// error text checked), and model directories with model.safetensors or a sharded index.

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/reference/model_loader.hpp"
#include "common/reference/safetensors.hpp"

using namespace vllmd::reference;

namespace {

std::string le64(std::uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

// A file from its header JSON and data section, as written.
std::string raw_file(std::string_view header, std::string_view data = "") {
  return le64(header.size()) + std::string(header) + std::string(data);
}

struct Tensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};

std::string shape_json(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    out += (i ? "," : "") + std::to_string(shape[i]);
  }
  return out + "]";
}

// A valid file: the tensors' data back to back, in the given order, and the header padded
// with spaces to a multiple of 8 as the Python writer does.
std::string valid_file(const std::vector<Tensor>& tensors, std::string_view metadata = "") {
  std::string header = "{";
  std::string data;
  if (!metadata.empty()) header += "\"__metadata__\":" + std::string(metadata);
  for (const Tensor& tensor : tensors) {
    if (header.size() > 1) header += ",";
    header += "\"" + tensor.name + "\":{\"dtype\":\"" + tensor.dtype +
              "\",\"shape\":" + shape_json(tensor.shape) + ",\"data_offsets\":[" +
              std::to_string(data.size()) + "," +
              std::to_string(data.size() + tensor.bytes.size()) + "]}";
    data += tensor.bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  return raw_file(header, data);
}

// The error parse_safetensors_header gives, or "" when it accepts the file.
std::string error_of(std::string_view file) {
  auto header = parse_safetensors_header(file);
  return header ? std::string() : header.error();
}

// One F32 [2] tensor named "t" with the given entry JSON and 8 bytes of data.
std::string with_entry(std::string_view entry, std::string_view data = std::string(8, 'x')) {
  return raw_file("{\"t\":" + std::string(entry) + "}", data);
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

// A directory of its own under the system's temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = (std::filesystem::temp_directory_path() /
             ("vllmd-safetensors-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) +
              "-" + std::to_string(now)))
                .string();
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  void write(const std::string& name, std::string_view bytes) const {
    std::ofstream out(path_ + "/" + name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

 private:
  std::string path_;
};

std::string f32_bytes(std::size_t count, char fill) { return std::string(4 * count, fill); }

}  // namespace

TEST_SUITE("reference_safetensors") {
  TEST_CASE("dtype sizes") {
    CHECK(safetensors_dtype_size("BOOL") == 1);
    CHECK(safetensors_dtype_size("U8") == 1);
    CHECK(safetensors_dtype_size("I8") == 1);
    CHECK(safetensors_dtype_size("F8_E4M3") == 1);
    CHECK(safetensors_dtype_size("F8_E5M2") == 1);
    CHECK(safetensors_dtype_size("I16") == 2);
    CHECK(safetensors_dtype_size("U16") == 2);
    CHECK(safetensors_dtype_size("F16") == 2);
    CHECK(safetensors_dtype_size("BF16") == 2);
    CHECK(safetensors_dtype_size("I32") == 4);
    CHECK(safetensors_dtype_size("U32") == 4);
    CHECK(safetensors_dtype_size("F32") == 4);
    CHECK(safetensors_dtype_size("F64") == 8);
    CHECK(safetensors_dtype_size("I64") == 8);
    CHECK(safetensors_dtype_size("U64") == 8);
    CHECK(safetensors_dtype_size("f32") == 0);
    CHECK(safetensors_dtype_size("F4") == 0);
    CHECK(safetensors_dtype_size("") == 0);
  }

  TEST_CASE("a valid header: entries in offset order, shapes, offsets, metadata") {
    // The JSON names the tensors in another order than their data: the result follows the data.
    const std::string data = f32_bytes(4, 'a') + std::string(6, 'b');
    const std::string header =
        "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
        "\"second\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
        "\"first\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}   ";
    const std::string file = raw_file(header, data);
    auto parsed = parse_safetensors_header(file);
    REQUIRE(parsed);
    CHECK(parsed->data_offset == 8 + header.size());
    REQUIRE(parsed->tensors.size() == 2);
    const SafetensorsEntry& first = parsed->tensors[0];
    CHECK(first.name == "first");
    CHECK(first.dtype == "F32");
    CHECK(first.shape == std::vector<std::int64_t>{2, 2});
    CHECK(first.begin == 0);
    CHECK(first.end == 16);
    const SafetensorsEntry& second = parsed->tensors[1];
    CHECK(second.name == "second");
    CHECK(second.dtype == "BF16");
    CHECK(second.shape == std::vector<std::int64_t>{3});
    CHECK(second.begin == 16);
    CHECK(second.end == 22);
    CHECK(parsed->metadata == std::map<std::string, std::string>{{"format", "pt"}, {"note", "x"}});
    CHECK(file.substr(parsed->data_offset + second.begin, 6) == "bbbbbb");
  }

  TEST_CASE("edge cases that are valid") {
    // No tensors, no data.
    auto empty = parse_safetensors_header(raw_file("{}"));
    REQUIRE(empty);
    CHECK(empty->tensors.empty());
    CHECK(empty->metadata.empty());
    CHECK(empty->data_offset == 10);
    // A scalar (shape []) is one element; zero-element tensors take no bytes, even side by side.
    auto zeros = parse_safetensors_header(valid_file({{"s", "F64", {}, std::string(8, 's')},
                                                      {"z1", "F32", {0, 5}, ""},
                                                      {"z2", "I64", {3, 0}, ""}},
                                                     "null"));
    REQUIRE(zeros);
    REQUIRE(zeros->tensors.size() == 3);
    CHECK(zeros->tensors[0].name == "s");
    CHECK(zeros->tensors[0].shape.empty());
    CHECK(zeros->tensors[1].begin == 8);
    CHECK(zeros->tensors[2].end == 8);
    // Padding: the header length counts the trailing spaces.
    const std::string padded = valid_file({{"w", "U8", {3}, "abc"}});
    auto parsed = parse_safetensors_header(padded);
    REQUIRE(parsed);
    CHECK(parsed->data_offset % 8 == 0);
    CHECK(padded.substr(parsed->data_offset) == "abc");
  }

  TEST_CASE("refused: the length prefix") {
    CHECK(contains(error_of("abcde"), "the file is 5 bytes long, too short"));
    CHECK(contains(error_of(""), "the file is 0 bytes long"));
    CHECK(contains(error_of(le64(30) + "{}"),
                   "the header length 30 runs past the end of the "
                   "file, which holds 2 bytes after it"));
    CHECK(contains(error_of(le64(std::uint64_t{200} << 20) + "{}"),
                   "the header length 209715200 exceeds the limit of 104857600 bytes"));
    CHECK(contains(error_of(le64(UINT64_MAX) + "{}"), "exceeds the limit"));
  }

  TEST_CASE("refused: the JSON") {
    CHECK(contains(error_of(raw_file("{\"t\":")), "the header is not valid JSON: "));
    CHECK(contains(error_of(raw_file("{\"t\":")), "at byte 5 of the header"));
    CHECK(contains(error_of(raw_file("")), "the header is not valid JSON"));
    CHECK(contains(error_of(raw_file("{} x")), "the header is not valid JSON"));
    CHECK(contains(error_of(raw_file("{\"\xff\":1}")), "the header is not valid JSON"));
    CHECK(error_of(raw_file("[1,2]")) == "the header is a JSON array, not an object");
    CHECK(error_of(raw_file("\"x\"")) == "the header is a JSON string, not an object");
  }

  TEST_CASE("refused: entries of the wrong form") {
    CHECK(error_of(with_entry("[1]")) ==
          "tensor \"t\" is [1], not an object with dtype, shape and data_offsets");
    CHECK(error_of(with_entry("{\"shape\":[2],\"data_offsets\":[0,8]}")) ==
          "tensor \"t\" has no \"dtype\"");
    CHECK(error_of(with_entry("{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}")) ==
          "tensor \"t\": \"dtype\" is 7, not a string");
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"data_offsets\":[0,8]}")) ==
          "tensor \"t\" has no \"shape\"");
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}")) ==
          "tensor \"t\": \"shape\" is 2, not an array");
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2]}")) ==
          "tensor \"t\" has no \"data_offsets\"");
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8]}")) ==
          "tensor \"t\": \"data_offsets\" is [8], not [begin, end] as two non-negative integers");
    CHECK(
        contains(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-1,8]}")),
                 "\"data_offsets\" is [-1,8], not [begin, end]"));
    CHECK(
        contains(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":\"0-8\"}")),
                 "\"data_offsets\" is \"0-8\", not [begin, end]"));
    CHECK(error_of(with_entry("{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,8]}")) ==
          "tensor \"t\" has the unknown dtype \"F4\"");
  }

  TEST_CASE("refused: shapes") {
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}")) ==
          "tensor \"t\": shape dimension 1 is -1, not a non-negative integer");
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}")) ==
          "tensor \"t\": shape dimension 0 is 2.0, not a non-negative integer");
    CHECK(contains(
        error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}")),
        "shape dimension 0 is \"2\", not a non-negative integer"));
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                              "\"data_offsets\":[0,8]}")) ==
          "tensor \"t\": shape [4294967296, 4294967296] of F32 overflows a 64-bit byte count");
    // The dtype's size counts too: 2^62 elements fit, 2^64 bytes do not.
    CHECK(contains(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                                       "\"data_offsets\":[0,8]}")),
                   "overflows a 64-bit byte count"));
  }

  TEST_CASE("refused: offsets against the shape and the data section") {
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}")) ==
          "tensor \"t\": data_offsets [8, 0] begin after they end");
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}")) ==
          "tensor \"t\": data_offsets [0, 16] end past the data section, which holds 8 bytes");
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}")) ==
          "tensor \"t\": data_offsets [0, 8] hold 8 bytes, but shape [3] of F32 needs 12");
    CHECK(contains(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2],"
                                       "\"data_offsets\":[0,18446744073709551615]}")),
                   "end past the data section"));
  }

  TEST_CASE("refused: overlaps, holes and bytes after the last tensor") {
    const std::string overlap =
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
    CHECK(error_of(raw_file(overlap, std::string(12, 'x'))) ==
          "tensor \"b\" (data_offsets [4, 12]) overlaps tensor \"a\" (data_offsets [0, 8])");
    const std::string same =
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}";
    CHECK(contains(error_of(raw_file(same, std::string(8, 'x'))), "overlaps"));
    const std::string hole =
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}";
    CHECK(error_of(raw_file(hole, std::string(20, 'x'))) ==
          "bytes 8 to 12 of the data section, before tensor \"b\", belong to no tensor");
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}",
                              std::string(12, 'x'))) ==
          "bytes 0 to 4 of the data section, before tensor \"t\", belong to no tensor");
    CHECK(error_of(with_entry("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}",
                              std::string(11, 'x'))) ==
          "the last 3 of the data section's 11 bytes belong to no tensor");
    CHECK(error_of(raw_file("{}", "xy")) ==
          "the last 2 of the data section's 2 bytes belong to no tensor");
  }

  TEST_CASE("refused: duplicates and metadata") {
    const std::string twice =
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    CHECK(error_of(raw_file(twice, std::string(8, 'x'))) == "the header names \"t\" twice");
    CHECK(error_of(raw_file("{\"__metadata__\":{},\"__metadata__\":{}}")) ==
          "the header names \"__metadata__\" twice");
    CHECK(error_of(raw_file("{\"__metadata__\":[\"pt\"]}")) ==
          "\"__metadata__\" is [\"pt\"], not an object of strings");
    CHECK(error_of(raw_file("{\"__metadata__\":{\"format\":\"pt\",\"size\":3}}")) ==
          "\"__metadata__\" entry \"size\" is 3, not a string");
  }

  TEST_CASE("error texts quote names as JSON and cut long ones") {
    const std::string name(300, 'n');
    const std::string error = error_of(
        raw_file("{\"" + name + "\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}"));
    CHECK(error == "tensor \"" + std::string(80, 'n') + "\"... has the unknown dtype \"X\"");
    CHECK(error_of(raw_file("{\"a\\nb\":1}")) ==
          "tensor \"a\\nb\" is 1, not an object with dtype, shape and data_offsets");
  }

  TEST_CASE("a directory with model.safetensors") {
    TempDir dir;
    dir.write("model.safetensors", valid_file({{"embed.weight", "F32", {2, 3}, f32_bytes(6, 'e')},
                                               {"norm.weight", "BF16", {3}, "nnnnnn"}},
                                              "{\"format\":\"pt\"}"));
    auto tensors = load_safetensors_directory(dir.path());
    REQUIRE(tensors);
    REQUIRE(tensors->size() == 2);
    const LoadedTensor& embed = tensors->at("embed.weight");
    CHECK(embed.dtype == "F32");
    CHECK(embed.shape == std::vector<std::int64_t>{2, 3});
    CHECK(embed.bytes == f32_bytes(6, 'e'));
    const LoadedTensor& norm = tensors->at("norm.weight");
    CHECK(norm.dtype == "BF16");
    CHECK(norm.bytes == "nnnnnn");
  }

  TEST_CASE("a directory without weights, or with a broken file") {
    TempDir dir;
    auto missing = load_safetensors_directory(dir.path());
    REQUIRE_FALSE(missing);
    CHECK(missing.error() ==
          "cannot open " + dir.path() + "/model.safetensors: No such file or directory");
    dir.write("model.safetensors", "abc");
    auto broken = load_safetensors_directory(dir.path());
    REQUIRE_FALSE(broken);
    CHECK(broken.error() == dir.path() +
                                "/model.safetensors: the file is 3 bytes long, too short for the "
                                "8-byte header length a safetensors file starts with");
    std::filesystem::remove(dir.path() + "/model.safetensors");
    std::filesystem::create_directory(dir.path() + "/model.safetensors");
    auto directory = load_safetensors_directory(dir.path());
    REQUIRE_FALSE(directory);
    CHECK(directory.error() == "cannot read " + dir.path() + "/model.safetensors: Is a directory");
  }

  TEST_CASE("a directory with an index over two shards") {
    TempDir dir;
    dir.write("model-00001-of-00002.safetensors",
              valid_file({{"a", "F32", {2}, f32_bytes(2, 'a')}, {"b", "F16", {1}, "bb"}}));
    dir.write("model-00002-of-00002.safetensors", valid_file({{"c", "I64", {1}, "cccccccc"}}));
    // A model directory also holds model.safetensors from another export: the index wins.
    dir.write("model.safetensors", "not read");
    dir.write("model.safetensors.index.json",
              R"({"metadata": {"total_size": 18}, "weight_map": {
                   "a": "model-00001-of-00002.safetensors",
                   "b": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
    auto tensors = load_safetensors_directory(dir.path());
    REQUIRE(tensors);
    REQUIRE(tensors->size() == 3);
    CHECK(tensors->at("a").bytes == f32_bytes(2, 'a'));
    CHECK(tensors->at("b").dtype == "F16");
    CHECK(tensors->at("b").bytes == "bb");
    CHECK(tensors->at("c").dtype == "I64");
    CHECK(tensors->at("c").shape == std::vector<std::int64_t>{1});
    CHECK(tensors->at("c").bytes == "cccccccc");
  }

  TEST_CASE("an index naming a missing file") {
    TempDir dir;
    dir.write("model-00001-of-00002.safetensors", valid_file({{"a", "U8", {1}, "a"}}));
    dir.write("model.safetensors.index.json",
              R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                 "b": "model-00002-of-00002.safetensors"}})");
    auto tensors = load_safetensors_directory(dir.path());
    REQUIRE_FALSE(tensors);
    CHECK(tensors.error() == "cannot open " + dir.path() +
                                 "/model-00002-of-00002.safetensors: No such file or directory "
                                 "(a file model.safetensors.index.json names)");
  }

  TEST_CASE("a tensor in the wrong shard, or in none") {
    TempDir dir;
    dir.write("one.safetensors", valid_file({{"a", "U8", {1}, "a"}}));
    dir.write("two.safetensors", valid_file({{"b", "U8", {1}, "b"}, {"c", "U8", {1}, "c"}}));
    // The index places c in one.safetensors, but two.safetensors holds it.
    dir.write("model.safetensors.index.json",
              R"({"weight_map": {"a": "one.safetensors", "b": "two.safetensors",
                                 "c": "one.safetensors"}})");
    auto wrong = load_safetensors_directory(dir.path());
    REQUIRE_FALSE(wrong);
    CHECK(wrong.error() == dir.path() +
                               "/one.safetensors: has no tensor \"c\", which "
                               "model.safetensors.index.json places there");
    // The index leaves c out: two.safetensors holds a tensor it does not name.
    dir.write("model.safetensors.index.json",
              R"({"weight_map": {"a": "one.safetensors", "b": "two.safetensors"}})");
    auto unnamed = load_safetensors_directory(dir.path());
    REQUIRE_FALSE(unnamed);
    CHECK(unnamed.error() == dir.path() +
                                 "/two.safetensors: tensor \"c\" is not in "
                                 "model.safetensors.index.json's weight_map");
    // Both files hold b: the one the index does not name for it is refused.
    dir.write("one.safetensors", valid_file({{"a", "U8", {1}, "a"}, {"b", "U8", {1}, "b"}}));
    dir.write("model.safetensors.index.json",
              R"({"weight_map": {"a": "one.safetensors", "b": "two.safetensors",
                                 "c": "two.safetensors"}})");
    auto twice = load_safetensors_directory(dir.path());
    REQUIRE_FALSE(twice);
    CHECK(twice.error() == dir.path() +
                               "/one.safetensors: holds tensor \"b\", which "
                               "model.safetensors.index.json places in \"two.safetensors\"");
  }

  TEST_CASE("a broken index") {
    TempDir dir;
    const std::string index = dir.path() + "/model.safetensors.index.json";
    dir.write("model.safetensors.index.json", "{\"weight_map\": ");
    auto bad_json = load_safetensors_directory(dir.path());
    REQUIRE_FALSE(bad_json);
    CHECK(contains(bad_json.error(), index + ": not valid JSON: "));
    dir.write("model.safetensors.index.json", "[]");
    CHECK(load_safetensors_directory(dir.path()).error() == index + ": not a JSON object");
    dir.write("model.safetensors.index.json", "{\"metadata\": {}}");
    CHECK(load_safetensors_directory(dir.path()).error() == index + ": no \"weight_map\" object");
    dir.write("model.safetensors.index.json", R"({"weight_map": {"a": "../model.safetensors"}})");
    CHECK(load_safetensors_directory(dir.path()).error() ==
          index +
              ": \"weight_map\" places tensor \"a\" in \"../model.safetensors\", not a file name "
              "in the model directory");
    dir.write("model.safetensors.index.json", R"({"weight_map": {"a": 1}})");
    CHECK(
        contains(load_safetensors_directory(dir.path()).error(), "places tensor \"a\" in 1, not"));
  }

  TEST_CASE("reload_weights reads the source again; one gone bad leaves the model as it was") {
    TempDir dir;
    const std::string config =
        R"({"vocab_size":8,"hidden_size":4,"intermediate_size":8,"num_hidden_layers":1,)"
        R"("num_attention_heads":2})";
    dir.write("config.json", config);
    auto model = load_model(dir.path(), LoadFormat::kDummy, 5);
    REQUIRE_MESSAGE(model, model.error());
    const std::string name = "model.layers.0.mlp.up_proj.weight";
    const std::string loaded = (*model)->parameter_bytes(name);
    (*model)->reset_weights(1);
    const std::string reset = (*model)->parameter_bytes(name);
    REQUIRE(reset != loaded);
    REQUIRE(reload_weights(**model, {dir.path(), LoadFormat::kDummy, 5}));
    CHECK((*model)->parameter_bytes(name) == loaded);

    (*model)->reset_weights(1);
    auto no_file = reload_weights(**model, {dir.path(), LoadFormat::kSafetensors});
    REQUIRE_FALSE(no_file);
    CHECK(no_file.error() == "reload_weights: cannot open " + dir.path() +
                                 "/model.safetensors: No such file or directory");
    CHECK((*model)->parameter_bytes(name) == reset);
    dir.write("config.json", R"({"vocab_size":8,"hidden_size":4,"intermediate_size":6,)"
                             R"("num_hidden_layers":1,"num_attention_heads":2})");
    auto changed = reload_weights(**model, {dir.path(), LoadFormat::kDummy, 5});
    REQUIRE_FALSE(changed);
    CHECK(changed.error() ==
          "reload_weights: " + dir.path() + "/config.json no longer describes the running model");
    CHECK((*model)->parameter_bytes(name) == reset);
    CHECK(reload_weights(**model, {}).error() ==
          "reload_weights: the model was not loaded from a directory");
  }
}
