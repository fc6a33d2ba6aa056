#pragma once
// The worker side of ReferenceCore: vLLM's per-worker weight-transfer methods, reached through
// collective_rpc, each acting on one worker's WorkerState.

#include <msgpack.hpp>
#include <string>
#include <string_view>
#include <tl/expected.hpp>

#include "common/reference/core.hpp"
#include "common/reference/python_call.hpp"

namespace vllmd::reference {

// What a worker knows besides its state.
struct WorkerContext {
  int global_index = 0;  // dp_rank * world_size + rank: picks its entry of a list update_info
  Backend backend = Backend::kNccl;
  bool insecure_serialization = true;  // VLLM_ALLOW_INSECURE_SERIALIZATION=1
  // Where the worker sits, for its checksum keys (dp{}:pp{}:pcp{}:tp{}:ep{}:name).
  int dp_index = 0;
  int pp_rank = 0;
  int pcp_rank = 0;
  int tp_rank = 0;
  // The engine's model, when it has one: the tcp backend's tensors must fit it.
  const LlamaModel* model = nullptr;
};

// Runs `method(*args, **kwargs)` on one worker: its return value as msgpack (nil for None).
// The error is the exception text a Python worker would raise (str(e)), before any executor
// wrapping. Besides vLLM's weight-transfer methods, the reference workers have
// echo_args_kwargs (vLLM's test extension): {"args": args, "kwargs": kwargs, "total_items": N},
// and vLLM's weight checker's compute_weight_checksums (SHA-256 of each tensor's bytes, by
// vLLM's key) and reset_weights (every tensor's bytes overwritten with random ones).
tl::expected<std::string, std::string> run_worker_method(WorkerState& worker,
                                                         const WorkerContext& context,
                                                         std::string_view method, Positional args,
                                                         const msgpack::object* kwargs);

}  // namespace vllmd::reference
