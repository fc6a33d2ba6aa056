#pragma once
// One-pass JSON -> msgpack transcoding for request bodies (update_info reaches ~90 MB).
// No DOM is built: values are written as msgpack while the JSON is parsed. Container element
// counts are unknown until a container closes, so each container header is placed 1 byte wide
// and widened when the count reaches 16 or 65536, by moving the body written so far; only if
// that would move too much (a budget of an eighth of the input) are the missing bytes inserted
// by one final sweep. The output is minimal-width msgpack, byte-identical to what msgpack-c or
// Python's msgpack would write.
//
// Types are kept exactly: JSON integers become msgpack integers over the whole int64 and
// uint64 ranges (never floats), numbers with a fraction or exponent become float64, strings
// must be valid UTF-8. Errors carry the byte offset where parsing stopped.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "common/util/buffer.hpp"

namespace vllmd::wire {

enum class JsonKind : std::uint8_t { kNull, kBool, kInteger, kFloat, kString, kArray, kObject };
std::string_view kind_name(JsonKind kind);

struct JsonError {
  std::size_t offset = 0;
  std::string message;
  // "<message> at byte <offset>"
  std::string describe() const;
};

// A member of the top-level object, located in the msgpack output: what validation needs
// without walking the output again.
struct TopLevelMember {
  std::string key;
  JsonKind kind = JsonKind::kNull;
  std::size_t begin = 0;  // msgpack byte range of the value
  std::size_t end = 0;
  bool all_elements_objects = false;  // for arrays: every element is an object (true when empty)
};

struct Transcoded {
  util::Buffer msgpack;
  JsonKind root = JsonKind::kNull;
  std::vector<TopLevelMember> members;  // only when root is an object, in document order

  // The last member with this key (a Python dict keeps the last duplicate), or nullptr.
  const TopLevelMember* find(std::string_view key) const;
  std::string_view value_bytes(const TopLevelMember& member) const {
    return msgpack.view().substr(member.begin, member.end - member.begin);
  }
};

struct TranscodeLimits {
  std::size_t max_depth = 256;
};

tl::expected<Transcoded, JsonError> json_to_msgpack(std::string_view json,
                                                    const TranscodeLimits& limits = {});

}  // namespace vllmd::wire
