#pragma once
// The engine-side semantics of weight synchronization, as vLLM's EngineCore and its workers
// implement them (docs/engine-protocol.md §5.3), without any sockets: a UTILITY method name
// and its msgpack args in, a msgpack value or a failure message out. ReferenceEngine puts this
// behind the wire protocol; unit tests drive it directly.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <utility>
#include <vector>

#include "common/reference/llama.hpp"
#include "common/reference/model_loader.hpp"
#include "common/reference/python_call.hpp"
#include "common/reference/scheduler.hpp"

namespace vllmd::reference {

// kTcp: NCCL-shaped, the bytes over TCP (tcp_transfer.hpp).
enum class Backend { kNccl, kIpc, kTcp, kNone };
std::string_view backend_name(Backend backend);  // "nccl", "ipc", "tcp", "none"
bool parse_backend(std::string_view text, Backend& backend);

// The sizes of vLLM's ParallelConfig that shape one engine (vllm/config/parallel.py).
struct ParallelSizes {
  int data_parallel_rank = 0;
  int data_parallel_size = 1;
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  int prefill_context_parallel_size = 1;

  // Workers per engine: ParallelConfig.world_size = PP x TP x PCP.
  int world_size() const;
  // Whether vLLM runs the workers under MultiprocExecutor: it picks "mp" whenever
  // world_size_across_dp (world_size x DP, before dense DP is collapsed) exceeds 1, and
  // UniProcExecutor only for a lone worker.
  bool multiproc_executor() const;
};

class TcpReceiver;
struct WorkerContext;  // worker.hpp

// One worker's weight-transfer state.
struct WorkerState {
  bool initialized = false;    // init_weight_transfer_engine succeeded
  bool update_active = false;  // between start_weight_update and finish_weight_update
  bool draft = false;          // the active session is a draft-model session
  std::uint64_t updates_in_session = 0;
  std::uint64_t sessions_finished = 0;
  std::uint64_t tensors_received = 0;  // names seen by update_weights, over all sessions
  // The tcp backend: the connection to the trainer, and the tensors received, by name.
  std::shared_ptr<TcpReceiver> receiver;
  std::map<std::string, std::string> weights;
  // With a model: the tensors of this session (bytes in `weights`), loaded into the model by
  // finish_weight_update, dropped when the session fails.
  struct Staged {
    std::string name;
    std::string dtype;
    std::vector<std::int64_t> shape;
  };
  std::vector<Staged> staged;
};

class ReferenceCore {
 public:
  // `insecure_serialization` stands for VLLM_ALLOW_INSECURE_SERIALIZATION=1, which IPC over
  // HTTP (pickled handles) needs.
  ReferenceCore(const ParallelSizes& sizes, Backend backend, bool insecure_serialization = true,
                SchedulerOptions scheduler = {});
  ReferenceCore(int dp_rank, int tensor_parallel_size, Backend backend)
      : ReferenceCore(ParallelSizes{dp_rank, 1, tensor_parallel_size}, backend) {}

  // Runs one engine-core method. The value is msgpack (nil for a Python None; a list with
  // one entry per worker for collective_rpc). The error is the exception text only; the
  // caller wraps it as "Call to <method> method failed: <error>".
  tl::expected<std::string, std::string> call(std::string_view method,
                                              std::string_view args_msgpack);

  // A worker's exception text as collective_rpc raises it: MultiprocExecutor wraps it.
  std::string worker_error(std::string_view error) const;

  const ParallelSizes& sizes() const { return sizes_; }
  const std::vector<WorkerState>& workers() const { return workers_; }
  const std::string& weight_version() const { return weight_version_; }
  // Generate from `model` (llama.hpp) instead of the token formula; weight updates over the
  // tcp backend land in it when their session finishes.
  // `source`: where its weights came from, for reload_weights.
  void set_model(std::shared_ptr<LlamaModel> model, WeightSource source = {});
  const LlamaModel* model() const { return model_.get(); }
  bool paused() const { return scheduler_.paused(); }
  // The requests it generates for (ADD, ABORT and steps go straight to it); pause_scheduler,
  // sleep and wake_up pause and resume it, and weight updates give it their fingerprint.
  Scheduler& scheduler() { return scheduler_; }
  const Scheduler& scheduler() const { return scheduler_; }
  // Fake requests holding KV blocks without a client (--running-requests): a pause that
  // aborts or drains, or a sleep, ends them.
  void set_running_requests(int count) { scheduler_.set_phantom_requests(count); }
  // Requests holding KV blocks: the running ones and the fake ones.
  int running_requests() const { return static_cast<int>(scheduler_.active()); }
  // True once after a pause (or sleep) in mode "wait" found requests running: its reply is
  // due when they drained (vLLM defers it the same way).
  bool take_reply_when_idle() { return std::exchange(reply_when_idle_, false); }
  // The executor's sleeping tags (vLLM's CuMem tags "weights" and "kv_cache").
  bool weights_asleep() const { return weights_asleep_; }
  bool kv_cache_asleep() const { return kv_cache_asleep_; }

 private:
  using Result = tl::expected<std::string, std::string>;
  // One engine-core method: its qualified name (for CPython's TypeError texts) and arguments.
  using Method = Result (ReferenceCore::*)(const std::string& qualname, Positional args);
  static Method find_method(std::string_view name);
  WorkerContext worker_context(int rank) const;

  Result collective_rpc(const std::string& qualname, Positional args);
  Result set_weight_version(const std::string& qualname, Positional args);
  Result get_weight_version(const std::string& qualname, Positional args);
  Result pause_scheduler(const std::string& qualname, Positional args);
  Result resume_scheduler(const std::string& qualname, Positional args);
  Result is_scheduler_paused(const std::string& qualname, Positional args);
  Result reference_state(const std::string& qualname, Positional args);
  Result reset_prefix_cache(const std::string& qualname, Positional args);
  Result reset_mm_cache(const std::string& qualname, Positional args);
  Result reset_encoder_cache(const std::string& qualname, Positional args);
  // Sleep mode (sleep.cpp).
  Result sleep(const std::string& qualname, Positional args);
  Result wake_up(const std::string& qualname, Positional args);
  Result is_sleeping(const std::string& qualname, Positional args);
  Result release_kv_cache_memory(const std::string& qualname, Positional args);
  std::optional<std::string> asleep_refusal(std::string_view worker_method) const;
  void warn(std::string_view text) const;
  void end_requests(const msgpack::object* mode);  // as a pause in `mode` ends them
  void update_fingerprint();  // after a finished weight-update session or a new version
  void load_staged();         // a finished session's tensors into the model

  ParallelSizes sizes_;
  Backend backend_;
  bool insecure_serialization_;
  std::vector<WorkerState> workers_;
  std::string weight_version_ = "default";
  Scheduler scheduler_;
  std::shared_ptr<LlamaModel> model_;
  WeightSource model_source_;
  bool reply_when_idle_ = false;
  bool weights_asleep_ = false;
  bool kv_cache_asleep_ = false;
  int sleep_level_ = 0;  // of the last sleep that put the executor to sleep
};

}  // namespace vllmd::reference
