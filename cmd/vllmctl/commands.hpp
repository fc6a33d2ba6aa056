#pragma once
// vllmctl's commands. Each returns the process exit code (product.md): 0 only on success.

#include <optional>
#include <string>
#include <vector>

#include "cmd/vllmctl/context.hpp"

namespace vllmd::vllmctl {

int weights_init(const Context& context, const std::string& info);
int weights_start(const Context& context, bool draft);
int weights_update(const Context& context, const std::vector<std::string>& infos);
int weights_finish(const Context& context, const std::optional<std::string>& version);
int weights_info(const Context& context);
int weights_set_version(const Context& context, const std::string& version);
int world_size(const Context& context, bool include_dp);
// An empty mode leaves the server's default (abort).
int pause(const Context& context, const std::string& mode, bool keep_cache);
int resume(const Context& context);
int health(const Context& context);
int reload(const Context& context);

struct SyncArgs {
  std::string init;
  std::vector<std::string> updates;
  std::optional<std::string> version;
  bool no_pause = false;
};
int weights_sync(const Context& context, const SyncArgs& args);

int status(const Context& context);

// Shared by the commands: one route called, its result printed (or its failure reported
// under `step`). Returns the exit code.
int run_step(const Context& context, const std::string& step, const Call& call,
             const std::string& detail = "");

// Request bodies vllmctl builds itself.
std::string finish_body(const std::string& version);       // {"weight_version":V}
std::string set_version_body(const std::string& version);  // {"new_version":V}

}  // namespace vllmd::vllmctl
