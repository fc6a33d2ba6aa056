#pragma once
// The reference engine's side of the engine-core handshake, as a headless `vllm serve` does
// it: HELLO, INIT, the DP group for coordinated DP, the registration map and READY.

#include <functional>
#include <string>

#include "common/reference/engine.hpp"
#include "common/reference/engine_sockets.hpp"

namespace vllmd::reference {

struct HandshakeResult {
  bool completed = false;      // false: stopped first
  int data_parallel_size = 1;  // the engine's, or INIT's for coordinated DP
};

// Opens the sockets in `sockets` and takes the handshake to READY; throws on protocol errors.
// `sleep` waits unless stopped (false when stopped).
HandshakeResult run_handshake(const ReferenceEngineOptions& options, int world_size,
                              EngineSockets& sockets,
                              const std::function<bool(std::chrono::milliseconds)>& sleep,
                              const std::string& log_prefix);

}  // namespace vllmd::reference
