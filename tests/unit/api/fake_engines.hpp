#pragma once
// Engines for WeightSyncService unit tests (engine::EngineCalls): N ranks whose states and
// incarnations the test sets, every call recorded as it came, and every rank's reply given
// by the test: at once, by a responder asked as each call comes in, or later with answer(),
// so a test can restart a rank between a call's start and its end. Completions run on the
// thread that gives the last reply (the caller's, when every rank answered at once), with no
// lock held: they may make the next call.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/engine/engine_calls.hpp"

namespace vllmd::test {

// One rank's reply: the msgpack of the returned value, or the error.
using Reply = tl::expected<std::string, engine::CallError>;

// Successes, their values encoded with common/wire's packer.
Reply nil();  // what collective_rpc, set_weight_version, pause and resume return
Reply string_reply(std::string_view text);
Reply bool_reply(bool value);
// Failures. `sent`: the call had reached the engine (it may have run it).
Reply failed(std::string message, bool sent = false);  // the engine's failure message
Reply timed_out(std::string message);                  // sent
Reply unavailable(std::string message, bool sent = false);

struct RecordedCall {
  std::size_t id = 0;           // index in calls()
  std::string method;           // the engine-core method: collective_rpc, set_weight_version, ...
  std::string worker_method;    // collective_rpc's worker method, else empty
  std::string args;             // the msgpack args as sent (their parts joined)
  std::string args_json;        // the same as JSON: ["finish_weight_update",null,[],{}]
  std::vector<int> ranks;       // in the order given (every rank for call_all_async)
  engine::CallOptions options;  // the incarnations included
  // Ranks it failed on at once, never sent: not ready, or not the incarnation expected.
  std::vector<int> refused;

  // The worker method for collective_rpc, else the method.
  const std::string& name() const { return worker_method.empty() ? method : worker_method; }
  bool sent_to(int rank) const;  // among `ranks` and not refused
};

class FakeEngines final : public engine::EngineCalls {
 public:
  // `ranks` engines, all ready in incarnation 1.
  explicit FakeEngines(int ranks);

  // The ranks. Each change is told to `on_state_change` (as EngineClient's listener would).
  void set_state(int rank, engine::EngineState state, std::string reason = {});
  void restart(int rank);  // a new process: the next incarnation, ready
  engine::EngineStatus status(int rank) const;
  std::function<void(const engine::EngineStatus&)> on_state_change;

  // Asked for each rank's reply as a call comes in; nullopt leaves it pending. None set: every
  // call stays pending until answered.
  using Responder = std::function<std::optional<Reply>(const RecordedCall& call, int rank)>;
  void set_responder(Responder responder);
  // Gives a pending rank of call `id` its reply; the call's completion runs here once every
  // rank has one. False when there is no such call or the rank has its reply already.
  bool answer(std::size_t id, int rank, Reply reply);
  void answer_all(std::size_t id, const Reply& reply);  // every rank still pending

  std::vector<RecordedCall> calls() const;
  RecordedCall call(std::size_t id) const;
  std::size_t call_count() const;
  // name() of every call since `from`, in order.
  std::vector<std::string> names(std::size_t from = 0) const;
  // Whether any rank of call `id` still waits for its reply.
  bool pending(std::size_t id) const;

  // engine::EngineCalls
  int data_parallel_size() const override;
  std::vector<engine::EngineStatus> engines() const override;
  bool all_ready() const override;
  std::uint64_t admissions() const override;
  void call_all_async(std::string_view method, const ArgParts& args,
                      const engine::CallOptions& options, Completion done) override;
  void call_ranks_async(const std::vector<int>& ranks, std::string_view method,
                        const ArgParts& args, const engine::CallOptions& options,
                        Completion done) override;

 private:
  struct Open {
    std::vector<std::optional<Reply>> replies;  // by position in RecordedCall::ranks
    Completion done;
  };
  std::optional<std::string> refusal(int rank, const engine::CallOptions& options) const;
  void changed(int rank);
  // Runs the completion of call `id` when every rank has its reply (taken out of open_).
  void finish_if_answered(std::size_t id);

  mutable std::mutex mutex_;
  std::vector<engine::EngineStatus> engines_;
  std::uint64_t admissions_ = 0;
  Responder responder_;
  std::vector<RecordedCall> calls_;
  std::map<std::size_t, Open> open_;
};

}  // namespace vllmd::test
