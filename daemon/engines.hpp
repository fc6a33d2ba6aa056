#pragma once
// The engines behind vllmd, per mode: the engine client always, plus the in-process reference
// engine (embedded) or a supervised engine process (managed).

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <tl/expected.hpp>

#include "common/engine/client.hpp"
#include "common/reference/engine.hpp"
#include "daemon/config.hpp"

namespace vllmd::daemon {

class Engines {
 public:
  static tl::expected<std::unique_ptr<Engines>, std::string> start(const Config& config);
  ~Engines();

  engine::EngineClient& client() { return *client_; }

 private:
  Engines() = default;
  tl::expected<void, std::string> spawn_managed(const Config& config);

  std::unique_ptr<engine::EngineClient> client_;
  std::unique_ptr<reference::ReferenceEngine> embedded_;
  pid_t managed_pid_ = -1;
  std::atomic<bool> managed_exited_{false};
  std::atomic<bool> stopping_{false};
  std::thread supervisor_;
};

// `{handshake_address}`, `{handshake_host}`, `{handshake_port}` replaced in each argument.
std::vector<std::string> fill_command(const std::vector<std::string>& command,
                                      const std::string& handshake_endpoint);

}  // namespace vllmd::daemon
