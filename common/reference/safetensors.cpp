#include "common/reference/safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include "common/util/errno_text.hpp"
#include "common/wire/json_text.hpp"
#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_codec.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::reference {

namespace {

using Object = msgpack::object;

constexpr std::size_t kLengthBytes = 8;
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kSingleFile = "model.safetensors";
constexpr std::string_view kIndexFile = "model.safetensors.index.json";
// Names and values quoted in errors are cut here: a header may hold megabytes in one string.
constexpr std::size_t kShownBytes = 80;

tl::unexpected<std::string> fail(std::string message) { return tl::unexpected(std::move(message)); }

// ------------------------------------------------------------------------------ error text

// The first kShownBytes of `text`, not splitting a UTF-8 sequence.
std::string_view clipped(std::string_view text) {
  if (text.size() <= kShownBytes) return text;
  std::size_t cut = kShownBytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  return text.substr(0, cut);
}

// A name from the file as a JSON literal, so control bytes and quotes read unambiguously.
std::string literal(std::string_view text) {
  std::string out = wire::json_string(clipped(text));
  if (clipped(text).size() < text.size()) out += "...";
  return out;
}

// A header value as its JSON, for "is X, not Y" errors.
std::string shown(const Object& value) {
  std::string json;
  wire::append_json(json, value);
  std::string out(clipped(json));
  if (out.size() < json.size()) out += "...";
  return out;
}

std::string tensor_label(std::string_view name) { return "tensor " + literal(name); }

// "[2, 3]"; a shape of thousands of dimensions shows its first few.
std::string shape_text(const std::vector<std::int64_t>& shape) {
  constexpr std::size_t kShownDims = 8;
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size() && i < kShownDims; ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  if (shape.size() > kShownDims) out += ", ... (" + std::to_string(shape.size()) + " dimensions)";
  return out + "]";
}

std::string offsets_text(const SafetensorsEntry& entry) {
  return "[" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]";
}

// ------------------------------------------------------------------------------ the header

std::uint64_t read_le64(std::string_view bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = kLengthBytes; i-- > 0;) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return value;
}

// The JSON text after the 8-byte length, checked against the file and the size limit.
tl::expected<std::string_view, std::string> header_text(std::string_view file) {
  if (file.size() < kLengthBytes) {
    return fail("the file is " + std::to_string(file.size()) +
                " bytes long, too short for the 8-byte header length a safetensors file "
                "starts with");
  }
  const std::uint64_t length = read_le64(file);
  if (length > kMaxSafetensorsHeader) {
    return fail("the header length " + std::to_string(length) + " exceeds the limit of " +
                std::to_string(kMaxSafetensorsHeader) + " bytes");
  }
  const std::size_t rest = file.size() - kLengthBytes;
  if (length > rest) {
    return fail("the header length " + std::to_string(length) +
                " runs past the end of the file, which holds " + std::to_string(rest) +
                " bytes after it");
  }
  return file.substr(kLengthBytes, length);
}

// Transcodes the header JSON; its top-level members keep duplicates, which we refuse.
tl::expected<wire::Transcoded, std::string> parse_json(std::string_view text) {
  wire::TranscodeLimits limits;
  limits.max_depth = 64;  // as deep as msgpack decoding goes below
  auto transcoded = wire::json_to_msgpack(text, limits);
  if (!transcoded) {
    return fail("the header is not valid JSON: " + transcoded.error().message + " at byte " +
                std::to_string(transcoded.error().offset) + " of the header");
  }
  if (transcoded->root != wire::JsonKind::kObject) {
    return fail("the header is a JSON " + std::string(wire::kind_name(transcoded->root)) +
                ", not an object");
  }
  return std::move(*transcoded);
}

// One top-level member's value as a msgpack tree. The limits only need to admit anything the
// header's size allows: the header itself is already bounded.
tl::expected<msgpack::object_handle, std::string> decode_member(
    const wire::Transcoded& header, const wire::TopLevelMember& member) {
  wire::DecodeLimits limits;
  limits.array = limits.map = limits.str = kMaxSafetensorsHeader;
  auto decoded = wire::decode(header.value_bytes(member), limits);
  if (!decoded) return fail("the header's " + literal(member.key) + " " + decoded.error());
  return decoded;
}

tl::expected<void, std::string> read_metadata(const Object& value,
                                              std::map<std::string, std::string>& metadata) {
  if (value.type == msgpack::type::NIL) return {};  // None, as the official reader takes it
  if (value.type != msgpack::type::MAP) {
    return fail("\"__metadata__\" is " + shown(value) + ", not an object of strings");
  }
  for (std::uint32_t i = 0; i < value.via.map.size; ++i) {
    const msgpack::object_kv& entry = value.via.map.ptr[i];
    const std::string_view key = wire::as_str(entry.key).value_or("");
    const auto text = wire::as_str(entry.val);
    if (!text) {
      return fail("\"__metadata__\" entry " + literal(key) + " is " + shown(entry.val) +
                  ", not a string");
    }
    metadata[std::string(key)] = std::string(*text);  // a duplicate key: the last wins
  }
  return {};
}

// ------------------------------------------------------------------------------ one entry

// A field the entry must have, or the error naming the missing one.
tl::expected<const Object*, std::string> required(const Object& entry, std::string_view name,
                                                  std::string_view key) {
  const Object* value = wire::find_key(entry, key);
  if (value == nullptr) return fail(tensor_label(name) + " has no \"" + std::string(key) + "\"");
  return value;
}

tl::expected<std::string, std::string> read_dtype(const Object& entry, std::string_view name) {
  auto value = required(entry, name, "dtype");
  if (!value) return fail(value.error());
  const auto dtype = wire::as_str(**value);
  if (!dtype)
    return fail(tensor_label(name) + ": \"dtype\" is " + shown(**value) + ", not a string");
  if (safetensors_dtype_size(*dtype) == 0) {
    return fail(tensor_label(name) + " has the unknown dtype " + literal(*dtype));
  }
  return std::string(*dtype);
}

tl::expected<std::vector<std::int64_t>, std::string> read_shape(const Object& entry,
                                                                std::string_view name) {
  auto value = required(entry, name, "shape");
  if (!value) return fail(value.error());
  const Object& list = **value;
  if (list.type != msgpack::type::ARRAY) {
    return fail(tensor_label(name) + ": \"shape\" is " + shown(list) + ", not an array");
  }
  std::vector<std::int64_t> shape;
  shape.reserve(list.via.array.size);
  for (std::uint32_t i = 0; i < list.via.array.size; ++i) {
    const auto dim = wire::as_int64(list.via.array.ptr[i]);
    if (!dim || *dim < 0) {
      return fail(tensor_label(name) + ": shape dimension " + std::to_string(i) + " is " +
                  shown(list.via.array.ptr[i]) + ", not a non-negative integer");
    }
    shape.push_back(*dim);
  }
  return shape;
}

// A byte offset: an unsigned integer of any width (a negative one fails, as in the official
// reader, which reads them as usize).
std::optional<std::size_t> read_offset(const Object& value) {
  if (value.type != msgpack::type::POSITIVE_INTEGER) return std::nullopt;
  return static_cast<std::size_t>(value.via.u64);
}

tl::expected<std::pair<std::size_t, std::size_t>, std::string> read_offsets(const Object& entry,
                                                                            std::string_view name) {
  auto value = required(entry, name, "data_offsets");
  if (!value) return fail(value.error());
  const Object& list = **value;
  const bool pair = list.type == msgpack::type::ARRAY && list.via.array.size == 2;
  const auto begin = pair ? read_offset(list.via.array.ptr[0]) : std::nullopt;
  const auto end = pair ? read_offset(list.via.array.ptr[1]) : std::nullopt;
  if (!begin || !end) {
    return fail(tensor_label(name) + ": \"data_offsets\" is " + shown(list) +
                ", not [begin, end] as two non-negative integers");
  }
  return std::make_pair(*begin, *end);
}

// Elements times the dtype's size, or nullopt when the product overflows.
std::optional<std::size_t> tensor_bytes(const std::vector<std::int64_t>& shape,
                                        std::size_t dtype_size) {
  std::size_t product = dtype_size;
  for (const std::int64_t dim : shape) {
    if (__builtin_mul_overflow(product, static_cast<std::size_t>(dim), &product)) {
      return std::nullopt;
    }
  }
  return product;
}

// The entry's byte range against its shape and the data section.
tl::expected<void, std::string> check_range(const SafetensorsEntry& entry, std::size_t data_size) {
  const std::string label = tensor_label(entry.name);
  if (entry.begin > entry.end) {
    return fail(label + ": data_offsets " + offsets_text(entry) + " begin after they end");
  }
  if (entry.end > data_size) {
    return fail(label + ": data_offsets " + offsets_text(entry) +
                " end past the data section, which holds " + std::to_string(data_size) + " bytes");
  }
  const auto needed = tensor_bytes(entry.shape, safetensors_dtype_size(entry.dtype));
  if (!needed) {
    return fail(label + ": shape " + shape_text(entry.shape) + " of " + entry.dtype +
                " overflows a 64-bit byte count");
  }
  if (entry.end - entry.begin != *needed) {
    return fail(label + ": data_offsets " + offsets_text(entry) + " hold " +
                std::to_string(entry.end - entry.begin) + " bytes, but shape " +
                shape_text(entry.shape) + " of " + entry.dtype + " needs " +
                std::to_string(*needed));
  }
  return {};
}

tl::expected<SafetensorsEntry, std::string> read_entry(std::string_view name, const Object& entry,
                                                       std::size_t data_size) {
  if (entry.type != msgpack::type::MAP) {
    return fail(tensor_label(name) + " is " + shown(entry) +
                ", not an object with dtype, shape and data_offsets");
  }
  auto dtype = read_dtype(entry, name);
  if (!dtype) return fail(dtype.error());
  auto shape = read_shape(entry, name);
  if (!shape) return fail(shape.error());
  auto offsets = read_offsets(entry, name);
  if (!offsets) return fail(offsets.error());
  SafetensorsEntry parsed{std::string(name), std::move(*dtype), std::move(*shape), offsets->first,
                          offsets->second};
  if (auto checked = check_range(parsed, data_size); !checked) return fail(checked.error());
  return parsed;
}

// ------------------------------------------------------------------------------ coverage

// The entries, sorted by offset, must tile the data section exactly: what the official reader
// requires, so that every byte of a file belongs to exactly one tensor.
tl::expected<void, std::string> check_coverage(const std::vector<SafetensorsEntry>& sorted,
                                               std::size_t data_size) {
  std::size_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : sorted) {
    if (entry.begin < covered) {
      return fail(tensor_label(entry.name) + " (data_offsets " + offsets_text(entry) +
                  ") overlaps " + tensor_label(previous->name) + " (data_offsets " +
                  offsets_text(*previous) + ")");
    }
    if (entry.begin > covered) {
      return fail("bytes " + std::to_string(covered) + " to " + std::to_string(entry.begin) +
                  " of the data section, before " + tensor_label(entry.name) +
                  ", belong to no tensor");
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_size) {
    return fail("the last " + std::to_string(data_size - covered) + " of the data section's " +
                std::to_string(data_size) + " bytes belong to no tensor");
  }
  return {};
}

void sort_by_offsets(std::vector<SafetensorsEntry>& entries) {
  std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
}

// ------------------------------------------------------------------------------ files

// errno as text, or a generic word when the stream left none.
std::string os_error(int error) { return error != 0 ? util::errno_text(error) : "read error"; }

tl::expected<std::string, std::string> read_file(const std::string& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    return fail("cannot open " + path + ": " + os_error(error));
  }
  std::string bytes;
  std::error_code ignored;
  const auto size = std::filesystem::file_size(path, ignored);
  if (!ignored) bytes.reserve(size);
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    bytes.append(chunk, static_cast<std::size_t>(in.gcount()));
  }
  // A read error (EISDIR for a directory, EIO) sets badbit; the end of the file only eof.
  if (in.bad()) {
    const int error = errno;
    return fail("cannot read " + path + ": " + os_error(error));
  }
  return bytes;
}

std::string join(const std::string& directory, std::string_view name) {
  return directory + "/" + std::string(name);
}

// The tensors of one safetensors file, added to `out`.
tl::expected<std::vector<std::string>, std::string> load_file(
    const std::string& path, std::map<std::string, LoadedTensor>& out) {
  auto file = read_file(path);
  if (!file) return fail(file.error());
  auto header = parse_safetensors_header(*file);
  if (!header) return fail(path + ": " + header.error());
  std::vector<std::string> names;
  for (SafetensorsEntry& entry : header->tensors) {
    LoadedTensor tensor{std::move(entry.dtype), std::move(entry.shape),
                        file->substr(header->data_offset + entry.begin, entry.end - entry.begin)};
    names.push_back(entry.name);
    out[std::move(entry.name)] = std::move(tensor);
  }
  return names;
}

// A weight_map file name must name a file in the directory itself: no paths out of it.
bool plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos;
}

using WeightMap = std::map<std::string, std::string>;  // tensor name -> file name

tl::expected<WeightMap, std::string> read_weight_map(const std::string& path) {
  auto text = read_file(path);
  if (!text) return fail(text.error());
  auto transcoded = wire::json_to_msgpack(*text);
  if (!transcoded) return fail(path + ": not valid JSON: " + transcoded.error().describe());
  if (transcoded->root != wire::JsonKind::kObject) return fail(path + ": not a JSON object");
  const wire::TopLevelMember* member = transcoded->find("weight_map");
  if (member == nullptr || member->kind != wire::JsonKind::kObject) {
    return fail(path + ": no \"weight_map\" object");
  }
  wire::DecodeLimits limits;
  limits.array = limits.map = limits.str = text->size();
  auto decoded = wire::decode(transcoded->value_bytes(*member), limits);
  if (!decoded) return fail(path + ": \"weight_map\" " + decoded.error());
  const Object& map = decoded->get();
  WeightMap weight_map;
  for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
    const std::string_view tensor = wire::as_str(map.via.map.ptr[i].key).value_or("");
    const auto file = wire::as_str(map.via.map.ptr[i].val);
    if (!file || !plain_file_name(*file)) {
      return fail(path + ": \"weight_map\" places " + tensor_label(tensor) + " in " +
                  shown(map.via.map.ptr[i].val) + ", not a file name in the model directory");
    }
    weight_map[std::string(tensor)] = std::string(*file);
  }
  return weight_map;
}

// One shard: it must hold exactly the tensors the index places in it.
tl::expected<void, std::string> load_shard(const std::string& directory, const std::string& file,
                                           const WeightMap& weight_map,
                                           std::map<std::string, LoadedTensor>& out) {
  const std::string path = join(directory, file);
  auto names = load_file(path, out);
  if (!names) return fail(names.error() + " (a file " + std::string(kIndexFile) + " names)");
  for (const std::string& name : *names) {
    const auto placed = weight_map.find(name);
    if (placed == weight_map.end()) {
      return fail(path + ": " + tensor_label(name) + " is not in " + std::string(kIndexFile) +
                  "'s weight_map");
    }
    if (placed->second != file) {
      return fail(path + ": holds " + tensor_label(name) + ", which " + std::string(kIndexFile) +
                  " places in " + literal(placed->second));
    }
  }
  const std::set<std::string> held(names->begin(), names->end());
  for (const auto& [name, placed_in] : weight_map) {
    if (placed_in == file && held.count(name) == 0) {
      return fail(path + ": has no " + tensor_label(name) + ", which " + std::string(kIndexFile) +
                  " places there");
    }
  }
  return {};
}

tl::expected<std::map<std::string, LoadedTensor>, std::string> load_indexed(
    const std::string& directory) {
  auto weight_map = read_weight_map(join(directory, kIndexFile));
  if (!weight_map) return fail(weight_map.error());
  std::set<std::string> files;
  for (const auto& entry : *weight_map) files.insert(entry.second);
  std::map<std::string, LoadedTensor> tensors;
  for (const std::string& file : files) {
    if (auto loaded = load_shard(directory, file, *weight_map, tensors); !loaded) {
      return fail(loaded.error());
    }
  }
  return tensors;
}

}  // namespace

std::size_t safetensors_dtype_size(std::string_view dtype) {
  static constexpr std::pair<std::string_view, std::size_t> kSizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
  };
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

tl::expected<SafetensorsHeader, std::string> parse_safetensors_header(std::string_view file) {
  auto text = header_text(file);
  if (!text) return fail(text.error());
  auto json = parse_json(*text);
  if (!json) return fail(json.error());
  SafetensorsHeader header;
  header.data_offset = kLengthBytes + text->size();
  const std::size_t data_size = file.size() - header.data_offset;
  std::set<std::string_view> seen;
  for (const wire::TopLevelMember& member : json->members) {
    if (!seen.insert(member.key).second) {
      return fail("the header names " + literal(member.key) + " twice");
    }
    auto value = decode_member(*json, member);
    if (!value) return fail(value.error());
    if (member.key == kMetadataKey) {
      if (auto read = read_metadata(value->get(), header.metadata); !read) {
        return fail(read.error());
      }
      continue;
    }
    auto entry = read_entry(member.key, value->get(), data_size);
    if (!entry) return fail(entry.error());
    header.tensors.push_back(std::move(*entry));
  }
  sort_by_offsets(header.tensors);
  if (auto covered = check_coverage(header.tensors, data_size); !covered) {
    return fail(covered.error());
  }
  return header;
}

tl::expected<std::map<std::string, LoadedTensor>, std::string> load_safetensors_directory(
    const std::string& directory) {
  std::error_code ignored;
  if (std::filesystem::exists(join(directory, kIndexFile), ignored)) {
    return load_indexed(directory);
  }
  std::map<std::string, LoadedTensor> tensors;
  if (auto loaded = load_file(join(directory, kSingleFile), tensors); !loaded) {
    return fail(loaded.error());
  }
  return tensors;
}

}  // namespace vllmd::reference
