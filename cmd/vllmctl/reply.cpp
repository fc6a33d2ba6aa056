#include "cmd/vllmctl/reply.hpp"

#include "common/wire/msgpack_codec.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::vllmctl {

std::optional<JsonReply> JsonReply::parse(std::string_view body) {
  auto transcoded = wire::json_to_msgpack(body);
  if (!transcoded || transcoded->root != wire::JsonKind::kObject) return std::nullopt;
  auto handle = wire::decode(transcoded->msgpack.view());
  if (!handle) return std::nullopt;
  return JsonReply(std::move(*transcoded), std::move(*handle));
}

const msgpack::object* JsonReply::field(std::string_view key) const {
  return wire::find_key(handle_.get(), key);
}

std::optional<std::string> JsonReply::string_field(std::string_view key) const {
  const msgpack::object* value = field(key);
  if (value == nullptr) return std::nullopt;
  auto text = wire::as_str(*value);
  return text ? std::optional<std::string>(std::string(*text)) : std::nullopt;
}

std::string JsonReply::json_field(std::string_view key) const {
  const msgpack::object* value = field(key);
  if (value == nullptr) return "null";
  std::string out;
  wire::append_json(out, *value);
  return out;
}

std::string error_code(const http::Reply& reply) {
  auto json = JsonReply::parse(reply.body);
  const msgpack::object* error = json ? json->field("error") : nullptr;
  const msgpack::object* code = error != nullptr ? wire::find_key(*error, "code") : nullptr;
  auto text = code != nullptr ? wire::as_str(*code) : std::nullopt;
  return text ? std::string(*text) : std::string();
}

std::string error_text(const http::Reply& reply) {
  // A 404 for a known route means the daemon runs without dev mode (docs/http-api.md §1.1).
  const std::string hint = reply.status == 404 ? " (is vllmd running with --dev-mode?)" : "";
  std::string fallback = "HTTP " + std::to_string(reply.status) + hint;
  auto json = JsonReply::parse(reply.body);
  if (!json) {
    if (reply.body.empty()) return fallback;
    constexpr std::size_t kShown = 200;
    std::string shown = reply.body.substr(0, kShown);
    return fallback + ": " + shown + (reply.body.size() > kShown ? "..." : "");
  }
  const msgpack::object* error = json->field("error");
  if (error == nullptr) {
    // FastAPI's shape, from a stock vLLM server.
    if (auto detail = json->string_field("detail")) return *detail;
    return fallback;
  }
  const msgpack::object* message = wire::find_key(*error, "message");
  auto text = message != nullptr ? wire::as_str(*message) : std::nullopt;
  std::string out = text ? std::string(*text) + hint : fallback;
  const msgpack::object* param = wire::find_key(*error, "param");
  if (param != nullptr) {
    if (auto name = wire::as_str(*param)) out += " (param: " + std::string(*name) + ")";
  }
  return out;
}

}  // namespace vllmd::vllmctl
