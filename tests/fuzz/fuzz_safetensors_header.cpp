// Fuzz target: a whole safetensors file, header and data, as the reference engine reads a
// model's weights. The parser must answer with a header or an error string, and an accepted
// header must keep the promises the loader relies on: the tensors tile the data section in
// order, and each range holds exactly its shape's bytes (the bytes are read, for ASan).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/reference/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace reference = vllmd::reference;
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  auto header = reference::parse_safetensors_header(file);
  if (!header) {
    if (header.error().empty()) __builtin_trap();
    return 0;
  }
  if (header->data_offset < 8 || header->data_offset > file.size()) __builtin_trap();
  const std::string_view section = file.substr(header->data_offset);
  std::size_t covered = 0;
  volatile unsigned sink = 0;
  for (const reference::SafetensorsEntry& entry : header->tensors) {
    if (entry.begin != covered || entry.end < entry.begin) __builtin_trap();
    std::size_t bytes = reference::safetensors_dtype_size(entry.dtype);
    if (bytes == 0) __builtin_trap();
    for (const std::int64_t dim : entry.shape) {
      if (dim < 0) __builtin_trap();
      bytes *= static_cast<std::size_t>(dim);
    }
    if (entry.end - entry.begin != bytes) __builtin_trap();
    for (std::size_t i = entry.begin; i < entry.end; ++i) {
      sink = sink + static_cast<unsigned char>(section[i]);
    }
    covered = entry.end;
  }
  if (covered != section.size()) __builtin_trap();
  return 0;
}
