#include "common/api/replies.hpp"

#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

using engine::CallErrorKind;
using engine::EngineReply;

std::optional<ApiError> summarize(std::string_view operation,
                                  const std::vector<EngineReply>& replies) {
  std::optional<CallErrorKind> worst;
  std::string details;
  for (const EngineReply& reply : replies) {
    if (reply.value) continue;
    const engine::CallError& error = reply.value.error();
    if (!details.empty()) details += "; ";
    if (replies.size() > 1 && error.kind == CallErrorKind::kFailed) {
      details += "engine rank " + std::to_string(reply.rank) + ": ";
    }
    details += error.message;
    if (!worst || error.kind == CallErrorKind::kUnavailable ||
        (error.kind == CallErrorKind::kTimeout && *worst == CallErrorKind::kFailed)) {
      worst = error.kind;
    }
  }
  if (!worst) return std::nullopt;
  const std::string message = "failed to call " + std::string(operation) + ": " + details;
  switch (*worst) {
    case CallErrorKind::kUnavailable: return engine_unavailable(message);
    case CallErrorKind::kTimeout: return engine_timeout(message);
    case CallErrorKind::kFailed: break;
  }
  return server_error(message);
}

std::optional<std::string> decode_string(const std::string& msgpack) {
  auto handle = wire::decode(msgpack);
  if (!handle) return std::nullopt;
  auto text = wire::as_str(handle->get());
  return text ? std::optional<std::string>(std::string(*text)) : std::nullopt;
}

std::optional<bool> decode_bool(const std::string& msgpack) {
  auto handle = wire::decode(msgpack);
  return handle ? wire::as_bool(handle->get()) : std::nullopt;
}

tl::expected<std::string, ApiError> agreed_version(const std::vector<EngineReply>& replies) {
  std::optional<std::string> agreed;
  std::string seen;
  for (const EngineReply& reply : replies) {
    auto version = decode_string(*reply.value);
    if (!version) {
      return tl::unexpected(server_error("failed to call get_weight_version: engine rank " +
                                         std::to_string(reply.rank) +
                                         " returned a non-string version"));
    }
    if (!seen.empty()) seen += ", ";
    seen += "rank " + std::to_string(reply.rank) + " '" + *version + "'";
    if (agreed && *agreed != *version) {
      return tl::unexpected(server_error("engines disagree on the weight version: " + seen));
    }
    agreed = *version;
  }
  return agreed.value_or("");
}

std::vector<int> succeeded(const std::vector<EngineReply>& replies) {
  std::vector<int> ranks;
  for (const EngineReply& reply : replies) {
    if (reply.value) ranks.push_back(reply.rank);
  }
  return ranks;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "engine rank " : "engine ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace vllmd::api
