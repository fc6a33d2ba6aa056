#include "common/wire/messages.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "common/util/errno_text.hpp"
#include "common/util/fail.hpp"

namespace vllmd::wire {

namespace {

using util::fail;

tl::expected<CallId, std::string> decode_call_id(const msgpack::object& object) {
  if (object.type == msgpack::type::POSITIVE_INTEGER) return CallId{object.via.u64, false};
  if (object.type == msgpack::type::NEGATIVE_INTEGER) {
    return CallId{static_cast<std::uint64_t>(object.via.i64), true};
  }
  return fail("call_id is not an integer");
}

// Always 0xcb + 8 bytes: msgpack-c >= 4.1's pack_double writes integral doubles as integers.
void write_float64(StringBuffer& buffer, double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  char bytes[9];
  bytes[0] = static_cast<char>(0xcb);
  for (int i = 8; i >= 1; --i, bits >>= 8) bytes[i] = static_cast<char>(bits & 0xff);
  buffer.write(bytes, sizeof bytes);
}

void pack_call_id(Packer& packer, CallId id) {
  if (id.negative) {
    packer.pack_int64(static_cast<std::int64_t>(id.bits));
  } else {
    packer.pack_uint64(id.bits);
  }
}

void pack_optional_int(Packer& packer, std::string_view key, const std::optional<std::int64_t>& v,
                       std::uint32_t& count, bool write) {
  if (!v) return;
  if (write) {
    pack_str(packer, key);
    packer.pack_int64(*v);
  }
  ++count;
}

std::optional<std::int64_t> int_field(const msgpack::object& map, std::string_view key) {
  const msgpack::object* value = find_key(map, key);
  return value ? as_int64(*value) : std::nullopt;
}

std::optional<std::string> str_field(const msgpack::object& map, std::string_view key) {
  const msgpack::object* value = find_key(map, key);
  if (!value) return std::nullopt;
  auto text = as_str(*value);
  return text ? std::optional<std::string>(std::string(*text)) : std::nullopt;
}

// "'key' tail", built by appends: GCC 12 warns falsely (-Wrestrict) on chained operator+.
std::string quoted(std::string_view key, std::string_view tail) {
  std::string text = "'";
  text.append(key).append("'").append(tail);
  return text;
}

tl::expected<std::vector<std::string>, std::string> string_list(const msgpack::object& map,
                                                                std::string_view key) {
  const msgpack::object* list = find_key(map, key);
  if (!list || list->type != msgpack::type::ARRAY) {
    return fail(quoted(key, " is not a list"));
  }
  std::vector<std::string> items;
  for (std::uint32_t i = 0; i < list->via.array.size; ++i) {
    auto text = as_str(list->via.array.ptr[i]);
    if (!text) return fail(quoted(key, " holds a non-string"));
    items.emplace_back(*text);
  }
  return items;
}

std::optional<std::vector<std::int64_t>> int_list(const msgpack::object& list) {
  if (list.type != msgpack::type::ARRAY) return std::nullopt;
  std::vector<std::int64_t> items;
  for (std::uint32_t i = 0; i < list.via.array.size; ++i) {
    auto item = as_int64(list.via.array.ptr[i]);
    if (!item) return std::nullopt;
    items.push_back(*item);
  }
  return items;
}

// INIT's parallel_config, when it names a DP master: all four keys, of the types vLLM sends.
std::optional<DataParallelMaster> read_data_parallel_master(const msgpack::object* config) {
  if (config == nullptr) return std::nullopt;
  auto ip = str_field(*config, "data_parallel_master_ip");
  auto port = int_field(*config, "data_parallel_master_port");
  auto size = int_field(*config, "data_parallel_size");
  const msgpack::object* list = find_key(*config, "_data_parallel_master_port_list");
  auto ports = list ? int_list(*list) : std::nullopt;
  if (!ip || !port || !size || !ports) return std::nullopt;
  return DataParallelMaster{std::move(*ip), *port, std::move(*ports), *size};
}

void pack_data_parallel_master(Packer& packer, const DataParallelMaster& master) {
  // The keys in the order vLLM's frontend writes its dict.
  packer.pack_map(4);
  pack_str(packer, "data_parallel_master_ip");
  pack_str(packer, master.ip);
  pack_str(packer, "data_parallel_master_port");
  packer.pack_int64(master.port);
  pack_str(packer, "_data_parallel_master_port_list");
  packer.pack_array(static_cast<std::uint32_t>(master.port_list.size()));
  for (std::int64_t port : master.port_list) packer.pack_int64(port);
  pack_str(packer, "data_parallel_size");
  packer.pack_int64(master.data_parallel_size);
}

// A port the kernel hands out for ("", 0), as vLLM's _get_open_port binds it.
tl::expected<std::int64_t, std::string> open_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(std::string("socket: ") + util::errno_text(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof address;
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;
  ::close(fd);
  if (!bound) return fail(std::string("cannot find an open port: ") + util::errno_text(error));
  return ntohs(address.sin_port);
}

}  // namespace

DataParallelMaster split_master_ports(std::string ip, std::vector<std::int64_t> open_ports,
                                      std::int64_t data_parallel_size) {
  DataParallelMaster master{std::move(ip), 0, std::move(open_ports), data_parallel_size};
  master.port = next_dp_init_port(master);
  return master;
}

tl::expected<DataParallelMaster, std::string> pick_data_parallel_master(
    std::string ip, std::int64_t data_parallel_size) {
  constexpr std::size_t kPorts = 5;  // get_open_ports_list(5)
  std::set<std::int64_t> ports;
  while (ports.size() < kPorts) {
    auto port = open_port();
    if (!port) return tl::unexpected(port.error());
    ports.insert(*port);
  }
  return split_master_ports(std::move(ip), {ports.begin(), ports.end()}, data_parallel_size);
}

std::int64_t next_dp_init_port(DataParallelMaster& master) {
  if (!master.port_list.empty()) {
    const std::int64_t port = master.port_list.back();
    master.port_list.pop_back();
    return port;
  }
  return master.port++;
}

std::string engine_identity(int rank) {
  const auto value = static_cast<std::uint16_t>(rank);
  return std::string{static_cast<char>(value & 0xff), static_cast<char>(value >> 8)};
}

std::optional<int> rank_from_identity(std::string_view identity) {
  if (identity.size() != 2) return std::nullopt;
  return static_cast<unsigned char>(identity[0]) | (static_cast<unsigned char>(identity[1]) << 8);
}

std::string encode_handshake_status(const HandshakeStatus& message) {
  StringBuffer buffer;
  Packer packer(buffer);
  packer.pack_map(3);
  pack_str(packer, "status");
  pack_str(packer, message.status);
  pack_str(packer, "local");
  packer.pack(message.local);
  pack_str(packer, "headless");
  packer.pack(message.headless);
  return buffer.take();
}

tl::expected<HandshakeStatus, std::string> decode_handshake_status(std::string_view frame) {
  auto handle = decode(frame);
  if (!handle) return fail(handle.error());
  const msgpack::object& map = handle->get();
  if (map.type != msgpack::type::MAP) return fail("handshake message is not a map");
  HandshakeStatus message;
  const msgpack::object* status = find_key(map, "status");
  if (!status || !as_str(*status)) return fail("handshake message has no string 'status'");
  message.status = std::string(*as_str(*status));
  if (const msgpack::object* local = find_key(map, "local")) {
    message.local = as_bool(*local).value_or(false);
  }
  if (const msgpack::object* headless = find_key(map, "headless")) {
    message.headless = as_bool(*headless).value_or(false);
  }
  return message;
}

std::string encode_init(const InitMessage& message,
                        const std::optional<DataParallelMaster>& master) {
  StringBuffer buffer;
  Packer packer(buffer);
  packer.pack_map(2);
  pack_str(packer, "addresses");
  packer.pack_map(5);
  for (const auto* list : {&message.inputs, &message.outputs}) {
    pack_str(packer, list == &message.inputs ? "inputs" : "outputs");
    packer.pack_array(static_cast<std::uint32_t>(list->size()));
    for (const std::string& address : *list) pack_str(packer, address);
  }
  for (std::string_view key :
       {"coordinator_input", "coordinator_output", "frontend_stats_publish_address"}) {
    pack_str(packer, key);
    packer.pack_nil();
  }
  pack_str(packer, "parallel_config");
  if (master) {
    pack_data_parallel_master(packer, *master);
  } else {
    packer.pack_map(0);
  }
  return buffer.take();
}

tl::expected<InitMessage, std::string> decode_init(std::string_view frame) {
  auto handle = decode(frame);
  if (!handle) return fail(handle.error());
  const msgpack::object* addresses = find_key(handle->get(), "addresses");
  if (!addresses || addresses->type != msgpack::type::MAP) return fail("INIT has no 'addresses'");
  InitMessage message;
  auto inputs = string_list(*addresses, "inputs");
  if (!inputs) return fail(inputs.error());
  auto outputs = string_list(*addresses, "outputs");
  if (!outputs) return fail(outputs.error());
  if (inputs->empty() || inputs->size() != outputs->size()) {
    return fail("INIT 'inputs' and 'outputs' must be non-empty and of equal length");
  }
  message.inputs = std::move(*inputs);
  message.outputs = std::move(*outputs);
  return message;
}

std::optional<DataParallelMaster> decode_init_data_parallel_master(std::string_view frame) {
  auto handle = decode(frame);
  if (!handle) return std::nullopt;
  return read_data_parallel_master(find_key(handle->get(), "parallel_config"));
}

std::string encode_registration(const Registration& registration) {
  if (registration.empty) return {};
  StringBuffer buffer;
  Packer packer(buffer);
  // Two passes over the same field list: count, then write.
  auto fields = [&](bool write) {
    std::uint32_t count = 0;
    pack_optional_int(packer, "world_size", registration.world_size, count, write);
    pack_optional_int(packer, "data_parallel_size", registration.data_parallel_size, count, write);
    pack_optional_int(packer, "tensor_parallel_size", registration.tensor_parallel_size, count,
                      write);
    pack_optional_int(packer, "pipeline_parallel_size", registration.pipeline_parallel_size, count,
                      write);
    pack_optional_int(packer, "decode_context_parallel_size",
                      registration.decode_context_parallel_size, count, write);
    pack_optional_int(packer, "data_parallel_rank", registration.data_parallel_rank, count, write);
    pack_optional_int(packer, "max_model_len", registration.max_model_len, count, write);
    if (registration.vllm_version) {
      if (write) {
        pack_str(packer, "vllm_version");
        pack_str(packer, *registration.vllm_version);
      }
      ++count;
    }
    // weight_transfer_backend is always present in new engines: a string, or nil when unset.
    if (write) {
      pack_str(packer, "weight_transfer_backend");
      if (registration.weight_transfer_backend) {
        pack_str(packer, *registration.weight_transfer_backend);
      } else {
        packer.pack_nil();
      }
    }
    ++count;
    if (registration.supports_draft_weight_updates) {
      if (write) {
        pack_str(packer, "supports_draft_weight_updates");
        packer.pack(*registration.supports_draft_weight_updates);
      }
      ++count;
    }
    return count;
  };
  packer.pack_map(fields(false));
  fields(true);
  return buffer.take();
}

tl::expected<Registration, std::string> decode_registration(std::string_view frame) {
  Registration registration;
  if (frame.empty()) return registration;  // older engines
  auto handle = decode(frame);
  if (!handle) return fail(handle.error());
  const msgpack::object& map = handle->get();
  if (map.type != msgpack::type::MAP) return fail("registration frame is not a map");
  registration.empty = false;
  registration.world_size = int_field(map, "world_size");
  registration.data_parallel_size = int_field(map, "data_parallel_size");
  registration.tensor_parallel_size = int_field(map, "tensor_parallel_size");
  registration.pipeline_parallel_size = int_field(map, "pipeline_parallel_size");
  registration.decode_context_parallel_size = int_field(map, "decode_context_parallel_size");
  registration.data_parallel_rank = int_field(map, "data_parallel_rank");
  registration.vllm_version = str_field(map, "vllm_version");
  registration.max_model_len = int_field(map, "max_model_len");
  registration.weight_transfer_backend = str_field(map, "weight_transfer_backend");
  if (const msgpack::object* draft = find_key(map, "supports_draft_weight_updates")) {
    registration.supports_draft_weight_updates = as_bool(*draft);
  }
  return registration;
}

std::string utility_request_prefix(std::uint64_t client_index, CallId call_id,
                                   std::string_view method) {
  StringBuffer buffer;
  Packer packer(buffer);
  packer.pack_array(4);
  packer.pack_uint64(client_index);
  pack_call_id(packer, call_id);
  pack_str(packer, method);
  return buffer.take();
}

std::string encode_utility_request(std::uint64_t client_index, CallId call_id,
                                   std::string_view method, std::string_view args_msgpack) {
  std::string payload = utility_request_prefix(client_index, call_id, method);
  payload.append(args_msgpack);
  return payload;
}

tl::expected<UtilityRequest, std::string> decode_utility_request(std::string_view payload,
                                                                 const DecodeLimits& limits) {
  auto handle = decode(payload, limits);
  if (!handle) return fail(handle.error());
  const msgpack::object& array = handle->get();
  if (array.type != msgpack::type::ARRAY || array.via.array.size != 4) {
    return fail("UTILITY payload is not an array of 4");
  }
  const msgpack::object* items = array.via.array.ptr;
  UtilityRequest request;
  if (items[0].type != msgpack::type::POSITIVE_INTEGER) {
    return fail("client_index is not a non-negative integer");
  }
  request.client_index = items[0].via.u64;
  auto call_id = decode_call_id(items[1]);
  if (!call_id) return fail(call_id.error());
  request.call_id = *call_id;
  auto method = as_str(items[2]);
  if (!method) return fail("method_name is not a string");
  request.method = std::string(*method);
  if (items[3].type != msgpack::type::ARRAY) return fail("args is not an array");
  request.args_msgpack = encode_object(items[3]);
  return request;
}

std::string encode_engine_core_outputs(std::int64_t engine_index, const UtilityOutput& output,
                                       double timestamp, int fields) {
  StringBuffer buffer;
  Packer packer(buffer);
  packer.pack_array(static_cast<std::uint32_t>(fields < 5 ? 5 : fields));
  packer.pack_int64(engine_index);
  packer.pack_array(0);  // outputs
  packer.pack_nil();     // scheduler_stats
  write_float64(buffer, timestamp);
  packer.pack_array(3);  // utility_output
  pack_call_id(packer, output.call_id);
  if (output.failure_message) {
    pack_str(packer, *output.failure_message);
    packer.pack_nil();
  } else {
    packer.pack_nil();
    packer.pack_array(2);
    packer.pack_nil();  // type_info: only used for msgspec typed results
    buffer.write(output.value_msgpack.data(), output.value_msgpack.size());
  }
  for (int i = 5; i < fields; ++i) packer.pack_nil();
  return buffer.take();
}

tl::expected<UtilityOutput, std::string> decode_utility_output(const msgpack::object& utility) {
  if (utility.type != msgpack::type::ARRAY || utility.via.array.size < 3) {
    return fail("utility_output is not an array of 3");
  }
  const msgpack::object* parts = utility.via.array.ptr;
  UtilityOutput output;
  auto call_id = decode_call_id(parts[0]);
  if (!call_id) return fail(call_id.error());
  output.call_id = *call_id;
  if (!is_nil(parts[1])) {
    auto message = as_str(parts[1]);
    if (!message) return fail("failure_message is neither a string nor nil");
    output.failure_message = std::string(*message);
  }
  const msgpack::object& result = parts[2];
  if (result.type == msgpack::type::ARRAY && result.via.array.size == 2) {
    output.value_msgpack = encode_object(result.via.array.ptr[1]);
  } else if (!is_nil(result)) {
    return fail("utility result is neither nil nor [type_info, value]");
  }
  return output;
}

tl::expected<EngineCoreOutputs, std::string> decode_engine_core_outputs(
    std::string_view frame, const DecodeLimits& limits) {
  auto handle = decode(frame, limits);
  if (!handle) return fail(handle.error());
  const msgpack::object& array = handle->get();
  if (array.type != msgpack::type::ARRAY || array.via.array.size < 5) {
    return fail("EngineCoreOutputs is not an array of at least 5 fields");
  }
  const msgpack::object* fields = array.via.array.ptr;
  EngineCoreOutputs outputs;
  outputs.engine_index = as_int64(fields[0]).value_or(0);
  const msgpack::object& utility = fields[4];
  if (is_nil(utility)) return outputs;
  auto output = decode_utility_output(utility);
  if (!output) return fail(output.error());
  outputs.utility_output = std::move(*output);
  return outputs;
}

std::string encode_string_array(const std::vector<std::string>& items) {
  StringBuffer buffer;
  Packer packer(buffer);
  packer.pack_array(static_cast<std::uint32_t>(items.size()));
  for (const std::string& item : items) pack_str(packer, item);
  return buffer.take();
}

}  // namespace vllmd::wire
