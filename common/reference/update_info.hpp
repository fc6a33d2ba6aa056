#pragma once
// One worker's update_info read the way vLLM's weight-transfer engine reads it: the backend's
// update-info dataclass built from the dict (parse_update_info), its __post_init__ checks, and
// what receive_weights asserts before it touches a tensor. The IPC rules follow
// vllm/distributed/weight_transfer/ipc_engine.py and base.py.

#include <cstdint>
#include <msgpack.hpp>
#include <string>
#include <tl/expected.hpp>

#include "common/reference/worker.hpp"

namespace vllmd::reference {

// The number of tensors the update names, or the exception text vLLM raises.
tl::expected<std::uint32_t, std::string> read_update_info(const WorkerContext& context,
                                                          const msgpack::object& info);

}  // namespace vllmd::reference
