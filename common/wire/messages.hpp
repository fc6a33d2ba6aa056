#pragma once
// The engine-core wire protocol (docs/engine-protocol.md): handshake maps, the registration
// frame, UTILITY requests and EngineCoreOutputs replies. Encoders write minimal-width msgpack so
// the bytes match the test vectors of docs/engine-protocol.md §7; decoders accept what vLLM's
// engines send and nothing that could crash us.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "common/wire/msgpack_codec.hpp"

namespace vllmd::wire {

// The single frame an engine sends on its output socket when it dies.
inline constexpr std::string_view kEngineCoreDead = "ENGINE_CORE_DEAD";

// Request type byte, sent as its own 1-byte frame before the payload.
enum class RequestType : std::uint8_t {
  kAdd = 0x00,
  kAbort = 0x01,
  kStartDpWave = 0x02,
  kUtility = 0x03
};

// Engine identity on the frontend's ROUTER sockets: the DP rank as 2 little-endian bytes.
std::string engine_identity(int rank);
// Inverse of engine_identity; nullopt for identities of another shape.
std::optional<int> rank_from_identity(std::string_view identity);

// HELLO and READY: {"status": ..., "local": bool, "headless": bool}, unknown keys ignored.
struct HandshakeStatus {
  std::string status;
  bool local = false;
  bool headless = false;
};
std::string encode_handshake_status(const HandshakeStatus& message);
tl::expected<HandshakeStatus, std::string> decode_handshake_status(std::string_view frame);

// The DP master of coordinated (MoE) data parallelism: the four ParallelConfig attributes
// vLLM's frontend puts in INIT's parallel_config (vllm/v1/engine/utils.py,
// wait_for_engine_startup) so that every engine forms its DP group at the same place. Dense
// models get an empty parallel_config.
struct DataParallelMaster {
  std::string ip;                       // data_parallel_master_ip
  std::int64_t port = 0;                // data_parallel_master_port
  std::vector<std::int64_t> port_list;  // _data_parallel_master_port_list
  std::int64_t data_parallel_size = 1;  // data_parallel_size
  friend bool operator==(const DataParallelMaster&, const DataParallelMaster&) = default;
};

// How vLLM's ParallelConfig.__post_init__ derives the ports for DP > 1: five distinct open
// ports (get_open_ports_list(5)); the last one is popped as data_parallel_master_port, the
// other four stay in the list. split_master_ports does the split; pick_data_parallel_master
// finds the open ports too (ascending: Python hands them over in its set's order).
DataParallelMaster split_master_ports(std::string ip, std::vector<std::int64_t> open_ports,
                                      std::int64_t data_parallel_size);
tl::expected<DataParallelMaster, std::string> pick_data_parallel_master(
    std::string ip, std::int64_t data_parallel_size);
// ParallelConfig.get_next_dp_init_port(): the port a DP process group is set up on. It pops
// the list's last port; once the list is empty it takes the master port and advances it.
std::int64_t next_dp_init_port(DataParallelMaster& master);

// INIT: the addresses the engine must connect its input DEALER and output PUSH to, and (for
// coordinated DP only) the DP master in parallel_config, which is {} without one.
struct InitMessage {
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
};
std::string encode_init(const InitMessage& message,
                        const std::optional<DataParallelMaster>& master = std::nullopt);
tl::expected<InitMessage, std::string> decode_init(std::string_view frame);
// The DP master of an INIT frame decode_init accepts: set only when parallel_config holds all
// four keys, of the types vLLM sends.
std::optional<DataParallelMaster> decode_init_data_parallel_master(std::string_view frame);

// The registration frame an engine sends first on its input connection. Older engines send an
// empty frame (`empty`); newer ones a map whose fields are all optional here.
struct Registration {
  bool empty = true;
  std::optional<std::int64_t> world_size;
  std::optional<std::int64_t> data_parallel_size;
  std::optional<std::int64_t> tensor_parallel_size;
  std::optional<std::int64_t> pipeline_parallel_size;
  std::optional<std::int64_t> decode_context_parallel_size;
  std::optional<std::int64_t> data_parallel_rank;
  std::optional<std::string> vllm_version;
  std::optional<std::int64_t> max_model_len;  // the longest sequence (prompt and output) it takes
  std::optional<std::string> weight_transfer_backend;
  std::optional<bool> supports_draft_weight_updates;
};
std::string encode_registration(const Registration& registration);
tl::expected<Registration, std::string> decode_registration(std::string_view frame);

// Call ids travel as msgpack integers. We send unsigned ones; Python's frontend sends random
// unsigned 64-bit values, other peers may use negative ones, so both are kept exactly.
struct CallId {
  std::uint64_t bits = 0;
  bool negative = false;  // bits holds an int64 in two's complement
  friend bool operator==(const CallId&, const CallId&) = default;
};

// UTILITY payload: [client_index, call_id, method_name, args]; `args_msgpack` is one complete
// msgpack array, spliced in unchanged.
std::string encode_utility_request(std::uint64_t client_index, CallId call_id,
                                   std::string_view method, std::string_view args_msgpack);
// Everything of the payload before `args`, so a large args array can be copied only once,
// straight into the outgoing frame.
std::string utility_request_prefix(std::uint64_t client_index, CallId call_id,
                                   std::string_view method);

struct UtilityRequest {
  std::uint64_t client_index = 0;
  CallId call_id;
  std::string method;
  std::string args_msgpack;  // the args array, re-encoded
};
tl::expected<UtilityRequest, std::string> decode_utility_request(std::string_view payload,
                                                                 const DecodeLimits& limits = {});

// UtilityOutput: [call_id, failure_message|nil, nil | [type_info, value]].
struct UtilityOutput {
  CallId call_id;
  std::optional<std::string> failure_message;
  std::string value_msgpack = std::string(1, '\xc0');  // the returned value; nil for None
};

// The utility_output field of an EngineCoreOutputs.
tl::expected<UtilityOutput, std::string> decode_utility_output(const msgpack::object& utility);

// EngineCoreOutputs as a positional array of `fields` (>= 5) entries; only a utility reply.
// 8 is what msgspec writes for current engines: array_like structs carry every field.
std::string encode_engine_core_outputs(std::int64_t engine_index, const UtilityOutput& output,
                                       double timestamp, int fields = 8);

struct EngineCoreOutputs {
  std::int64_t engine_index = 0;
  std::optional<UtilityOutput> utility_output;  // nullopt: not a utility reply, ignore it
};
tl::expected<EngineCoreOutputs, std::string> decode_engine_core_outputs(
    std::string_view frame, const DecodeLimits& limits = {});

// Convenience for building `args` arrays of plain values.
std::string encode_string_array(const std::vector<std::string>& items);

}  // namespace vllmd::wire
