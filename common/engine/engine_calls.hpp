#pragma once
// What a caller of the engines sees: their states, the options and replies of UTILITY calls,
// and EngineCalls, the calls themselves. EngineClient (common/engine/client.hpp) implements
// it over ZeroMQ; the weight-sync service (common/api/service.hpp) takes only this, so its
// unit tests can answer the calls themselves (tests/unit/api/fake_engines.hpp).

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <utility>
#include <vector>

#include "common/wire/messages.hpp"

namespace vllmd::engine {

// kHandshaking: HELLO seen, the model is loading until READY and registration (named
// "loading"). kDisconnected: admitted, but its input connection dropped; calls fail at once.
enum class EngineState { kWaiting, kHandshaking, kReady, kDisconnected, kDead };
// "waiting", "loading", "ready", "disconnected", "dead".
std::string_view state_name(EngineState state);

struct EngineStatus {
  int rank = 0;
  EngineState state = EngineState::kWaiting;
  wire::Registration registration;  // from the latest admission
  std::string reason;               // why it is not ready, when that says more than the state
  std::uint64_t admissions = 0;     // 1 after the first handshake, 2 after a restart, ...
  // Which process of this rank it is: equal to admissions. A reconnect or a revival after a
  // timeout is the same incarnation; a restart (a new HELLO) is the next one.
  std::uint64_t incarnation = 0;
};

enum class CallErrorKind {
  kFailed,       // the engine answered with a failure message
  kTimeout,      // no answer within the call's timeout
  kUnavailable,  // engine not connected, died, restarted, or the client is shutting down
};
std::string_view error_kind_name(CallErrorKind kind);

struct CallError {
  CallErrorKind kind = CallErrorKind::kFailed;
  std::string message;
  // The call had reached the engine's socket (a timeout, or a connection lost while it was
  // pending): the engine may have run it. False: refused before sending, or answered.
  bool sent = false;
};

struct EngineReply {
  int rank = 0;
  tl::expected<std::string, CallError> value;  // msgpack of the returned value
};

struct CallOptions {
  // A constructor rather than an aggregate, so `CallOptions{timeout, marks_dead}` stays
  // warning-free (-Wmissing-field-initializers) now that the options have grown.
  CallOptions(std::chrono::milliseconds call_timeout = std::chrono::seconds(30),
              bool marks_dead = false, std::vector<std::uint64_t> expected_incarnations = {})
      : timeout(call_timeout), timeout_marks_dead(marks_dead),
        incarnations(std::move(expected_incarnations)) {}

  std::chrono::milliseconds timeout;
  // A lifecycle call that times out leaves the engine in an unknown state: mark it dead until
  // it answers again. A read-only query that times out just fails.
  bool timeout_marks_dead;
  // The incarnation each rank must still be in, indexed by rank (empty, a missing entry or
  // 0: any). A call to a rank re-admitted since fails at once as unavailable ("engine rank R
  // restarted (incarnation A, now B)") and never reaches the new process.
  std::vector<std::uint64_t> incarnations;
};

// The engines of one DP group (one per rank) and the asynchronous UTILITY calls on them.
class EngineCalls {
 public:
  EngineCalls() = default;
  virtual ~EngineCalls() = default;
  EngineCalls(const EngineCalls&) = delete;
  EngineCalls& operator=(const EngineCalls&) = delete;

  virtual int data_parallel_size() const = 0;
  // Every rank's status, by rank.
  virtual std::vector<EngineStatus> engines() const = 0;
  virtual bool all_ready() const = 0;
  // Admissions of all engines so far: it changes whenever an engine (re)joins.
  virtual std::uint64_t admissions() const = 0;

  // `args` is one msgpack array, spliced into the UTILITY payload unchanged. It may come in
  // pieces (a header and a large value still sitting in the transcoded request body): they
  // are copied once, straight into each outgoing frame.
  using ArgParts = std::vector<std::string_view>;
  // Gets the replies when the last engine answered, failed, died or timed out. It may run on
  // any thread, the caller's included (when every part failed before it was sent): it must
  // not block, and must never make a blocking call on the engines.
  using Completion = std::function<void(std::vector<EngineReply>)>;
  // The call on every engine, each with its own call id; returns at once, replies in rank
  // order. A rank that is not ready, or not the incarnation `options` expects, fails at once
  // as unavailable (never sent) while the others get theirs.
  virtual void call_all_async(std::string_view method, const ArgParts& args,
                              const CallOptions& options, Completion done) = 0;
  // The same on some ranks only (replies in the order of `ranks`).
  virtual void call_ranks_async(const std::vector<int>& ranks, std::string_view method,
                                const ArgParts& args, const CallOptions& options,
                                Completion done) = 0;
};

}  // namespace vllmd::engine
