#pragma once
// Request validation (http-api.md section 3): everything is checked here, before anything
// reaches an engine. JSON bodies are transcoded to msgpack once; the validated values are
// byte ranges of that msgpack, passed through to the engine unchanged.

#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <utility>
#include <vector>

#include "common/api/errors.hpp"
#include "common/wire/json_to_msgpack.hpp"

namespace vllmd::api {

using Query = std::vector<std::pair<std::string, std::string>>;

// The body as a JSON object, transcoded; json_parse_error / "must be a JSON object" otherwise.
tl::expected<wire::Transcoded, ApiError> parse_object_body(std::string_view body);

// The msgpack bytes of `init_info` (an object).
tl::expected<std::string_view, ApiError> init_info(const wire::Transcoded& body);
// The msgpack bytes of `update_info` (an object, or an array of objects).
tl::expected<std::string_view, ApiError> update_info(const wire::Transcoded& body);
// `weight_version` of a finish body: absent or null -> nullopt, a string -> it.
tl::expected<std::optional<std::string>, ApiError> finish_version(const wire::Transcoded& body);
// `new_version` of an update_weight_version body: a string.
tl::expected<std::string, ApiError> new_version(const wire::Transcoded& body);

// Query parameters. Booleans accept what FastAPI accepts: true/false, 1/0, yes/no, on/off.
const std::string* query_value(const Query& query, std::string_view key);
tl::expected<bool, ApiError> query_bool(const Query& query, std::string_view key, bool fallback);
tl::expected<std::string, ApiError> pause_mode(const Query& query);

// Parses "a=1&b=two" with percent-decoding.
Query parse_query(std::string_view text);

}  // namespace vllmd::api
