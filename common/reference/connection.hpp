#pragma once
// One connection to a frontend, from HELLO to the end of serving, on the engine thread: the
// handshake (handshake.hpp), then the serve loop, which answers UTILITY calls one at a time
// like vLLM's engine-core busy loop, with the faults of faults.hpp, and steps the scheduler
// (scheduler.hpp) for the ADDs it receives: one EngineCoreOutputs, with its aux frames, per
// step interval while requests are runnable.

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/reference/core.hpp"
#include "common/reference/engine.hpp"
#include "common/reference/engine_sockets.hpp"
#include "common/reference/faults.hpp"
#include "common/reference/held_replies.hpp"
#include "common/wire/generation_output.hpp"
#include "common/wire/generation_request.hpp"

namespace vllmd::reference {

class FrontendConnection {
 public:
  FrontendConnection(const ReferenceEngineOptions& options, const std::atomic<bool>& stop_requested,
                     std::function<bool(std::chrono::milliseconds)> sleep);

  Outcome run();

 private:
  Outcome serve();
  // Serves one input message; an outcome when the connection must end.
  std::optional<Outcome> handle(const std::vector<zmq::message_t>& frames);
  std::optional<Outcome> handle_utility(std::string_view payload);
  void handle_add(std::string_view payload);
  void handle_abort(std::string_view payload);
  void run_step();
  // Waits for input until the next step or held reply is due.
  void wait_for_input(std::optional<std::chrono::steady_clock::time_point> deadline);
  wire::UtilityOutput answer(const ReceivedCall& call, wire::CallId call_id);
  void send_due_replies();

  const ReferenceEngineOptions& options_;
  std::string prefix_;
  EngineSockets sockets_;
  FaultInjector faults_;
  ReferenceCore core_;
  HeldReplies held_;
  const wire::RequestLayout& layout_;  // of the version it registers, as the frontend picks
  wire::OutputEncoding encoding_;
};

}  // namespace vllmd::reference
