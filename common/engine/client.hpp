#pragma once
// The frontend side of the engine-core protocol: binds the sockets, handshakes with N engines
// (one per DP rank), and runs UTILITY calls on one engine or fanned out to all of them.
//
// One IO thread owns every socket. Callers on any thread build their frames, hand them over
// through a queue, and block until each engine answers, fails, dies or times out.
//
// Liveness. An engine is dead after ENGINE_CORE_DEAD, after mark_dead() (a managed engine
// process that exited), and after a timed-out lifecycle call or liveness probe; a timed-out
// engine is alive again as soon as it answers. A new HELLO under its identity is a restart:
// handshaken and admitted again, as a new incarnation. A dropped input connection makes an
// engine only disconnected: ZeroMQ reconnects it under the same identity, and it is ready
// again once a probe answers. There is no deadline from HELLO to READY (the model load)
// unless startup_timeout is set, and even then a late READY is admitted.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
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

struct ClientOptions {
  // Where engines connect first: tcp://host:port (port 0 picks one) or ipc:///path.
  std::string handshake_address = "tcp://127.0.0.1:0";
  // Host written into INIT for the input/output sockets. Default: the handshake host. Needed
  // when the handshake binds all interfaces (0.0.0.0, *), which is never advertised.
  std::string advertised_host;
  // Bind addresses for input/output; default: the handshake host on port 0 (tcp) or sibling
  // paths of the handshake path (ipc).
  std::string input_address;
  std::string output_address;
  int data_parallel_size = 1;
  // Coordinated (MoE) data parallelism: INIT's parallel_config names this DP master, so that
  // ranks started by different launchers (hosts) form one DP group. Dense models: none.
  std::optional<wire::DataParallelMaster> data_parallel_master;
  // From HELLO to READY + registration (the model load, which can take well over ten
  // minutes); 0: no limit. Past it the engine reads as dead, but a READY and registration
  // that still come are admitted.
  std::chrono::milliseconds startup_timeout{0};
  // A ready engine with no call in flight is asked is_scheduler_paused this often; 0: never.
  // Probes are internal: never reported to callers, not counted in pending_calls().
  std::chrono::milliseconds probe_interval = std::chrono::seconds(10);
  // A probe not answered in time marks the engine dead until it answers.
  std::chrono::milliseconds probe_timeout = std::chrono::seconds(10);
  wire::DecodeLimits reply_limits;
  // Told on the IO thread whenever an engine changes state; keep it quick.
  std::function<void(const EngineStatus&)> on_state_change;
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

struct Batch;

class EngineClient {
 public:
  static tl::expected<std::unique_ptr<EngineClient>, std::string> create(ClientOptions options);
  ~EngineClient();  // close()
  // Fails pending calls (unavailable), stops the IO thread and closes the sockets (linger 0);
  // later calls fail at once. The object stays usable for status queries.
  void close();
  EngineClient(const EngineClient&) = delete;
  EngineClient& operator=(const EngineClient&) = delete;

  // Endpoints as bound (port 0 resolved), and as advertised to engines in INIT.
  const std::string& handshake_endpoint() const;
  const std::string& input_endpoint() const;
  const std::string& output_endpoint() const;
  int data_parallel_size() const;

  std::vector<EngineStatus> engines() const;
  bool all_ready() const;
  bool wait_all_ready(std::chrono::milliseconds timeout) const;
  // Admissions of all engines so far: it changes whenever an engine (re)joins.
  std::uint64_t admissions() const;
  // Calls sent and not yet answered, failed or expired (as of the IO thread's last round);
  // liveness probes are not counted.
  std::size_t pending_calls() const;

  // Told on the IO thread after every state change (after ClientOptions::on_state_change).
  // May be set, replaced or cleared (nullptr) at any time from any thread. Keep it quick; it
  // may submit asynchronous calls but must never make a blocking one on this client.
  using StateListener = std::function<void(const EngineStatus&)>;
  void set_state_listener(StateListener listener);
  // Marks an engine dead from outside (its process is known to have exited): its pending
  // calls fail at once. Thread-safe; takes effect on the IO thread.
  void mark_dead(int rank, std::string reason);

  // `args` is one msgpack array, spliced into the UTILITY payload unchanged. It may come in
  // pieces (a header and a large value still sitting in the transcoded request body): they
  // are copied once, straight into each outgoing frame.
  using ArgParts = std::vector<std::string_view>;
  EngineReply call(int rank, std::string_view method, const ArgParts& args,
                   const CallOptions& options);
  // The same call on every engine, each with its own call id; replies in rank order.
  std::vector<EngineReply> call_all(std::string_view method, const ArgParts& args,
                                    const CallOptions& options);

  // Asynchronous call_all: returns at once; `done` gets the replies in rank order when the
  // last engine answered, failed, died or timed out. It runs on the IO thread (or on the
  // caller's, when the call fails before it was sent): it must not block, and must never
  // make a blocking call on this client.
  using Completion = std::function<void(std::vector<EngineReply>)>;
  void call_all_async(std::string_view method, const ArgParts& args, const CallOptions& options,
                      Completion done);
  // The same on some ranks only (replies in the order of `ranks`).
  void call_ranks_async(const std::vector<int>& ranks, std::string_view method,
                        const ArgParts& args, const CallOptions& options, Completion done);

  struct Impl;

 private:
  explicit EngineClient(std::unique_ptr<Impl> impl);
  std::shared_ptr<Batch> submit(const std::vector<int>& ranks, std::string_view method,
                                const ArgParts& args, const CallOptions& options, Completion done);
  static std::vector<EngineReply> wait(const std::shared_ptr<Batch>& batch,
                                       const CallOptions& options);
  std::vector<int> all_ranks() const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vllmd::engine
