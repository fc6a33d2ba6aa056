#pragma once
// Engine-call arguments built from a request (Route::engine_args): each checks the query or
// the validated body and packs the utility method's msgpack args, or gives the 400. They run
// before a call may queue or reach an engine.

#include <optional>
#include <string>
#include <tl/expected.hpp>
#include <vector>

#include "common/api/call.hpp"
#include "common/api/errors.hpp"
#include "common/api/request.hpp"

namespace vllmd::api {

using EngineArgs = tl::expected<std::string, ApiError> (*)(const Call& call);

// pause_scheduler(mode, clear_cache): mode=abort|wait|keep (abort), clear_cache (true).
tl::expected<std::string, ApiError> pause_args(const Call& call);
// reset_prefix_cache(reset_running_requests, reset_connector): both false by default.
tl::expected<std::string, ApiError> reset_prefix_cache_args(const Call& call);
// sleep(level, mode): level 0-2 (1), mode=abort|wait|keep (abort).
tl::expected<std::string, ApiError> sleep_args(const Call& call);
// wake_up(tags): every `tags` key (not `tags[]`), none: nil (everything wakes).
tl::expected<std::string, ApiError> wake_up_args(const Call& call);

// collective_rpc(method, timeout, args, kwargs) from the body: `method` required, `timeout` a
// number (sent as a float64) or null, `args` a list ([]), `kwargs` an object ({}). rpc.cpp.
tl::expected<std::string, ApiError> rpc_args(const Call& call);

// collective_rpc of compute_weight_checksums or reset_weights from the weight checker's body:
// `action` checksum|reset|compare, `baseline` an object of strings for compare.
// weight_checker.cpp.
tl::expected<std::string, ApiError> weight_checker_args(const Call& call);

tl::expected<int, ApiError> sleep_level(const Query& query);
// The tags a wake names: weights, kv_cache or scheduling; nullopt: none named (all).
tl::expected<std::optional<std::vector<std::string>>, ApiError> wake_tags(const Query& query);

}  // namespace vllmd::api
