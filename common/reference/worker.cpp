#include "common/reference/worker.hpp"

#include <random>
#include <vector>

#include "common/reference/llama.hpp"
#include "common/reference/tcp_transfer.hpp"
#include "common/reference/update_info.hpp"
#include "common/util/fail.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::reference {

namespace {

using Status = tl::expected<void, std::string>;
using util::fail;

constexpr std::string_view kNotConfigured =
    "Weight transfer not configured. Please set weight_transfer_config to enable weight "
    "transfer.";
constexpr std::string_view kUpdateWithoutStart =
    "start_weight_update must be called before update_weights.";
constexpr std::string_view kFinishWithoutStart =
    "finish_weight_update called without a matching start_weight_update.";
constexpr std::string_view kNotInitialized =
    "Weight transfer engine not initialized. Call init_weight_transfer_engine first.";

// How long the tcp backend waits for the trainer: to accept at init, for each read at update
// (NCCL's own default timeout is 10 minutes).
constexpr std::chrono::minutes kTrainerWait(10);

// The tcp backend's init: NCCL's fields, then the connection to the trainer.
Status connect_to_trainer(WorkerState& worker, const WorkerContext& context,
                          const std::vector<const msgpack::object*>& fields) {
  const auto address = wire::as_str(*fields[0]);
  if (!address) return fail(type_error("master_address", "a str", *fields[0]));
  for (std::size_t i = 1; i <= 3; ++i) {
    if (fields[i]->type != msgpack::type::POSITIVE_INTEGER) {
      static constexpr std::string_view kNames[] = {"", "master_port", "rank_offset", "world_size"};
      return fail(type_error(kNames[i], "an int", *fields[i]));
    }
  }
  const auto port = static_cast<int>(fields[1]->via.u64);
  const auto rank = static_cast<int>(fields[2]->via.u64) + context.global_index;
  const auto world_size = static_cast<int>(fields[3]->via.u64);
  if (rank >= world_size) {
    return fail("worker rank " + std::to_string(rank) +
                " (rank_offset + worker index) is outside "
                "world_size " +
                std::to_string(world_size));
  }
  auto receiver = TcpReceiver::connect(std::string(*address), port, rank, world_size, kTrainerWait);
  if (!receiver) return fail(receiver.error());
  worker.receiver = std::move(*receiver);
  return {};
}

// The tcp backend's update: each tensor's bytes from the trainer, kept by name. With a model,
// a tensor that does not fit it (name, shape, dtype) fails the update and nothing of it is
// kept, but only after every byte was read, so the connection stays in step with the trainer.
Status receive_tensors(WorkerState& worker, const WorkerContext& context,
                       const msgpack::object& info) {
  if (!worker.receiver) return fail(kNotInitialized);
  const msgpack::object& names = *wire::find_key(info, "names");
  const msgpack::object& dtypes = *wire::find_key(info, "dtype_names");
  const msgpack::object& shapes = *wire::find_key(info, "shapes");
  std::vector<std::pair<WorkerState::Staged, std::string>> received;
  std::optional<std::string> misfit;
  for (std::uint32_t i = 0; i < names.via.array.size; ++i) {
    WorkerState::Staged tensor;
    tensor.name = std::string(*wire::as_str(names.via.array.ptr[i]));
    tensor.dtype = std::string(*wire::as_str(dtypes.via.array.ptr[i]));
    std::size_t size = dtype_size(tensor.dtype);
    if (size == 0) {
      return fail("tensor " + tensor.name + ": unsupported dtype '" + tensor.dtype + "'");
    }
    const msgpack::object& shape = shapes.via.array.ptr[i];
    for (std::uint32_t d = 0; d < shape.via.array.size; ++d) {
      if (shape.via.array.ptr[d].type != msgpack::type::POSITIVE_INTEGER) {
        return fail(type_error("shapes[" + std::to_string(i) + "][" + std::to_string(d) + "]",
                               "a non-negative int", shape.via.array.ptr[d]));
      }
      tensor.shape.push_back(static_cast<std::int64_t>(shape.via.array.ptr[d].via.u64));
      size *= static_cast<std::size_t>(shape.via.array.ptr[d].via.u64);
    }
    auto bytes = worker.receiver->receive(size, kTrainerWait);
    if (!bytes) return fail("tensor " + tensor.name + ": " + bytes.error());
    if (context.model != nullptr && !worker.draft && !misfit) {
      if (auto fits = context.model->check(tensor.name, tensor.dtype, tensor.shape); !fits) {
        misfit = fits.error();
      }
    }
    received.emplace_back(std::move(tensor), std::move(*bytes));
  }
  if (misfit) return fail(*misfit);
  for (auto& [tensor, bytes] : received) {
    worker.weights[tensor.name] = std::move(bytes);
    if (context.model != nullptr && !worker.draft) worker.staged.push_back(std::move(tensor));
  }
  return {};
}

Status init_transfer_engine(WorkerState& worker, const WorkerContext& context,
                            const msgpack::object& info) {
  const Backend backend = context.backend;
  if (info.type != msgpack::type::MAP) return fail(type_error("init_info", "a dict", info));
  // The worker builds the backend's init-info dataclass from the dict: same TypeErrors.
  auto bound = backend != Backend::kIpc ? bind_call("NCCLWeightTransferInitInfo.__init__",
                                                    {{"master_address"},
                                                     {"master_port"},
                                                     {"rank_offset"},
                                                     {"world_size"},
                                                     {"packed", false},
                                                     {"packed_buffer_size_bytes", false},
                                                     {"packed_num_buffers", false},
                                                     {"nccl_unique_id_b64", false}},
                                                    {}, &info)
                                        : bind_call("IPCWeightTransferInitInfo.__init__",
                                                    {{"packed", false},
                                                     {"packed_buffer_size_bytes", false},
                                                     {"packed_num_buffers", false}},
                                                    {}, &info);
  if (!bound) return fail(bound.error());
  if (backend == Backend::kTcp) {
    if (auto connected = connect_to_trainer(worker, context, *bound); !connected) return connected;
  }
  worker.initialized = true;
  return {};
}

tl::expected<std::uint32_t, std::string> receive_weights(WorkerState& worker,
                                                         const WorkerContext& context,
                                                         const msgpack::object& update_info) {
  const int global_index = context.global_index;
  const msgpack::object* info = &update_info;
  if (update_info.type == msgpack::type::ARRAY) {
    // One entry per worker over all engines.
    if (static_cast<std::uint32_t>(global_index) >= update_info.via.array.size) {
      return fail("update_info is a list of " + std::to_string(update_info.via.array.size) +
                  " entries, but worker " + std::to_string(global_index) +
                  " (dp_rank * world_size + rank) needs entry " + std::to_string(global_index));
    }
    info = &update_info.via.array.ptr[global_index];
  }
  auto count = read_update_info(context, *info);
  if (!count) return count;
  const bool nccl_shaped = context.backend == Backend::kNccl || context.backend == Backend::kTcp;
  if (nccl_shaped && !worker.initialized) return fail(kNotInitialized);
  if (context.backend == Backend::kTcp) {
    if (auto received = receive_tensors(worker, context, *info); !received) {
      return fail(received.error());
    }
  }
  return count;
}

Status update_weights(WorkerState& worker, const WorkerContext& context,
                      const msgpack::object& update_info) {
  if (!worker.update_active) return fail(kUpdateWithoutStart);
  auto count = receive_weights(worker, context, update_info);
  if (!count) {
    // vLLM abandons the session on any failure: the model may hold half-loaded weights.
    worker.update_active = false;
    worker.draft = false;
    worker.staged.clear();
    return fail(count.error());
  }
  ++worker.updates_in_session;
  worker.tensors_received += *count;
  return {};
}

}  // namespace

namespace {

// vLLM's test worker extension: the arguments back, and how many there were.
std::string echo_args_kwargs(Positional args, const msgpack::object* kwargs) {
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  packer.pack_map(3);
  wire::pack_str(packer, "args");
  packer.pack_array(args.size);
  const auto copy = [&](const msgpack::object& object) {
    const std::string bytes = wire::encode_object(object);  // floats stay floats
    buffer.write(bytes.data(), bytes.size());
  };
  for (std::uint32_t i = 0; i < args.size; ++i) copy(args.items[i]);
  wire::pack_str(packer, "kwargs");
  const std::uint32_t keywords = kwargs != nullptr ? kwargs->via.map.size : 0;
  packer.pack_map(keywords);
  for (std::uint32_t i = 0; i < keywords; ++i) {
    copy(kwargs->via.map.ptr[i].key);
    copy(kwargs->via.map.ptr[i].val);
  }
  wire::pack_str(packer, "total_items");
  packer.pack_uint64(std::uint64_t{args.size} + keywords);
  return buffer.take();
}

tl::expected<void, std::string> run_transfer_method(WorkerState& worker,
                                                    const WorkerContext& context,
                                                    std::string_view method, Positional args,
                                                    const msgpack::object* kwargs);

// vLLM's weight checker: {"dp{}:pp{}:pcp{}:tp{}:ep{}:<name>": sha256 hex} over the tensors
// the worker holds (ep is 0: the reference engine serves a dense model). With a model, its
// parameters in the dtype they were loaded from (every worker holds them in full); without,
// the bytes the tcp backend received.
std::string weight_checksums(const WorkerState& worker, const WorkerContext& context) {
  const std::string prefix =
      "dp" + std::to_string(context.dp_index) + ":pp" + std::to_string(context.pp_rank) + ":pcp" +
      std::to_string(context.pcp_rank) + ":tp" + std::to_string(context.tp_rank) + ":ep0:";
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  const auto entry = [&](const std::string& name, std::string_view bytes) {
    wire::pack_str(packer, prefix + name);
    wire::pack_str(packer, sha256_hex(bytes));
  };
  if (const LlamaModel* model = context.model; model != nullptr) {
    packer.pack_map(static_cast<std::uint32_t>(model->parameters().size()));
    for (const ParameterSpec& spec : model->parameters()) {
      entry(spec.name, model->parameter_bytes(spec.name));
    }
  } else {
    packer.pack_map(static_cast<std::uint32_t>(worker.weights.size()));
    for (const auto& [name, bytes] : worker.weights) entry(name, bytes);
  }
  return buffer.take();
}

// vLLM's reset_weights: every tensor overwritten (random values), so a checksum taken before
// no longer matches until the weights are sent or loaded again.
void reset_weights(WorkerState& worker) {
  std::random_device seed;
  std::mt19937_64 random(seed());
  for (auto& entry : worker.weights) {
    for (char& byte : entry.second) byte = static_cast<char>(random() & 0xff);
  }
}

}  // namespace

tl::expected<std::string, std::string> run_worker_method(WorkerState& worker,
                                                         const WorkerContext& context,
                                                         std::string_view method, Positional args,
                                                         const msgpack::object* kwargs) {
  if (method == "echo_args_kwargs") return echo_args_kwargs(args, kwargs);
  if (method == "compute_weight_checksums" || method == "reset_weights") {
    auto bound = bind_call("Worker." + std::string(method), {}, args, kwargs);
    if (!bound) return tl::unexpected(bound.error());
    if (method == "reset_weights") {
      reset_weights(worker);
      return none_value();
    }
    return weight_checksums(worker, context);
  }
  if (method == "reload_weights") {  // the model's own: ReferenceCore reads them once
    auto bound = bind_call("Worker.reload_weights", {}, args, kwargs);
    if (!bound) return tl::unexpected(bound.error());
    if (context.model == nullptr) {
      return tl::unexpected(std::string(
          "reload_weights: this reference engine runs no model to reload (start it with "
          "--model)"));
    }
    return none_value();
  }
  auto done = run_transfer_method(worker, context, method, args, kwargs);
  if (!done) return tl::unexpected(done.error());
  return none_value();
}

namespace {

tl::expected<void, std::string> run_transfer_method(WorkerState& worker,
                                                    const WorkerContext& context,
                                                    std::string_view method, Positional args,
                                                    const msgpack::object* kwargs) {
  const Backend backend = context.backend;
  const std::string qualname = "Worker." + std::string(method);
  const bool start = method == "start_weight_update" || method == "start_draft_weight_update";
  const bool finish = method == "finish_weight_update";
  const bool takes_info = method == "init_weight_transfer_engine" || method == "update_weights";
  if (!start && !finish && !takes_info) {
    return fail("'Worker' object has no attribute '" + std::string(method) + "'");
  }
  // Python binds the arguments before the method body runs.
  auto bound =
      takes_info ? bind_call(qualname, {{method == "update_weights" ? "update_info" : "init_info"}},
                             args, kwargs)
                 : bind_call(qualname, {}, args, kwargs);
  if (!bound) return fail(bound.error());
  if (backend == Backend::kNone) return fail(kNotConfigured);

  if (method == "init_weight_transfer_engine") {
    return init_transfer_engine(worker, context, *bound->front());
  }
  if (method == "update_weights") {
    return update_weights(worker, context, *bound->front());
  }
  if (start) {
    if (worker.update_active) {
      return fail(std::string(method) +
                  " called while a weight update is already active. Call finish_weight_update "
                  "first.");
    }
    worker.update_active = true;
    worker.draft = method == "start_draft_weight_update";
    worker.updates_in_session = 0;
    worker.staged.clear();
    return {};
  }
  if (!worker.update_active) return fail(kFinishWithoutStart);
  worker.update_active = false;
  worker.draft = false;
  ++worker.sessions_finished;
  return {};
}

}  // namespace

}  // namespace vllmd::reference
