#pragma once
// The safetensors format, read the way the official library reads it: an 8-byte little-endian
// header length, a JSON header naming each tensor's dtype, shape and byte range, then the data
// section, which the tensors must cover exactly, in order, without holes or overlaps. The
// reference engine loads its weights from a Hugging Face model directory with it.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

namespace vllmd::reference {

// One tensor's entry in a safetensors header. Offsets are relative to the start of the data
// section (after the 8-byte length and the JSON header).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as the file names it: "F32", "BF16", "F16", "F64", "I64", ...
  std::vector<std::int64_t> shape;
  std::size_t begin = 0;
  std::size_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;        // in the order of their data offsets
  std::map<std::string, std::string> metadata;  // "__metadata__", string to string
  std::size_t data_offset = 0;                  // 8 + the header's length
};

// The largest JSON header accepted (the official library's limit is 100 MB).
inline constexpr std::size_t kMaxSafetensorsHeader = std::size_t{100} << 20;

// Parses the header of a whole safetensors file held in `file` (the data too, for the
// bounds checks). Every error is one clear sentence naming what is wrong.
tl::expected<SafetensorsHeader, std::string> parse_safetensors_header(std::string_view file);

// Bytes per element of a safetensors dtype name, or 0 if unknown.
std::size_t safetensors_dtype_size(std::string_view dtype);

// A tensor loaded from a model directory: its dtype (safetensors name), shape and raw
// little-endian bytes.
struct LoadedTensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};

// All tensors of a Hugging Face model directory: `model.safetensors`, or, when
// `model.safetensors.index.json` exists, every file its "weight_map" names (each tensor must be in
// the file the map says, and each file must hold only the tensors the map puts there). Errors
// name the file (and the tensor when there is one).
tl::expected<std::map<std::string, LoadedTensor>, std::string> load_safetensors_directory(
    const std::string& directory);

}  // namespace vllmd::reference
