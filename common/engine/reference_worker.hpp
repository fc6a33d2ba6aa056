#pragma once
// The worker side of ReferenceCore: vLLM's per-worker weight-transfer methods, reached through
// collective_rpc, each acting on one TP worker's WorkerState.

#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <tl/expected.hpp>

#include "common/engine/python_call.hpp"
#include "common/engine/reference_core.hpp"

namespace vllmd::engine::detail {

// Runs `method(*args, **kwargs)` on one worker. `global_index` is the worker's index over all
// engines (dp_rank * tensor_parallel_size + tp_rank); it picks the worker's entry of a list
// update_info. The error is the exception text a Python worker would raise.
tl::expected<void, std::string> run_worker_method(WorkerState& worker, int global_index,
                                                  Backend backend, std::string_view method,
                                                  Positional args, const msgpack::object* kwargs);

}  // namespace vllmd::engine::detail
