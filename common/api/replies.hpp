#pragma once
// What the engines answered to one fanned-out call, turned into what the API reports: the
// documented error (naming ranks), agreed values, and which ranks succeeded.

#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "common/api/errors.hpp"
#include "common/engine/engine_calls.hpp"

namespace vllmd::api {

// The error for a fanned-out call, or nullopt when every engine succeeded. A dead engine
// outranks a timeout, which outranks a failure: the most basic cause is reported first.
std::optional<ApiError> summarize(std::string_view operation,
                                  const std::vector<engine::EngineReply>& replies);

// The version every engine reported, or the error: a non-string or a disagreement.
tl::expected<std::string, ApiError> agreed_version(const std::vector<engine::EngineReply>& replies);

std::optional<std::string> decode_string(const std::string& msgpack);
std::optional<bool> decode_bool(const std::string& msgpack);

// The ranks whose reply was a success.
std::vector<int> succeeded(const std::vector<engine::EngineReply>& replies);
// "engine rank 1", "engine ranks 0, 2"
std::string rank_list(const std::vector<int>& ranks);

}  // namespace vllmd::api
