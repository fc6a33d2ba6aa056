#include "common/reference/update_info.hpp"

#include <string_view>
#include <vector>

#include "common/reference/python_call.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::reference {

namespace {

using Count = tl::expected<std::uint32_t, std::string>;

tl::unexpected<std::string> fail(std::string message) { return tl::unexpected(std::move(message)); }

// ------------------------------------------------------------------------------------- NCCL

// Checks that every key holds a list and that all lists are equally long; returns the length.
Count equal_lists(const msgpack::object& info, const std::vector<std::string_view>& keys) {
  std::vector<std::uint32_t> lengths;
  for (std::string_view key : keys) {
    const msgpack::object* list = wire::find_key(info, key);
    if (list->type != msgpack::type::ARRAY) return fail(type_error(key, "a list", *list));
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

tl::expected<void, std::string> check_elements(const msgpack::object& list, std::string_view key,
                                               msgpack::type::object_type type,
                                               std::string_view type_name) {
  for (std::uint32_t i = 0; i < list.via.array.size; ++i) {
    const msgpack::object& item = list.via.array.ptr[i];
    if (item.type != type) {
      return fail(type_error(std::string(key) + "[" + std::to_string(i) + "]", type_name, item));
    }
  }
  return {};
}

// Unknown keys are tolerated: trainers add options such as packed.
Count read_nccl_update_info(const msgpack::object& info) {
  if (info.type != msgpack::type::MAP) return fail(type_error("update_info", "a dict", info));
  const std::vector<std::string_view> lists = {"names", "dtype_names", "shapes"};
  std::vector<std::string_view> missing;
  for (std::string_view key : lists) {
    if (wire::find_key(info, key) == nullptr) missing.push_back(key);
  }
  if (!missing.empty()) {
    return fail(missing_arguments("NCCLWeightTransferUpdateInfo.__init__", missing));
  }
  auto count = equal_lists(info, lists);
  if (!count) return count;
  auto status =
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

// -------------------------------------------------------------------------------------- IPC

// base.py's parse_update_info turns a TypeError raised while building the dataclass (binding,
// or inside __post_init__) into this ValueError; __post_init__'s own ValueErrors pass as they are.
tl::unexpected<std::string> invalid_ipc_update_info(std::string_view type_error_text) {
  std::string text = "Invalid update_info for IPCWeightTransferEngine: ";
  text.append(type_error_text);
  return tl::unexpected(std::move(text));
}

bool given(const msgpack::object* value) { return value != nullptr && !wire::is_nil(*value); }

// What base64.b64decode(value) raises before it decodes anything; the content itself (and the
// pickle inside) cannot be checked without Python, so it is taken as valid.
tl::expected<void, std::string> check_base64_argument(const msgpack::object& value) {
  if (value.type == msgpack::type::BIN) return {};
  if (value.type != msgpack::type::STR) {
    return invalid_ipc_update_info("argument should be a bytes-like object or ASCII string, not '" +
                                   std::string(python_type(value)) + "'");
  }
  for (std::uint32_t i = 0; i < value.via.str.size; ++i) {
    if (static_cast<unsigned char>(value.via.str.ptr[i]) >= 0x80) {
      return fail("string argument should contain only ASCII characters");
    }
  }
  return {};
}

// len(value) == len(names), as __post_init__ compares them.
tl::expected<void, std::string> check_same_size(std::string_view key, const msgpack::object& value,
                                                std::size_t names) {
  const auto length = python_len(value);
  if (!length) return invalid_ipc_update_info(no_len_error(value));
  if (*length == names) return {};
  return fail("`" + std::string(key) + "` should be of the same size as `names`: got " +
              std::to_string(*length) + " and " + std::to_string(names));
}

// IPCWeightTransferUpdateInfo(**info): names, dtype_names, shapes, then ipc_handles,
// ipc_handles_pickled and tensor_sizes, all three optional. The handles arrive as one or the
// other; tensor_sizes is only read for packed transfers, which this engine does not configure.
Count read_ipc_update_info(bool insecure_serialization, const msgpack::object& info) {
  if (info.type != msgpack::type::MAP) {
    return invalid_ipc_update_info(
        "vllm.distributed.weight_transfer.ipc_engine.IPCWeightTransferUpdateInfo() argument "
        "after ** must be a mapping, not " +
        std::string(python_type(info)));
  }
  auto bound = bind_call("IPCWeightTransferUpdateInfo.__init__",
                         {{"names"},
                          {"dtype_names"},
                          {"shapes"},
                          {"ipc_handles", false},
                          {"ipc_handles_pickled", false},
                          {"tensor_sizes", false}},
                         {}, &info);
  if (!bound) return invalid_ipc_update_info(bound.error());
  const msgpack::object& names = *(*bound)[0];
  const msgpack::object* handles = (*bound)[3];
  const msgpack::object* pickled = (*bound)[4];

  if (given(pickled)) {
    if (given(handles)) return fail("Cannot specify both `ipc_handles` and `ipc_handles_pickled`");
    if (!insecure_serialization) {
      return fail(
          "Refusing to deserialize `ipc_handles_pickled` without "
          "VLLM_ALLOW_INSECURE_SERIALIZATION=1");
    }
    if (auto checked = check_base64_argument(*pickled); !checked) return fail(checked.error());
  } else if (!given(handles)) {
    return fail("Either `ipc_handles` or `ipc_handles_pickled` must be provided");
  }
  const auto count = python_len(names);
  if (!count) return invalid_ipc_update_info(no_len_error(names));
  auto same = check_same_size("dtype_names", *(*bound)[1], *count);
  if (same) same = check_same_size("shapes", *(*bound)[2], *count);
  if (same && given(handles) && handles->type == msgpack::type::ARRAY) {
    same = check_same_size("ipc_handles", *handles, *count);
  }
  if (!same) return fail(same.error());
  // receive_weights, unpacked: `assert isinstance(update_info.ipc_handles, list)`, an
  // AssertionError whose text is empty. Unpickled handles are taken to be that list.
  if (given(handles) && handles->type != msgpack::type::ARRAY) return fail("");
  return static_cast<std::uint32_t>(*count);
}

}  // namespace

Count read_update_info(const WorkerContext& context, const msgpack::object& info) {
  if (context.backend == Backend::kIpc) {
    return read_ipc_update_info(context.insecure_serialization, info);
  }
  return read_nccl_update_info(info);
}

}  // namespace vllmd::reference
