#pragma once
// The reference engine: the engine side of the wire protocol around ReferenceCore. It
// connects to a frontend's handshake address exactly as a headless `vllm serve` does (HELLO,
// INIT, the DP group for coordinated DP, registration map, READY) and then serves UTILITY
// calls one at a time, like vLLM's engine-core busy loop (a blocked call blocks the ones
// behind it), and generates for ADDs: one EngineCoreOutputs per step.
//
// Runs on its own thread; vllmd embeds one in-process, tests and `vllm-ref-engine` run it as a
// separate process. Fault injection (off by default) lets tests provoke every failure mode.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/reference/core.hpp"
#include "common/reference/dp_group.hpp"

namespace vllmd::reference {

// Faults are keyed by method name: an engine-core method ("get_weight_version") or a worker
// method reached through collective_rpc ("update_weights"). "generate" in fail (fail_once)
// ends every (the first) request with finish_reason ERROR.
struct Faults {
  std::set<std::string> fail;                              // reply with a failure
  std::set<std::string> fail_once;                         // the same, the first time only
  std::map<std::string, std::chrono::milliseconds> delay;  // block the engine first
  std::map<std::string, std::chrono::milliseconds> hold;   // reply late, serving others
  std::set<std::string> exit_silently;                     // exit without replying
  std::set<std::string> send_dead;                         // send ENGINE_CORE_DEAD, then exit
  std::set<std::string> garbage;  // send malformed output frames first, then the real reply
  int reply_fields = 8;  // EngineCoreOutputs length: 8 as msgspec writes it; 5 as older peers
  bool empty_registration = false;  // behave like an older engine
  bool ready_before_registration = false;
  // After INIT, before registration and READY: a model load that takes this long.
  std::chrono::milliseconds delay_ready{0};
};

// One UTILITY call as the engine received it, for tests and --record; ADD and ABORT too, with
// the method "ADD" or "ABORT" and their msgpack payload as args.
struct ReceivedCall {
  std::string method;
  std::string args_msgpack;   // exactly the bytes on the wire
  std::string worker_method;  // for collective_rpc, else empty
};

struct ReferenceEngineOptions {
  std::string handshake_address;  // tcp://host:port or ipc:///path
  int rank = 0;                   // DP rank; identity = rank as 2 little-endian bytes
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  int prefill_context_parallel_size = 1;
  int data_parallel_size = 1;
  // MoE data parallelism: the ranks form a DP group at the DP master INIT names before READY
  // and report the full DP size. Otherwise each rank is independent and reports DP size 1.
  bool coordinated_dp = false;
  std::chrono::milliseconds dp_group_timeout{std::chrono::seconds(30)};
  Backend backend = Backend::kNccl;
  bool insecure_serialization = true;  // as with VLLM_ALLOW_INSECURE_SERIALIZATION=1
  int running_requests = 0;            // fake requests holding KV blocks (ReferenceCore)
  // Generation (scheduler.hpp, tokens.hpp).
  std::size_t max_num_seqs = 256;  // running at once; the rest wait
  int tokens_per_step = 1;
  std::chrono::microseconds step_interval{std::chrono::milliseconds(5)};  // 0: back to back
  std::int64_t vocab_size = 32000;
  // VLLM_MSGPACK_ZERO_COPY_THRESHOLD: logprob arrays of this many bytes go in extra frames.
  std::size_t zero_copy_threshold = 256;
  std::string vllm_version = "0.0.0+reference";
  std::int64_t max_model_len = 4096;  // registered, as a real engine registers its model's
  // The model to generate from (model_loader.hpp); none: the token formula. One engine's own:
  // its forward pass keeps scratch buffers, so two engines must not share one.
  std::shared_ptr<LlamaModel> model;
  WeightSource model_source;  // where its weights came from: what reload_weights reads
  Faults faults;
  std::function<void(const ReceivedCall&)> on_call;  // called before the call is handled
  std::function<void(const DpGroup&)> on_dp_group;   // called once the DP group formed
  // After a step's output went out: the requests whose first tokens it held, and when it was
  // sent (steady clock, seconds). For benchmarks that time what a frontend adds.
  std::function<void(const std::vector<std::string>& request_ids, double sent_at)> on_first_outputs;
  // What "exit" means for exit_silently/send_dead: the standalone binary passes a function
  // that ends the process; by default the engine thread closes its sockets and stops.
  std::function<void()> on_fault_exit;
  std::chrono::milliseconds init_timeout{std::chrono::minutes(5)};
};

class ReferenceEngine {
 public:
  explicit ReferenceEngine(ReferenceEngineOptions options);
  ~ReferenceEngine();  // stop() and join
  ReferenceEngine(const ReferenceEngine&) = delete;
  ReferenceEngine& operator=(const ReferenceEngine&) = delete;

  void start();  // spawns the engine thread
  void stop();   // asks the thread to end (also interrupts injected delays) and joins it
  void wait();   // joins without asking it to end
  bool running() const { return running_.load(); }
  // Empty while running or after a clean stop; the reason when the thread ended on an error.
  std::string error() const;

 private:
  void run();
  bool sleep_unless_stopped(std::chrono::milliseconds duration);

  ReferenceEngineOptions options_;
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> running_{false};
  mutable std::mutex mutex_;
  std::condition_variable stop_signal_;
  std::string error_;
};

}  // namespace vllmd::reference
