#pragma once
// The generation half of the engine-core wire, engine → frontend (docs/engine-protocol.md §8):
// one EngineCoreOutputs per engine step, holding a delta of new tokens (and logprobs) for every
// running request, scheduler stats, the ids of finished requests, or a utility reply.
//
// Decoding is tolerant in the ways vLLM's versions differ: any number of fields (missing ones
// read as nil, extra ones are ignored), the layouts before and after prefill_stats, the early
// one without pooling_output, logprob tuples of 3 to 5 entries, ndarrays and tensors inline
// (msgpack ext type 3, any ext width) or as an index into the message's extra frames. The
// decoded message is a set of views into the frames, read in place (msgpack_reader.hpp):
// nothing is built or copied per token, and the frames must outlive the result.

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "common/wire/messages.hpp"
#include "common/wire/msgpack_codec.hpp"
#include "common/wire/msgpack_reader.hpp"

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

// The integers of a msgpack array, read in place: decoding checked each one fits int64.
class IntsView {
 public:
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = std::int64_t;
    using difference_type = std::ptrdiff_t;
    using reference = std::int64_t;
    using pointer = void;
    Iterator() = default;
    Iterator(const char* at, std::size_t left) : at_(at), left_(left) {}
    std::int64_t operator*() const {
      const char* at = at_;
      return read_checked_int(at);
    }
    Iterator& operator++() {
      read_checked_int(at_);
      --left_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator before = *this;
      ++*this;
      return before;
    }
    bool operator==(const Iterator& other) const { return left_ == other.left_; }

   private:
    const char* at_ = nullptr;
    std::size_t left_ = 0;
  };

  IntsView() = default;
  IntsView(const char* first, std::size_t size) : first_(first), size_(size) {}
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Iterator begin() const { return {first_, size_}; }
  Iterator end() const { return {nullptr, 0}; }

 private:
  const char* first_ = nullptr;  // the first element's msgpack bytes
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

// One EngineCoreOutput: a request's delta since the previous step. A step holds thousands:
// what every step reads comes first, and the rarer logprobs sit apart (DecodedOutputs).
struct OutputView {
  std::string_view request_id;  // the engine's id
  IntsView new_token_ids;
  std::optional<std::int64_t> finish_reason;      // as sent; values past kRepetition are unknown
  std::optional<std::int64_t> num_cached_tokens;  // prefill_stats, or the older field
  const LogprobsView* logprobs = nullptr;
  const LogprobsView* prompt_logprobs = nullptr;
  std::optional<std::int64_t> stop_token;     // stop_reason when it is a token id
  std::optional<std::string_view> stop_text;  // stop_reason when it is a string
  std::string_view kv_transfer_params;        // the map's msgpack bytes, or empty
};

struct SchedulerStats {
  std::int64_t running = 0;  // num_running_reqs
  std::int64_t waiting = 0;  // num_waiting_reqs
};

struct DecodedOutputs {
  std::int64_t engine_index = 0;
  std::vector<OutputView> outputs;
  std::vector<LogprobsView> logprobs;  // what the outputs' logprobs point to
  std::optional<SchedulerStats> scheduler_stats;
  std::optional<UtilityOutput> utility_output;
  std::vector<std::string_view> finished_requests;
  std::optional<std::int64_t> wave_complete;
  std::optional<std::int64_t> start_wave;
};

// `frames[0]` is the EngineCoreOutputs; an array whose data is the integer i is frames[i].
tl::expected<DecodedOutputs, std::string> decode_outputs(std::span<const std::string_view> frames,
                                                         const DecodeLimits& limits = {});
// The same into `into`, whose vectors keep their capacity from message to message.
tl::expected<void, std::string> decode_outputs(std::span<const std::string_view> frames,
                                               DecodedOutputs& into,
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
