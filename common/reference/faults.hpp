#pragma once
// Fault injection for the reference engine's serve loop (Faults in engine.hpp): the faults
// that strike before a call is answered (a delay, a death, an exit, garbage frames) and the
// injected failures that replace a call's answer.

#include <functional>
#include <optional>
#include <set>
#include <string>

#include "common/reference/engine.hpp"
#include "common/reference/engine_sockets.hpp"
#include "common/wire/messages.hpp"

namespace vllmd::reference {

// A fault set or map entry for the call: its worker method first, then its engine method.
template <typename Container> auto find_fault(const Container& faults, const ReceivedCall& call) {
  auto found = call.worker_method.empty() ? faults.end() : faults.find(call.worker_method);
  return found != faults.end() ? found : faults.find(call.method);
}

class FaultInjector {
 public:
  FaultInjector(const ReferenceEngineOptions& options, EngineSockets& sockets,
                std::function<bool(std::chrono::milliseconds)> sleep, const std::string& prefix)
      : options_(options), faults_(options.faults), sockets_(sockets), sleep_(std::move(sleep)),
        prefix_(prefix) {}

  // A delay, a death or garbage frames before the reply; an outcome when the connection ends.
  std::optional<Outcome> before_reply(const ReceivedCall& call, wire::CallId call_id);

  // The method name an injected failure of this call names (--inject-fail, or the first call
  // of an --inject-fail-once method), or nullopt to answer it for real.
  std::optional<std::string> failure(const ReceivedCall& call);

  // Whether the fault keyed `key` (not a call: e.g. "generate") is injected: always for
  // --inject-fail, once for --inject-fail-once.
  bool fails(const std::string& key);

  bool sleep(std::chrono::milliseconds duration) { return sleep_(duration); }

 private:
  void send_garbage(wire::CallId call_id);

  const ReferenceEngineOptions& options_;
  const Faults& faults_;
  EngineSockets& sockets_;
  std::function<bool(std::chrono::milliseconds)> sleep_;
  const std::string& prefix_;
  std::set<std::string> failed_once_;  // --inject-fail-once methods that failed already
};

}  // namespace vllmd::reference
