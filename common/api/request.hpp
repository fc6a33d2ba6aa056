#pragma once
// Request validation (docs/http-api.md §3): everything is checked here, before anything
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

struct Call;
struct Route;

// A route's body member (Route::member, member_kind), checked: its msgpack bytes inside the
// body, or its text for a string member.
struct MemberValue {
  std::string_view value;
  std::optional<std::string> text;
};
tl::expected<MemberValue, ApiError> member_value(const Route& route, const wire::Transcoded& body);

// A call's body, as its route takes it (Route::body, member, member_kind): transcoded into
// call.document (the raw body released), the member's bytes into call.value, a string member
// into call.text. The 400s of docs/http-api.md §3.
tl::expected<void, ApiError> validate_body(Call& call);

// Query parameters. Booleans accept what FastAPI accepts: true/false, 1/0, yes/no, on/off.
const std::string* query_value(const Query& query, std::string_view key);
tl::expected<bool, ApiError> query_bool(const Query& query, std::string_view key, bool fallback);
// mode=abort|wait|keep (default abort); `param` names it in the 400 (/sleep's is
// "query.mode", as vLLM's frontends name it there).
tl::expected<std::string, ApiError> pause_mode(const Query& query, std::string_view param = "mode");

// Parses "a=1&b=two" with percent-decoding.
Query parse_query(std::string_view text);

}  // namespace vllmd::api
