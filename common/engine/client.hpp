#pragma once
// The frontend side of the engine-core protocol: binds the sockets, handshakes with N engines
// (one per DP rank), and runs UTILITY calls on one engine or fanned out to all of them.
//
// One IO thread owns every socket. Callers on any thread build their frames, hand them over
// through a queue, and block until each engine answers, fails, dies or times out. The
// asynchronous calls and status queries are EngineCalls (engine_calls.hpp), which the
// weight-sync service takes.
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

#include "common/engine/engine_calls.hpp"
#include "common/engine/engine_requests.hpp"
#include "common/wire/messages.hpp"

namespace vllmd::engine {

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
  // A session's engine keeps its requests until loaded this much above the least loaded
  // (load_score); then the session moves (session_affinity.hpp).
  std::int64_t session_imbalance = 32;
  wire::DecodeLimits reply_limits;
  // Told on the IO thread whenever an engine changes state; keep it quick.
  std::function<void(const EngineStatus&)> on_state_change;
};

struct Batch;

class EngineClient final : public EngineCalls, public EngineRequests {
 public:
  static tl::expected<std::unique_ptr<EngineClient>, std::string> create(ClientOptions options);
  ~EngineClient() override;  // close()
  // Fails pending calls (unavailable), stops the IO thread and closes the sockets (linger 0);
  // later calls fail at once. The object stays usable for status queries.
  void close();
  EngineClient(const EngineClient&) = delete;
  EngineClient& operator=(const EngineClient&) = delete;

  // Endpoints as bound (port 0 resolved), and as advertised to engines in INIT.
  const std::string& handshake_endpoint() const;
  const std::string& input_endpoint() const;
  const std::string& output_endpoint() const;
  int data_parallel_size() const override;

  std::vector<EngineStatus> engines() const override;
  bool all_ready() const override;
  bool wait_all_ready(std::chrono::milliseconds timeout) const;
  std::uint64_t admissions() const override;
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

  // Blocking calls; `args` as for call_all_async (EngineCalls::ArgParts).
  EngineReply call(int rank, std::string_view method, const ArgParts& args,
                   const CallOptions& options);
  // The same call on every engine, each with its own call id; replies in rank order.
  std::vector<EngineReply> call_all(std::string_view method, const ArgParts& args,
                                    const CallOptions& options);

  // Asynchronous call_all: returns at once; `done` gets the replies in rank order when the
  // last engine answered, failed, died or timed out. It runs on the IO thread (or on the
  // caller's, when the call fails before it was sent): it must not block, and must never
  // make a blocking call on this client.
  void call_all_async(std::string_view method, const ArgParts& args, const CallOptions& options,
                      Completion done) override;
  // The same on some ranks only (replies in the order of `ranks`).
  void call_ranks_async(const std::vector<int>& ranks, std::string_view method,
                        const ArgParts& args, const CallOptions& options, Completion done) override;

  // Generations (engine_requests.hpp): the sink hears the rest on the IO thread.
  void generate(Generation generation) override;
  void generate_all(std::vector<Generation> generations) override;
  void abort(std::vector<std::string> request_ids) override;
  std::vector<EngineLoad> loads() const override;

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
