#include "common/reference/worker.hpp"

#include <vector>

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

Status init_transfer_engine(WorkerState& worker, Backend backend, const msgpack::object& info) {
  if (info.type != msgpack::type::MAP) return fail(type_error("init_info", "a dict", info));
  // The worker builds the backend's init-info dataclass from the dict: same TypeErrors.
  auto bound = backend == Backend::kNccl ? bind_call("NCCLWeightTransferInitInfo.__init__",
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
  worker.initialized = true;
  return {};
}

tl::expected<std::uint32_t, std::string> receive_weights(const WorkerState& worker,
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
  if (context.backend == Backend::kNccl && !worker.initialized) return fail(kNotInitialized);
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

}  // namespace

tl::expected<std::string, std::string> run_worker_method(WorkerState& worker,
                                                         const WorkerContext& context,
                                                         std::string_view method, Positional args,
                                                         const msgpack::object* kwargs) {
  if (method == "echo_args_kwargs") return echo_args_kwargs(args, kwargs);
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
    return init_transfer_engine(worker, backend, *bound->front());
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
