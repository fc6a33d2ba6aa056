#pragma once
// GET /server_info's body: vLLM's three members (vllm_config: vllmd's effective configuration
// as TOML text or as JSON; vllm_env: the VLLM*/VLLMD* environment without secret-like names;
// system_env) and vllmd's own: its version and each engine's state and registration.

#include <string>
#include <vector>

#include "common/engine/engine_calls.hpp"
#include "daemon/config.hpp"

namespace vllmd::daemon {

std::string server_info(const Config& config, const std::vector<engine::EngineStatus>& engines,
                        bool json_config);

// Whether an environment variable's name looks like it holds a secret (KEY, SECRET, TOKEN,
// PASSWORD, CREDENTIAL or AUTH in any case), as vLLM's Rust frontend filters them.
bool secret_like(std::string_view name);

}  // namespace vllmd::daemon
