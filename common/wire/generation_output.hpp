#pragma once
// The generation half of the engine-core wire, engine → frontend (docs/engine-protocol.md §8):
// one EngineCoreOutputs per engine step, holding a delta of new tokens (and logprobs) for every
// running request, scheduler stats, the ids of finished requests, or a utility reply.
//
// Decoding is tolerant in the ways vLLM's versions differ: any number of fields (missing ones
// read as nil, extra ones are ignored), the layouts before and after prefill_stats, the early
// one without pooling_output, logprob tuples of 3 to 5 entries, ndarrays and tensors inline
// (msgpack ext type 3, any ext width) or as an index into the message's extra frames. The
// decoded message is a set of views into the frames and into the msgpack object tree: nothing
// is copied per token, and the frames must outlive the result.

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "common/wire/messages.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::wire {

enum class FinishReason : std::uint8_t {
  kStop = 0,
  kLength = 1,
  kAbort = 2,
  kError = 3,
  kRepetition = 4
};
// "stop", "length", "abort", "error", "repetition": vLLM's FINISH_REASON_STRINGS.
std::string_view finish_reason_name(FinishReason reason);

// Integers of a msgpack array already checked to be integers.
class IntsView {
 public:
  IntsView() = default;
  explicit IntsView(const msgpack::object& array)
      : items_(array.via.array.ptr), size_(array.via.array.size) {}
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::int64_t operator[](std::size_t i) const;

 private:
  const msgpack::object* items_ = nullptr;
  std::size_t size_ = 0;
};

// The bytes of an ndarray or tensor: dtype int32, int64 or float32, either byte order, at most
// two dimensions (a vector is one row). Elements are read with memcpy: the data is unaligned.
struct ArrayView {
  enum class Dtype : std::uint8_t { kInt32, kInt64, kFloat32 };
  Dtype dtype = Dtype::kInt64;
  bool big_endian = false;
  std::array<std::size_t, 2> shape{0, 1};
  std::string_view data;
  std::size_t size() const { return shape[0] * shape[1]; }
  std::int64_t integer(std::size_t i) const;
  double real(std::size_t i) const;
};

// LogprobsLists (sample logprobs) or LogprobsTensors (prompt logprobs): rows × columns of
// token ids and logprobs, column 0 the sampled (or prompt) token, and that token's rank per
// row. Columns 1.. have ranks 1...
struct LogprobsView {
  ArrayView token_ids;
  ArrayView logprobs;
  ArrayView ranks;
  std::size_t rows() const { return token_ids.shape[0]; }
  std::size_t columns() const { return token_ids.shape[1]; }
};

// One EngineCoreOutput: a request's delta since the previous step.
struct OutputView {
  std::string_view request_id;  // the engine's id
  IntsView new_token_ids;
  std::optional<LogprobsView> logprobs;
  std::optional<LogprobsView> prompt_logprobs;
  std::optional<std::int64_t> finish_reason;  // as sent; values past kRepetition are unknown
  std::optional<std::int64_t> stop_token;     // stop_reason when it is a token id
  std::optional<std::string_view> stop_text;  // stop_reason when it is a string
  const msgpack::object* kv_transfer_params = nullptr;  // a map, or null
  std::optional<std::int64_t> num_cached_tokens;        // prefill_stats, or the older field
};

struct SchedulerStats {
  std::int64_t running = 0;  // num_running_reqs
  std::int64_t waiting = 0;  // num_waiting_reqs
};

struct DecodedOutputs {
  msgpack::object_handle handle;  // owns the object tree the views point into
  std::int64_t engine_index = 0;
  std::vector<OutputView> outputs;
  std::optional<SchedulerStats> scheduler_stats;
  std::optional<UtilityOutput> utility_output;
  std::vector<std::string_view> finished_requests;
  std::optional<std::int64_t> wave_complete;
  std::optional<std::int64_t> start_wave;
};

// `frames[0]` is the EngineCoreOutputs; an array whose data is the integer i is frames[i].
tl::expected<DecodedOutputs, std::string> decode_outputs(std::span<const std::string_view> frames,
                                                         const DecodeLimits& limits = {});

// ---- the engine side (the reference engine, tests) ----

// Logprob rows to send: rows × columns ids and logprobs, one rank per row.
struct LogprobRows {
  std::size_t rows = 0;
  std::size_t columns = 0;
  std::vector<std::int64_t> token_ids;
  std::vector<float> logprobs;
  std::vector<std::int64_t> ranks;
};

struct OutputToSend {
  std::string request_id;
  std::vector<std::int64_t> new_token_ids;
  std::optional<LogprobRows> logprobs;         // as numpy ndarrays, a LogprobsLists 4-tuple
  std::optional<LogprobRows> prompt_logprobs;  // as torch tensors, a LogprobsTensors 5-tuple
  std::optional<FinishReason> finish_reason;
  std::optional<std::int64_t> stop_token;
  std::optional<std::int64_t> num_cached_tokens;  // sent as prefill_stats
};

struct OutputsToSend {
  std::int64_t engine_index = 0;
  std::vector<OutputToSend> outputs;
  std::optional<SchedulerStats> scheduler_stats;
  double timestamp = 0.0;
  std::vector<std::string> finished_requests;  // nil when empty
};

struct OutputEncoding {
  std::size_t outputs_fields = 8;  // EngineCoreOutputs (at least 6)
  std::size_t output_fields = 17;  // EngineCoreOutput (at least 6; 12 carries prefill_stats)
  // vLLM's VLLM_MSGPACK_ZERO_COPY_THRESHOLD: arrays of this many bytes or more go in frames.
  std::size_t zero_copy_threshold = 256;
};

// The frames of one message: the EngineCoreOutputs, then one frame per large array.
std::vector<std::string> encode_outputs(const OutputsToSend& message,
                                        const OutputEncoding& encoding = {});

}  // namespace vllmd::wire
