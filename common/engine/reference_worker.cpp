#include "common/engine/reference_worker.hpp"

#include <vector>

#include "common/wire/msgpack_codec.hpp"

namespace vllmd::engine::detail {

namespace {

using Status = tl::expected<void, std::string>;

constexpr std::string_view kNotConfigured =
    "Weight transfer not configured. Please set weight_transfer_config to enable weight "
    "transfer.";
constexpr std::string_view kUpdateWithoutStart =
    "start_weight_update must be called before update_weights.";
constexpr std::string_view kFinishWithoutStart =
    "finish_weight_update called without a matching start_weight_update.";
constexpr std::string_view kNotInitialized =
    "Weight transfer engine not initialized. Call init_weight_transfer_engine first.";

tl::unexpected<std::string> fail(std::string_view message) {
  return tl::unexpected(std::string(message));
}

Status init_transfer_engine(WorkerState& worker, Backend backend, const msgpack::object& info) {
  if (info.type != msgpack::type::MAP) return fail(type_error("init_info", "a dict", info));
  // The worker builds the backend's init-info dataclass from the dict: same TypeErrors.
  auto bound = backend == Backend::kNccl
                   ? bind_call("NCCLWeightTransferInitInfo.__init__",
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

// Checks that every key holds a list and that all lists are equally long; returns the length.
tl::expected<std::uint32_t, std::string> equal_lists(const msgpack::object& info,
                                                     const std::vector<std::string_view>& keys) {
  std::vector<std::uint32_t> lengths;
  for (std::string_view key : keys) {
    const msgpack::object* list = wire::find_key(info, key);
    if (list->type != msgpack::type::ARRAY) {
      return fail(type_error(key, "a list", *list));
    }
    lengths.push_back(list->via.array.size);
  }
  bool equal = true;
  for (std::uint32_t length : lengths) equal = equal && length == lengths.front();
  if (equal) return lengths.front();
  std::string names;
  std::string counts;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const char* separator = i == 0 ? "" : (i + 1 == keys.size() ? " and " : ", ");
    names += separator + std::string(keys[i]);
    counts += separator + std::to_string(lengths[i]);
  }
  return fail(names + " must have the same length, got " + counts);
}

Status check_elements(const msgpack::object& list, std::string_view key,
                      msgpack::type::object_type type, std::string_view type_name) {
  for (std::uint32_t i = 0; i < list.via.array.size; ++i) {
    const msgpack::object& item = list.via.array.ptr[i];
    if (item.type != type) {
      return fail(type_error(std::string(key) + "[" + std::to_string(i) + "]", type_name, item));
    }
  }
  return {};
}

// Parses one worker's update_info as the backend's update-info dataclass would; returns the
// number of tensors it announces. Unknown keys are tolerated: newer trainers add options.
tl::expected<std::uint32_t, std::string> parse_update_info(Backend backend,
                                                           const msgpack::object& info) {
  if (info.type != msgpack::type::MAP) return fail(type_error("update_info", "a dict", info));
  const bool ipc = backend == Backend::kIpc;
  std::vector<std::string_view> required = {"names", "dtype_names", "shapes"};
  if (ipc) required.insert(required.end(), {"ipc_handles_pickled", "tensor_sizes"});
  std::vector<std::string_view> missing;
  for (std::string_view key : required) {
    if (wire::find_key(info, key) == nullptr) missing.push_back(key);
  }
  if (!missing.empty()) {
    return fail(missing_arguments(
        ipc ? "IPCWeightTransferUpdateInfo.__init__" : "NCCLWeightTransferUpdateInfo.__init__",
        missing));
  }
  std::vector<std::string_view> lists = {"names", "dtype_names", "shapes"};
  if (ipc) {
    // Unpacked transfers send tensor_sizes as None: only a list must match the others.
    if (wire::find_key(info, "tensor_sizes")->type != msgpack::type::NIL) {
      lists.push_back("tensor_sizes");
    }
    const msgpack::object& handles = *wire::find_key(info, "ipc_handles_pickled");
    if (handles.type != msgpack::type::STR) {
      return fail(type_error("ipc_handles_pickled", "a str", handles));
    }
  }
  auto count = equal_lists(info, lists);
  if (!count) return count;
  Status status =
      check_elements(*wire::find_key(info, "names"), "names", msgpack::type::STR, "a str");
  if (status) {
    status = check_elements(*wire::find_key(info, "dtype_names"), "dtype_names", msgpack::type::STR,
                            "a str");
  }
  if (status) {
    status =
        check_elements(*wire::find_key(info, "shapes"), "shapes", msgpack::type::ARRAY, "a list");
  }
  if (!status) return fail(status.error());
  return count;
}

tl::expected<std::uint32_t, std::string> receive_weights(const WorkerState& worker,
                                                         int global_index, Backend backend,
                                                         const msgpack::object& update_info) {
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
  auto count = parse_update_info(backend, *info);
  if (!count) return count;
  if (backend == Backend::kNccl && !worker.initialized) return fail(kNotInitialized);
  return count;
}

Status update_weights(WorkerState& worker, int global_index, Backend backend,
                      const msgpack::object& update_info) {
  if (!worker.update_active) return fail(kUpdateWithoutStart);
  auto count = receive_weights(worker, global_index, backend, update_info);
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

tl::expected<void, std::string> run_worker_method(WorkerState& worker, int global_index,
                                                  Backend backend, std::string_view method,
                                                  Positional args, const msgpack::object* kwargs) {
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
    return update_weights(worker, global_index, backend, *bound->front());
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

}  // namespace vllmd::engine::detail
