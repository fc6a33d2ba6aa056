#include "common/reference/core.hpp"

#include <algorithm>
#include <optional>
#include <random>
#include <utility>

#include "common/reference/tokens.hpp"
#include "common/reference/worker.hpp"
#include "common/util/fail.hpp"
#include "common/util/log.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::reference {

namespace {

using util::fail;

template <typename Write> std::string pack(Write&& write) {
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  write(packer);
  return buffer.take();
}

bool is_number(const msgpack::object& object) {
  switch (object.type) {
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER:
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return true;
    default: return false;
  }
}

void pack_bool_field(wire::Packer& packer, std::string_view key, bool value) {
  wire::pack_str(packer, key);
  packer.pack(value);
}

void pack_count_field(wire::Packer& packer, std::string_view key, std::uint64_t value) {
  wire::pack_str(packer, key);
  packer.pack_uint64(value);
}

std::string encode_state(const ReferenceCore& core) {
  return pack([&](wire::Packer& packer) {
    packer.pack_map(4);
    wire::pack_str(packer, "weight_version");
    wire::pack_str(packer, core.weight_version());
    pack_bool_field(packer, "paused", core.paused());
    wire::pack_str(packer, "sleeping_tags");
    packer.pack_array((core.weights_asleep() ? 1 : 0) + (core.kv_cache_asleep() ? 1 : 0));
    if (core.weights_asleep()) wire::pack_str(packer, "weights");
    if (core.kv_cache_asleep()) wire::pack_str(packer, "kv_cache");
    wire::pack_str(packer, "workers");
    packer.pack_array(static_cast<std::uint32_t>(core.workers().size()));
    for (const WorkerState& worker : core.workers()) {
      packer.pack_map(6);
      pack_bool_field(packer, "initialized", worker.initialized);
      pack_bool_field(packer, "update_active", worker.update_active);
      pack_bool_field(packer, "draft", worker.draft);
      pack_count_field(packer, "updates_in_session", worker.updates_in_session);
      pack_count_field(packer, "sessions_finished", worker.sessions_finished);
      pack_count_field(packer, "tensors_received", worker.tensors_received);
    }
  });
}

}  // namespace

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::kNccl: return "nccl";
    case Backend::kIpc: return "ipc";
    case Backend::kTcp: return "tcp";
    case Backend::kNone: return "none";
  }
  return "none";
}

bool parse_backend(std::string_view text, Backend& backend) {
  for (Backend candidate : {Backend::kNccl, Backend::kIpc, Backend::kTcp, Backend::kNone}) {
    if (text == backend_name(candidate)) {
      backend = candidate;
      return true;
    }
  }
  return false;
}

int ParallelSizes::world_size() const {
  return std::max(1, pipeline_parallel_size) * std::max(1, tensor_parallel_size) *
         std::max(1, prefill_context_parallel_size);
}

bool ParallelSizes::multiproc_executor() const {
  return world_size() * std::max(1, data_parallel_size) > 1;
}

ReferenceCore::ReferenceCore(const ParallelSizes& sizes, Backend backend,
                             bool insecure_serialization, SchedulerOptions scheduler)
    : sizes_(sizes), backend_(backend), insecure_serialization_(insecure_serialization),
      workers_(static_cast<std::size_t>(sizes.world_size())), scheduler_(scheduler) {
  update_fingerprint();
}

// Once per finished session or version, never per token: hashing the tensors is the cost.
void ReferenceCore::update_fingerprint() {
  const WorkerState& worker = workers_.front();
  scheduler_.set_fingerprint(
      weights_fingerprint(worker.weights, weight_version_, worker.sessions_finished));
}

void ReferenceCore::set_model(std::shared_ptr<LlamaModel> model, WeightSource source) {
  model_ = std::move(model);
  model_source_ = std::move(source);
  scheduler_.set_model(model_.get());
}

// Every worker received the same full tensors (the reference engine does not shard them),
// so the first worker's copy is the model's.
void ReferenceCore::load_staged() {
  WorkerState& first = workers_.front();
  if (model_) {
    for (const WorkerState::Staged& tensor : first.staged) {
      // Checked on arrival; a failure here would be a bug, so it is loud.
      if (auto loaded = model_->set_parameter(tensor.name, tensor.dtype, tensor.shape,
                                              first.weights.at(tensor.name));
          !loaded) {
        util::log::error("reference engine ", sizes_.data_parallel_rank, ": ", loaded.error());
      }
    }
  }
  for (WorkerState& worker : workers_) worker.staged.clear();
}

WorkerContext ReferenceCore::worker_context(int rank) const {
  const int world_size = static_cast<int>(workers_.size());
  const int tp = std::max(1, sizes_.tensor_parallel_size);
  const int pcp = std::max(1, sizes_.prefill_context_parallel_size);
  WorkerContext context{sizes_.data_parallel_rank * world_size + rank, backend_,
                        insecure_serialization_};
  // vLLM's rank layout within an engine: TP fastest, then PCP, then PP.
  context.dp_index = sizes_.data_parallel_rank;
  context.tp_rank = rank % tp;
  context.pcp_rank = (rank / tp) % pcp;
  context.pp_rank = rank / (tp * pcp);
  context.model = model_.get();
  return context;
}

std::string ReferenceCore::worker_error(std::string_view error) const {
  // vllm/v1/executor/multiproc_executor.py: the worker sends str(e), the executor raises this.
  if (!sizes_.multiproc_executor()) return std::string(error);
  std::string text = "Worker failed with error '";
  text.append(error).append("', please check the stack trace above for the root cause");
  return text;
}

ReferenceCore::Method ReferenceCore::find_method(std::string_view name) {
  static constexpr std::pair<std::string_view, Method> kMethods[] = {
      {"collective_rpc", &ReferenceCore::collective_rpc},
      {"set_weight_version", &ReferenceCore::set_weight_version},
      {"get_weight_version", &ReferenceCore::get_weight_version},
      {"pause_scheduler", &ReferenceCore::pause_scheduler},
      {"resume_scheduler", &ReferenceCore::resume_scheduler},
      {"is_scheduler_paused", &ReferenceCore::is_scheduler_paused},
      {"reference_state", &ReferenceCore::reference_state},
      {"reset_prefix_cache", &ReferenceCore::reset_prefix_cache},
      {"reset_mm_cache", &ReferenceCore::reset_mm_cache},
      {"reset_encoder_cache", &ReferenceCore::reset_encoder_cache},
      {"sleep", &ReferenceCore::sleep},
      {"wake_up", &ReferenceCore::wake_up},
      {"is_sleeping", &ReferenceCore::is_sleeping},
      {"release_kv_cache_memory", &ReferenceCore::release_kv_cache_memory},
  };
  for (const auto& [method_name, method] : kMethods) {
    if (method_name == name) return method;
  }
  return nullptr;
}

tl::expected<std::string, std::string> ReferenceCore::call(std::string_view method,
                                                           std::string_view args_msgpack) {
  auto handle = wire::decode(args_msgpack);
  if (!handle) return fail("cannot decode the call's arguments: " + handle.error());
  const msgpack::object& args = handle->get();
  if (args.type != msgpack::type::ARRAY) {
    return fail(type_error("utility call arguments", "a list", args));
  }
  const Method run = find_method(method);
  if (run == nullptr) {
    return fail("'EngineCore' object has no attribute '" + std::string(method) + "'");
  }
  return (this->*run)("EngineCore." + std::string(method), positional(args));
}

ReferenceCore::Result ReferenceCore::collective_rpc(const std::string& qualname, Positional args) {
  auto bound =
      bind_call(qualname, {{"method"}, {"timeout", false}, {"args", false}, {"kwargs", false}},
                args, nullptr);
  if (!bound) return fail(bound.error());
  const msgpack::object* name = (*bound)[0];
  const msgpack::object* timeout = (*bound)[1];
  const msgpack::object* worker_args = (*bound)[2];
  const msgpack::object* kwargs = (*bound)[3];
  if (name->type != msgpack::type::STR) {
    return fail(type_error("collective_rpc() argument 'method'", "a str", *name));
  }
  if (timeout != nullptr && !wire::is_nil(*timeout) && !is_number(*timeout)) {
    return fail(type_error("collective_rpc() argument 'timeout'", "a float or None", *timeout));
  }
  if (worker_args != nullptr && worker_args->type != msgpack::type::ARRAY) {
    return fail(type_error("collective_rpc() argument 'args'", "a list", *worker_args));
  }
  if (kwargs != nullptr && wire::is_nil(*kwargs)) kwargs = nullptr;
  if (kwargs != nullptr && kwargs->type != msgpack::type::MAP) {
    return fail(type_error("collective_rpc() argument 'kwargs'", "a dict or None", *kwargs));
  }
  const std::string_view worker_method(name->via.str.ptr, name->via.str.size);
  if (auto refusal = asleep_refusal(worker_method)) return fail(*refusal);
  const Positional passed = worker_args ? positional(*worker_args) : Positional{};
  // Every worker runs the method (as vLLM's executor broadcasts it); the executor reads the
  // answers in rank order, so the lowest failing rank's error wins.
  std::optional<std::string> first_error;
  const int world_size = static_cast<int>(workers_.size());
  std::vector<std::string> returned;
  returned.reserve(workers_.size());
  for (int rank = 0; rank < world_size; ++rank) {
    const WorkerContext context = worker_context(rank);
    auto value = run_worker_method(workers_[static_cast<std::size_t>(rank)], context, worker_method,
                                   passed, kwargs);
    if (!value && !first_error) first_error = value.error();
    if (value) returned.push_back(std::move(*value));
  }
  if (first_error) return fail(worker_error(*first_error));
  if (worker_method == "finish_weight_update") {
    load_staged();
    update_fingerprint();
  }
  if (worker_method == "reset_weights" && model_) model_->reset_weights(std::random_device{}());
  if (worker_method == "reload_weights" && model_) {
    if (auto reloaded = reload_weights(*model_, model_source_); !reloaded) {
      return fail(worker_error(reloaded.error()));
    }
  }
  std::string list = pack(
      [&](wire::Packer& packer) { packer.pack_array(static_cast<std::uint32_t>(world_size)); });
  for (const std::string& value : returned) list += value;
  return list;
}

ReferenceCore::Result ReferenceCore::set_weight_version(const std::string& qualname,
                                                        Positional args) {
  auto bound = bind_call(qualname, {{"version"}}, args, nullptr);
  if (!bound) return fail(bound.error());
  const auto version = wire::as_str(*bound->front());
  if (!version) return fail(type_error("weight version", "a str", *bound->front()));
  weight_version_ = std::string(*version);
  update_fingerprint();
  return none_value();
}

ReferenceCore::Result ReferenceCore::get_weight_version(const std::string& qualname,
                                                        Positional args) {
  if (auto bound = bind_call(qualname, {}, args, nullptr); !bound) return fail(bound.error());
  return pack([&](wire::Packer& packer) { wire::pack_str(packer, weight_version_); });
}

ReferenceCore::Result ReferenceCore::pause_scheduler(const std::string& qualname, Positional args) {
  auto bound = bind_call(qualname, {{"mode", false}, {"clear_cache", false}}, args, nullptr);
  if (!bound) return fail(bound.error());
  const msgpack::object* mode = (*bound)[0];
  const msgpack::object* clear_cache = (*bound)[1];
  if (auto error = pause_mode_error(mode)) return fail(*error);
  if (clear_cache != nullptr && clear_cache->type != msgpack::type::BOOLEAN) {
    return fail(type_error("clear_cache", "a bool", *clear_cache));
  }
  end_requests(mode);
  return none_value();
}

ReferenceCore::Result ReferenceCore::resume_scheduler(const std::string& qualname,
                                                      Positional args) {
  if (auto bound = bind_call(qualname, {}, args, nullptr); !bound) return fail(bound.error());
  scheduler_.resume();
  return none_value();
}

ReferenceCore::Result ReferenceCore::is_scheduler_paused(const std::string& qualname,
                                                         Positional args) {
  if (auto bound = bind_call(qualname, {}, args, nullptr); !bound) return fail(bound.error());
  return bool_value(scheduler_.paused());
}

ReferenceCore::Result ReferenceCore::reference_state(const std::string& qualname, Positional args) {
  if (auto bound = bind_call(qualname, {}, args, nullptr); !bound) return fail(bound.error());
  return encode_state(*this);
}

// EngineCore.reset_prefix_cache(reset_running_requests=False, reset_connector=False): False
// while running requests hold blocks, unless they are preempted (reset_running_requests).
ReferenceCore::Result ReferenceCore::reset_prefix_cache(const std::string& qualname,
                                                        Positional args) {
  auto bound = bind_call(qualname, {{"reset_running_requests", false}, {"reset_connector", false}},
                         args, nullptr);
  if (!bound) return fail(bound.error());
  for (const msgpack::object* flag : *bound) {
    if (flag != nullptr && flag->type != msgpack::type::BOOLEAN) {
      return fail(type_error("reset_prefix_cache() argument", "a bool", *flag));
    }
  }
  const bool preempt = (*bound)[0] != nullptr && (*bound)[0]->via.boolean;
  if (running_requests() > 0 && !preempt) {
    warn("Failed to reset prefix cache because some blocks (" + std::to_string(running_requests()) +
         ") are not freed yet");
    return bool_value(false);
  }
  return bool_value(true);
}

ReferenceCore::Result ReferenceCore::reset_mm_cache(const std::string& qualname, Positional args) {
  if (auto bound = bind_call(qualname, {}, args, nullptr); !bound) return fail(bound.error());
  if (running_requests() > 0) {
    warn(
        "Resetting the multi-modal cache when requests are in progress may lead to desynced "
        "internal caches.");
  }
  return none_value();
}

ReferenceCore::Result ReferenceCore::reset_encoder_cache(const std::string& qualname,
                                                         Positional args) {
  if (auto bound = bind_call(qualname, {}, args, nullptr); !bound) return fail(bound.error());
  if (running_requests() > 0) {
    warn(
        "Resetting the encoder cache when requests are in progress may lead to desynced "
        "internal caches.");
  }
  return none_value();
}

}  // namespace vllmd::reference
