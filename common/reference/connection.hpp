#pragma once
// One connection to a frontend, from HELLO to the end of serving, on the engine thread: the
// handshake (handshake.hpp), then the serve loop, which answers UTILITY calls one at a time
// like vLLM's engine-core busy loop, with the faults of faults.hpp.

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/reference/core.hpp"
#include "common/reference/engine.hpp"
#include "common/reference/engine_sockets.hpp"
#include "common/reference/faults.hpp"
#include "common/reference/held_replies.hpp"

namespace vllmd::reference {

class FrontendConnection {
 public:
  FrontendConnection(const ReferenceEngineOptions& options, const std::atomic<bool>& stop_requested,
                     std::function<bool(std::chrono::milliseconds)> sleep);

  Outcome run();

 private:
  Outcome serve();
  // Serves one UTILITY call; an outcome when the connection must end.
  std::optional<Outcome> handle_utility(std::string_view payload);
  wire::UtilityOutput answer(const ReceivedCall& call, wire::CallId call_id);
  void send_due_replies();

  const ReferenceEngineOptions& options_;
  std::string prefix_;
  EngineSockets sockets_;
  FaultInjector faults_;
  ReferenceCore core_;
  HeldReplies held_;
};

}  // namespace vllmd::reference
