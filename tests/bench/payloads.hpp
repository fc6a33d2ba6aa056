#pragma once
// Realistic /update_weights bodies for the benchmarks, generated deterministically (the same
// bytes on every run): the tensor list of a MoE model, sent either as NCCL metadata or as the
// unpacked IPC handles of an 8-GPU trainer.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vllmd::bench {

// The shape parameters of a Qwen3-MoE-like model, enough to list its tensors.
struct MoeModel {
  std::string_view name;
  std::int64_t layers, experts, hidden, moe_inner, heads, kv_heads, head_dim, vocab;
};

// Qwen3-30B-A3B-like (48 layers x 128 experts): 18,867 tensors.
inline constexpr MoeModel kMoe30B{"30b-moe", 48, 128, 2048, 768, 32, 4, 128, 151936};
// Qwen3-235B-A22B-like (94 layers x 128 experts): 36,945 tensors.
inline constexpr MoeModel kMoe235B{"235b-moe", 94, 128, 4096, 1536, 64, 4, 128, 151936};

struct Tensor {
  std::string name;
  std::vector<std::int64_t> shape;
};

std::vector<Tensor> model_tensors(const MoeModel& model);

inline constexpr int kIpcGpus = 8;
inline constexpr int kIpcHandleChars = 248;  // base64 of 186 random bytes per GPU handle

struct Body {
  std::string json;
  std::size_t tensors = 0;
};

// {"update_info": {names, dtype_names, shapes}}: what an NCCL trainer sends before it
// broadcasts the tensors themselves (~1.4 MB for the 30B model).
Body nccl_update_body(const MoeModel& model);

// {"update_info": {names, dtype_names, shapes, tensor_sizes, ipc_handles}} with ipc_handles
// unpacked: per tensor, GPU id -> base64 handle (~40 MB for the 30B model, ~79 MB for the
// 235B one), as vLLM's IPCWeightTransferUpdateInfo takes them (ipc_handles_pickled is the
// other form; one of the two, never both).
Body ipc_update_body(const MoeModel& model);

// The payloads by name, for the command line: "nccl-30b", "ipc-30b", "ipc-235b".
struct PayloadKind {
  std::string_view name;
  std::string_view backend;  // the engine backend that accepts it: "nccl" or "ipc"
  Body (*make)();
};
const std::vector<PayloadKind>& payload_kinds();

}  // namespace vllmd::bench
