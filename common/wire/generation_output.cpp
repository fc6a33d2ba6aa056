#include "common/wire/generation_output.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/util/fail.hpp"

namespace vllmd::wire {

namespace {

using util::fail;
using Dtype = ArrayView::Dtype;

constexpr std::int8_t kArrayExtType = 3;  // vLLM serial_utils' raw-view extension

// A field past an array's end reads as nil.
const msgpack::object& field(const msgpack::object& array, std::size_t i) {
  static const msgpack::object kNil;
  return i < array.via.array.size ? array.via.array.ptr[i] : kNil;
}

bool is_array(const msgpack::object& object) { return object.type == msgpack::type::ARRAY; }
bool is_map(const msgpack::object& object) { return object.type == msgpack::type::MAP; }

std::size_t item_size(Dtype dtype) { return dtype == Dtype::kInt64 ? 8 : 4; }

// numpy's dtype.str ("<i8", byte order first) or torch's name without "torch." ("int64").
std::optional<std::pair<Dtype, bool>> parse_dtype(std::string_view name) {
  bool big_endian = false;
  if (!name.empty() && (name[0] == '<' || name[0] == '>' || name[0] == '=' || name[0] == '|')) {
    big_endian = name[0] == '>';
    name.remove_prefix(1);
  }
  if (name == "i4" || name == "int32") return std::pair{Dtype::kInt32, big_endian};
  if (name == "i8" || name == "int64") return std::pair{Dtype::kInt64, big_endian};
  if (name == "f4" || name == "float32") return std::pair{Dtype::kFloat32, big_endian};
  return std::nullopt;
}

template <typename T> T load(std::string_view data, std::size_t i, bool big_endian) {
  T value;
  std::memcpy(&value, data.data() + i * sizeof(T), sizeof(T));
  if (big_endian != (std::endian::native == std::endian::big)) {
    auto bytes = std::bit_cast<std::array<unsigned char, sizeof(T)>>(value);
    std::reverse(bytes.begin(), bytes.end());
    value = std::bit_cast<T>(bytes);
  }
  return value;
}

// [dtype, shape, data]: data is ext type 3 holding the bytes, or the index of a frame.
tl::expected<ArrayView, std::string> decode_array(const msgpack::object& object,
                                                  std::span<const std::string_view> frames,
                                                  std::string_view what) {
  auto bad = [&](std::string_view why) {
    std::string text(what);
    return fail(text.append(": ").append(why));
  };
  if (!is_array(object) || object.via.array.size != 3)
    return bad("not a [dtype, shape, data] array");
  auto name = as_str(object.via.array.ptr[0]);
  auto dtype = name ? parse_dtype(*name) : std::nullopt;
  if (!dtype) return bad("dtype is not one of int32, int64, float32");
  ArrayView view;
  view.dtype = dtype->first;
  view.big_endian = dtype->second;
  const msgpack::object& shape = object.via.array.ptr[1];
  if (!is_array(shape) || shape.via.array.size > 2) return bad("shape has more than 2 dimensions");
  const msgpack::object& data = object.via.array.ptr[2];
  if (data.type == msgpack::type::EXT && data.via.ext.type() == kArrayExtType) {
    view.data = std::string_view(data.via.ext.data(), data.via.ext.size);
  } else if (data.type == msgpack::type::POSITIVE_INTEGER && data.via.u64 >= 1 &&
             data.via.u64 < frames.size()) {
    view.data = frames[data.via.u64];
  } else {
    return bad("data is neither ext type 3 nor the index of one of the message's frames");
  }
  std::size_t elements = 1;
  for (std::uint32_t i = 0; i < shape.via.array.size; ++i) {
    auto extent = as_int64(shape.via.array.ptr[i]);
    if (!extent || *extent < 0 || static_cast<std::size_t>(*extent) > view.data.size()) {
      return bad("shape holds a bad extent");
    }
    view.shape[i] = static_cast<std::size_t>(*extent);
    elements *= view.shape[i];
  }
  if (shape.via.array.size == 0) view.shape = {1, 1};
  if (elements > view.data.size() || elements * item_size(view.dtype) != view.data.size()) {
    return bad("data does not hold shape × item size bytes");
  }
  return view;
}

// LogprobsLists (3 or 4 entries) or LogprobsTensors (3 to 5): ids, logprobs, ranks, then the
// cu_num_generated_tokens fields, which a per-request payload leaves nil.
tl::expected<std::optional<LogprobsView>, std::string> decode_logprobs(
    const msgpack::object& object, std::span<const std::string_view> frames,
    std::string_view what) {
  if (is_nil(object)) return std::nullopt;
  auto bad = [&](std::string_view why) {
    std::string text(what);
    return fail(text.append(": ").append(why));
  };
  if (!is_array(object) || object.via.array.size < 3 || object.via.array.size > 5) {
    return bad("not a tuple of 3 to 5 entries");
  }
  for (std::uint32_t i = 3; i < object.via.array.size; ++i) {
    if (!is_nil(object.via.array.ptr[i])) return bad("cu_num_generated_tokens is set");
  }
  LogprobsView view;
  auto ids = decode_array(object.via.array.ptr[0], frames, what);
  if (!ids) return fail(ids.error());
  auto logprobs = decode_array(object.via.array.ptr[1], frames, what);
  if (!logprobs) return fail(logprobs.error());
  auto ranks = decode_array(object.via.array.ptr[2], frames, what);
  if (!ranks) return fail(ranks.error());
  view.token_ids = *ids;
  view.logprobs = *logprobs;
  view.ranks = *ranks;
  if (view.token_ids.dtype == Dtype::kFloat32 || view.ranks.dtype == Dtype::kFloat32 ||
      view.logprobs.dtype != Dtype::kFloat32) {
    return bad("token ids and ranks must be integers, logprobs float32");
  }
  if (view.logprobs.shape != view.token_ids.shape || view.ranks.size() != view.rows()) {
    return bad("token ids, logprobs and ranks disagree on their shapes");
  }
  if (view.rows() > 0 && view.columns() == 0) return bad("rows without columns");
  return view;
}

tl::expected<OutputView, std::string> decode_output(const msgpack::object& object,
                                                    std::span<const std::string_view> frames) {
  if (!is_array(object) || object.via.array.size < 2) {
    return fail("EngineCoreOutput is not an array of at least 2 fields");
  }
  OutputView output;
  auto id = as_str(field(object, 0));
  if (!id) return fail("EngineCoreOutput.request_id is not a string");
  output.request_id = *id;
  const msgpack::object& tokens = field(object, 1);
  if (is_array(tokens)) {
    for (std::uint32_t i = 0; i < tokens.via.array.size; ++i) {
      if (!as_int64(tokens.via.array.ptr[i])) return fail("new_token_ids holds a non-integer");
    }
    output.new_token_ids = IntsView(tokens);
  } else if (!is_nil(tokens)) {
    return fail("new_token_ids is not a list");
  }
  auto logprobs = decode_logprobs(field(object, 2), frames, "new_logprobs");
  if (!logprobs) return fail(logprobs.error());
  output.logprobs = *logprobs;
  auto prompt = decode_logprobs(field(object, 3), frames, "new_prompt_logprobs_tensors");
  if (!prompt) return fail(prompt.error());
  output.prompt_logprobs = *prompt;
  // Early v1 engines had no pooling_output at index 4, so finish_reason sat there. A pooling
  // output is never an integer, which tells the two apart.
  const bool early = as_int64(field(object, 4)).has_value();
  const msgpack::object& finish = field(object, early ? 4 : 5);
  const msgpack::object& stop = field(object, early ? 5 : 6);
  if (!is_nil(finish)) {
    output.finish_reason = as_int64(finish);
    if (!output.finish_reason) return fail("finish_reason is not an integer");
  }
  if (auto token = as_int64(stop)) {
    output.stop_token = token;
  } else if (auto text = as_str(stop)) {
    output.stop_text = text;
  } else if (!is_nil(stop)) {
    return fail("stop_reason is neither a token id, a string nor nil");
  }
  if (early) return output;
  if (is_map(field(object, 8))) output.kv_transfer_params = &field(object, 8);
  // Newer engines: prefill_stats (a map) at 11; older ones: num_cached_tokens at 10.
  if (is_map(field(object, 11))) {
    if (const msgpack::object* cached = find_key(field(object, 11), "num_cached_tokens")) {
      output.num_cached_tokens = as_int64(*cached);
    }
  } else if (auto cached = as_int64(field(object, 10))) {
    output.num_cached_tokens = cached;
  }
  return output;
}

std::optional<std::int64_t> stat(const msgpack::object& map, std::string_view key) {
  const msgpack::object* value = find_key(map, key);
  return value ? as_int64(*value) : std::nullopt;
}

// ---- encoding ----

struct FrameWriter {
  const OutputEncoding& encoding;
  std::vector<std::string>& frames;

  template <typename T> void array(Packer& packer, std::string_view dtype,
                                   std::span<const std::size_t> shape,
                                   const std::vector<T>& values) {
    packer.pack_array(3);
    pack_str(packer, dtype);
    packer.pack_array(static_cast<std::uint32_t>(shape.size()));
    for (std::size_t extent : shape) packer.pack_uint64(extent);
    const auto bytes = values.size() * sizeof(T);
    const char* data = reinterpret_cast<const char*>(values.data());
    if (bytes < encoding.zero_copy_threshold) {
      packer.pack_ext(bytes, kArrayExtType);
      packer.pack_ext_body(data, bytes);
    } else {
      packer.pack_uint64(frames.size());
      frames.emplace_back(data, bytes);
    }
  }

  // numpy names in a 4-tuple (LogprobsLists), or torch names in a 5-tuple (LogprobsTensors).
  void logprobs(Packer& packer, const LogprobRows& rows, bool torch) {
    const std::array<std::size_t, 2> matrix{rows.rows, rows.columns};
    const std::array<std::size_t, 1> vector{rows.rows};
    packer.pack_array(torch ? 5 : 4);
    array(packer, torch ? "int64" : "<i8", matrix, rows.token_ids);
    array(packer, torch ? "float32" : "<f4", matrix, rows.logprobs);
    array(packer, torch ? "int64" : "<i8", vector, rows.ranks);
    packer.pack_nil();
    if (torch) packer.pack_nil();
  }

  void output(Packer& packer, const OutputToSend& out) {
    const std::size_t count = std::max<std::size_t>(encoding.output_fields, 6);
    packer.pack_array(static_cast<std::uint32_t>(count));
    pack_str(packer, out.request_id);
    packer.pack_array(static_cast<std::uint32_t>(out.new_token_ids.size()));
    for (std::int64_t token : out.new_token_ids) packer.pack_int64(token);
    if (out.logprobs)
      logprobs(packer, *out.logprobs, false);
    else
      packer.pack_nil();
    if (out.prompt_logprobs)
      logprobs(packer, *out.prompt_logprobs, true);
    else
      packer.pack_nil();
    packer.pack_nil();  // pooling_output
    if (out.finish_reason)
      packer.pack_uint8(static_cast<std::uint8_t>(*out.finish_reason));
    else
      packer.pack_nil();
    for (std::size_t i = 6; i < count; ++i) {
      if (i == 6 && out.stop_token) {
        packer.pack_int64(*out.stop_token);
      } else if (i == 11 && out.num_cached_tokens) {
        packer.pack_map(1);
        pack_str(packer, "num_cached_tokens");
        packer.pack_int64(*out.num_cached_tokens);
      } else if (i == 13) {
        packer.pack_uint8(0);  // num_nans_in_logits
      } else {
        packer.pack_nil();
      }
    }
  }
};

}  // namespace

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kRepetition: return "repetition";
  }
  return "error";
}

std::int64_t IntsView::operator[](std::size_t i) const { return *as_int64(items_[i]); }

std::int64_t ArrayView::integer(std::size_t i) const {
  return dtype == Dtype::kInt64 ? load<std::int64_t>(data, i, big_endian)
                                : load<std::int32_t>(data, i, big_endian);
}

double ArrayView::real(std::size_t i) const {
  return dtype == Dtype::kFloat32 ? load<float>(data, i, big_endian)
                                  : static_cast<double>(integer(i));
}

tl::expected<DecodedOutputs, std::string> decode_outputs(std::span<const std::string_view> frames,
                                                         const DecodeLimits& limits) {
  if (frames.empty()) return fail("an outputs message without frames");
  auto handle = decode(frames[0], limits);
  if (!handle) return fail(handle.error());
  DecodedOutputs decoded;
  decoded.handle = std::move(*handle);
  const msgpack::object& array = decoded.handle.get();
  if (!is_array(array) || array.via.array.size < 2) {
    return fail("EngineCoreOutputs is not an array of at least 2 fields");
  }
  decoded.engine_index = as_int64(field(array, 0)).value_or(0);
  const msgpack::object& outputs = field(array, 1);
  if (!is_array(outputs)) return fail("EngineCoreOutputs.outputs is not a list");
  decoded.outputs.reserve(outputs.via.array.size);
  for (std::uint32_t i = 0; i < outputs.via.array.size; ++i) {
    auto output = decode_output(outputs.via.array.ptr[i], frames);
    if (!output) return fail(output.error());
    decoded.outputs.push_back(*output);
  }
  if (const msgpack::object& stats = field(array, 2); is_map(stats)) {
    decoded.scheduler_stats = SchedulerStats{stat(stats, "num_running_reqs").value_or(0),
                                             stat(stats, "num_waiting_reqs").value_or(0)};
  }
  if (const msgpack::object& utility = field(array, 4); !is_nil(utility)) {
    auto reply = decode_utility_output(utility);
    if (!reply) return fail(reply.error());
    decoded.utility_output = std::move(*reply);
  }
  if (const msgpack::object& finished = field(array, 5); is_array(finished)) {
    for (std::uint32_t i = 0; i < finished.via.array.size; ++i) {
      auto id = as_str(finished.via.array.ptr[i]);
      if (!id) return fail("finished_requests holds a non-string");
      decoded.finished_requests.push_back(*id);
    }
  }
  decoded.wave_complete = as_int64(field(array, 6));
  decoded.start_wave = as_int64(field(array, 7));
  return decoded;
}

std::vector<std::string> encode_outputs(const OutputsToSend& message,
                                        const OutputEncoding& encoding) {
  std::vector<std::string> frames(1);
  FrameWriter writer{encoding, frames};
  StringBuffer buffer;
  Packer packer(buffer);
  const std::size_t count = std::max<std::size_t>(encoding.outputs_fields, 6);
  packer.pack_array(static_cast<std::uint32_t>(count));
  packer.pack_int64(message.engine_index);
  packer.pack_array(static_cast<std::uint32_t>(message.outputs.size()));
  for (const OutputToSend& output : message.outputs) writer.output(packer, output);
  if (message.scheduler_stats) {
    packer.pack_map(2);
    pack_str(packer, "num_running_reqs");
    packer.pack_int64(message.scheduler_stats->running);
    pack_str(packer, "num_waiting_reqs");
    packer.pack_int64(message.scheduler_stats->waiting);
  } else {
    packer.pack_nil();
  }
  pack_float64(buffer, message.timestamp);
  packer.pack_nil();  // utility_output
  if (message.finished_requests.empty()) {
    packer.pack_nil();
  } else {
    packer.pack_array(static_cast<std::uint32_t>(message.finished_requests.size()));
    for (const std::string& id : message.finished_requests) pack_str(packer, id);
  }
  for (std::size_t i = 6; i < count; ++i) packer.pack_nil();
  frames[0] = buffer.take();
  return frames;
}

}  // namespace vllmd::wire
