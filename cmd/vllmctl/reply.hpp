#pragma once
// Reading the server's small JSON replies, through the library's JSON -> msgpack transcoder
// (no second JSON parser in the tree).

#include <msgpack.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/http/client.hpp"
#include "common/wire/json_to_msgpack.hpp"

namespace vllmd::vllmctl {

class JsonReply {
 public:
  // nullopt when the body is not a JSON object.
  static std::optional<JsonReply> parse(std::string_view body);

  // A top-level member, or nullptr.
  const msgpack::object* field(std::string_view key) const;
  std::optional<std::string> string_field(std::string_view key) const;
  // A member re-encoded as JSON ("null" when absent).
  std::string json_field(std::string_view key) const;

 private:
  JsonReply(wire::Transcoded transcoded, msgpack::object_handle handle)
      : transcoded_(std::move(transcoded)), handle_(std::move(handle)) {}

  wire::Transcoded transcoded_;  // owns the bytes the handle's strings point into
  msgpack::object_handle handle_;
};

// What a failed reply says: the error's message, then " (param: X)" when it names one.
// Falls back to the HTTP status when the body is not vllmd's error shape.
std::string error_text(const http::Reply& reply);
// The error's code ("invalid_configuration", ...), or empty.
std::string error_code(const http::Reply& reply);

}  // namespace vllmd::vllmctl
