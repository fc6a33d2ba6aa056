#include "common/reference/faults.hpp"

#include "common/util/log.hpp"

namespace vllmd::reference {

std::optional<Outcome> FaultInjector::before_reply(const ReceivedCall& call, wire::CallId call_id) {
  if (auto delay = find_fault(faults_.delay, call); delay != faults_.delay.end()) {
    util::log::info(prefix_, "injected delay of ", delay->second.count(), " ms in ", delay->first);
    if (!sleep_(delay->second)) return Outcome::kStopped;
  }
  if (auto dead = find_fault(faults_.send_dead, call); dead != faults_.send_dead.end()) {
    util::log::warning(prefix_, "injected fault: sending ENGINE_CORE_DEAD in ", *dead);
    sockets_.send(sockets_.output, wire::kEngineCoreDead);
    // Flush the frame before the process may end: close with a bounded linger and wait.
    sockets_.output.set(zmq::sockopt::linger, kFlushLingerMs);
    sockets_.output.close();
    sockets_.input.close();
    sockets_.context.close();
    return Outcome::kFaultExit;
  }
  if (auto exit = find_fault(faults_.exit_silently, call); exit != faults_.exit_silently.end()) {
    util::log::warning(prefix_, "injected fault: exiting without a reply in ", *exit);
    return Outcome::kFaultExit;
  }
  if (auto garbage = find_fault(faults_.garbage, call); garbage != faults_.garbage.end()) {
    util::log::warning(prefix_, "injected fault: malformed output frames before the reply to ",
                       *garbage);
    send_garbage(call_id);
  }
  return std::nullopt;
}

std::optional<std::string> FaultInjector::failure(const ReceivedCall& call) {
  if (auto fail = find_fault(faults_.fail, call); fail != faults_.fail.end()) return *fail;
  auto fail_once = find_fault(faults_.fail_once, call);
  if (fail_once != faults_.fail_once.end() && failed_once_.insert(*fail_once).second) {
    return *fail_once;
  }
  return std::nullopt;
}

bool FaultInjector::fails(const std::string& key) {
  if (faults_.fail.contains(key)) return true;
  return faults_.fail_once.contains(key) && failed_once_.insert(key).second;
}

// Frames a broken or hostile engine could send: none may crash the client or end the call.
void FaultInjector::send_garbage(wire::CallId call_id) {
  wire::UtilityOutput stray;  // a well-formed reply to a call nobody made
  stray.call_id = call_id;
  stray.call_id.bits += 7919;
  stray.value_msgpack = std::string("\xc0", 1);
  const std::string frames[] = {
      std::string(),                                 // empty
      std::string("\xc1", 1),                        // a byte msgpack never uses
      std::string("\x95\x00\x01", 3),                // truncated array
      "this is not msgpack at all",                  // text
      std::string(4096, '\x91'),                     // deep nesting, no leaf
      std::string("\xdd\xff\xff\xff\xff", 5),        // array claiming 4G elements
      std::string("\x95\xa1x\xa1y\xc0\xc0\xc0", 8),  // outputs of the wrong types
      wire::encode_engine_core_outputs(options_.rank, stray, now_seconds(), faults_.reply_fields),
  };
  for (const std::string& frame : frames) sockets_.send(sockets_.output, frame);
}

}  // namespace vllmd::reference
