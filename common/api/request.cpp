#include "common/api/request.hpp"

#include <algorithm>
#include <cctype>

#include "common/api/table.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

using wire::JsonKind;

tl::expected<wire::Transcoded, ApiError> parse_object_body(std::string_view body) {
  auto transcoded = wire::json_to_msgpack(body);
  if (!transcoded) {
    return tl::unexpected(json_parse_error("Invalid JSON body: " + transcoded.error().describe()));
  }
  if (transcoded->root != JsonKind::kObject) {
    return tl::unexpected(invalid_request("Request body must be a JSON object"));
  }
  return std::move(*transcoded);
}

namespace {

std::optional<std::string> string_member(const wire::Transcoded& body,
                                         const wire::TopLevelMember& member) {
  if (member.kind != JsonKind::kString) return std::nullopt;
  auto handle = wire::decode(body.value_bytes(member));
  if (!handle) return std::nullopt;
  auto text = wire::as_str(handle->get());
  return text ? std::optional<std::string>(std::string(*text)) : std::nullopt;
}

ApiError bad_member(const Route& route) {
  const std::string member(route.member);
  switch (route.member_kind) {
    case Member::kObject: return invalid_request("'" + member + "' must be a JSON object", member);
    case Member::kObjectOrList:
      return invalid_request(
          "'" + member + "' must be a JSON object or a list of per-worker JSON objects", member);
    case Member::kString:
    case Member::kOptionalString:
    case Member::kNone: break;
  }
  // As vLLM words it: the route's name, not the member's.
  return invalid_request("Invalid '" + std::string(route.path.substr(1)) + "' request body",
                         member);
}

}  // namespace

tl::expected<MemberValue, ApiError> member_value(const Route& route, const wire::Transcoded& body) {
  const wire::TopLevelMember* member = body.find(route.member);
  MemberValue found;
  switch (route.member_kind) {
    case Member::kNone: return found;
    case Member::kObject:
      if (member == nullptr || member->kind != JsonKind::kObject) break;
      found.value = body.value_bytes(*member);
      return found;
    case Member::kObjectOrList:
      if (member == nullptr ||
          !(member->kind == JsonKind::kObject ||
            (member->kind == JsonKind::kArray && member->all_elements_objects))) {
        break;
      }
      found.value = body.value_bytes(*member);
      return found;
    case Member::kOptionalString:
      if (member == nullptr || member->kind == JsonKind::kNull) return found;
      [[fallthrough]];
    case Member::kString:
      if (member == nullptr || !(found.text = string_member(body, *member))) break;
      return found;
  }
  return tl::unexpected(bad_member(route));
}

tl::expected<void, ApiError> validate_body(Call& call) {
  const Route& route = *call.route;
  if (route.body == Body::kNone || (route.body == Body::kOptional && call.body.empty())) return {};
  auto parsed = parse_object_body(call.body);
  if (!parsed) return tl::unexpected(parsed.error());
  call.document = std::move(*parsed);
  std::string().swap(call.body);  // the msgpack holds everything now
  auto member = member_value(route, *call.document);
  if (!member) return tl::unexpected(member.error());
  call.value = member->value;
  call.text = std::move(member->text);
  return {};
}

const std::string* query_value(const Query& query, std::string_view key) {
  const std::string* found = nullptr;
  for (const auto& [name, value] : query) {
    if (name == key) found = &value;
  }
  return found;
}

tl::expected<bool, ApiError> query_bool(const Query& query, std::string_view key, bool fallback) {
  const std::string* value = query_value(query, key);
  if (value == nullptr) return fallback;
  std::string lower(*value);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "true" || lower == "1" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "0" || lower == "no" || lower == "off") return false;
  return tl::unexpected(invalid_request(
      "'" + std::string(key) + "' must be a boolean, got '" + *value + "'", std::string(key)));
}

tl::expected<std::string, ApiError> pause_mode(const Query& query, std::string_view param) {
  const std::string* value = query_value(query, "mode");
  if (value == nullptr) return std::string("abort");
  if (*value == "abort" || *value == "wait" || *value == "keep") return *value;
  return tl::unexpected(invalid_request(
      "'mode' must be one of abort, wait, keep; got '" + *value + "'", std::string(param)));
}

namespace {
std::string percent_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out.push_back(' ');
    } else if (text[i] == '%' && i + 2 < text.size() &&
               std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}
}  // namespace

Query parse_query(std::string_view text) {
  Query query;
  while (!text.empty()) {
    const std::size_t amp = text.find('&');
    const std::string_view pair = text.substr(0, amp);
    if (!pair.empty()) {
      const std::size_t eq = pair.find('=');
      query.emplace_back(percent_decode(pair.substr(0, eq)),
                         eq == std::string_view::npos ? "" : percent_decode(pair.substr(eq + 1)));
    }
    if (amp == std::string_view::npos) break;
    text.remove_prefix(amp + 1);
  }
  return query;
}

}  // namespace vllmd::api
