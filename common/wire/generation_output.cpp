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

using Result = tl::expected<void, std::string>;

// Walks a map of `entries`: `take(key)` reads the value of a key it knows and says whether it
// did; other values, and keys that are not strings with theirs, are passed over.
template <typename Take> bool read_map(MsgpackReader& reader, std::uint32_t entries, Take&& take) {
  for (std::uint32_t i = 0; i < entries && !reader.failed(); ++i) {
    const auto key = reader.str();
    if (!key && !reader.skip()) return false;
    if (key && take(*key)) continue;
    if (!reader.skip()) return false;
  }
  return !reader.failed();
}

// [dtype, shape, data]: data is ext type 3 holding the bytes, or the index of a frame.
tl::expected<ArrayView, std::string> decode_array(MsgpackReader& reader,
                                                  std::span<const std::string_view> frames,
                                                  std::string_view what) {
  auto bad = [&](std::string_view why) {
    std::string text(what);
    return fail(text.append(": ").append(why));
  };
  const auto parts = reader.array();
  if (!parts || *parts != 3) return bad("not a [dtype, shape, data] array");
  const auto name = reader.str();
  const auto dtype = name ? parse_dtype(*name) : std::nullopt;
  if (!dtype) return bad("dtype is not one of int32, int64, float32");
  ArrayView view;
  view.dtype = dtype->first;
  view.big_endian = dtype->second;
  const auto dimensions = reader.array();
  if (!dimensions || *dimensions > 2) return bad("shape has more than 2 dimensions");
  std::array<std::int64_t, 2> extents{0, 1};
  for (std::uint32_t i = 0; i < *dimensions; ++i) {
    const auto extent = reader.int64();
    if (!extent || *extent < 0) return bad("shape holds a bad extent");
    extents[i] = *extent;
  }
  if (*dimensions == 0) extents = {1, 1};
  constexpr std::string_view kNoData =
      "data is neither ext type 3 nor the index of one of the message's frames";
  if (const auto ext = reader.ext()) {
    if (ext->type != kArrayExtType) return bad(kNoData);
    view.data = ext->data;
  } else if (const auto index = reader.int64();
             index && *index >= 1 && static_cast<std::size_t>(*index) < frames.size()) {
    view.data = frames[static_cast<std::size_t>(*index)];
  } else {
    return bad(kNoData);
  }
  for (std::size_t i = 0; i < 2; ++i) {
    // No extent can exceed the bytes: their product then cannot overflow.
    if (static_cast<std::uint64_t>(extents[i]) > view.data.size()) {
      return bad("shape holds a bad extent");
    }
    view.shape[i] = static_cast<std::size_t>(extents[i]);
  }
  const std::size_t elements = view.shape[0] * view.shape[1];
  if (elements > view.data.size() || elements * item_size(view.dtype) != view.data.size()) {
    return bad("data does not hold shape × item size bytes");
  }
  return view;
}

// Where an output's logprobs point until the outputs stop moving (decode_outputs).
const LogprobsView kPending;

// LogprobsLists (3 or 4 entries) or LogprobsTensors (3 to 5): ids, logprobs, ranks, then the
// cu_num_generated_tokens fields, which a per-request payload leaves nil. Onto `into`, with
// `to` pointed at kPending.
Result decode_logprobs(MsgpackReader& reader, std::span<const std::string_view> frames,
                       std::string_view what, std::vector<LogprobsView>& into,
                       const LogprobsView*& to) {
  if (reader.nil()) return {};
  auto bad = [&](std::string_view why) {
    std::string text(what);
    return fail(text.append(": ").append(why));
  };
  const auto entries = reader.array();
  if (!entries || *entries < 3 || *entries > 5) return bad("not a tuple of 3 to 5 entries");
  LogprobsView& view = into.emplace_back();
  to = &kPending;
  auto ids = decode_array(reader, frames, what);
  if (!ids) return fail(ids.error());
  auto logprobs = decode_array(reader, frames, what);
  if (!logprobs) return fail(logprobs.error());
  auto ranks = decode_array(reader, frames, what);
  if (!ranks) return fail(ranks.error());
  for (std::uint32_t i = 3; i < *entries; ++i) {
    if (!reader.nil()) return bad("cu_num_generated_tokens is set");
  }
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
  return {};
}

Result decode_finish(MsgpackReader& reader, OutputView& output) {
  if (reader.nil()) return {};
  output.finish_reason = reader.int64();
  if (!output.finish_reason) return fail("finish_reason is not an integer");
  return {};
}

Result decode_stop(MsgpackReader& reader, OutputView& output) {
  if (reader.nil()) return {};
  if ((output.stop_token = reader.int64())) return {};
  if ((output.stop_text = reader.str())) return {};
  return fail("stop_reason is neither a token id, a string nor nil");
}

// Into `output`, in place: a step holds thousands, and each is a few hundred bytes.
Result decode_output(MsgpackReader& reader, std::span<const std::string_view> frames,
                     OutputView& output, std::vector<LogprobsView>& logprobs) {
  const auto fields = reader.array();
  if (!fields || *fields < 2) return fail("EngineCoreOutput is not an array of at least 2 fields");
  const auto id = reader.str();
  if (!id) return fail("EngineCoreOutput.request_id is not a string");
  output.request_id = *id;
  if (const auto count = reader.array()) {
    const char* first = reader.position();
    for (std::uint32_t i = 0; i < *count; ++i) {
      if (!reader.int64()) return fail("new_token_ids holds a non-integer");
    }
    output.new_token_ids = IntsView(first, *count);
  } else if (!reader.nil()) {
    return fail("new_token_ids is not a list");
  }
  // Early v1 engines had no pooling_output at index 4, so finish_reason sat there and
  // stop_reason at 5. A pooling output is never an integer, which tells the two apart.
  bool early = false;
  // Newer engines: prefill_stats (a map) at 11; older ones: num_cached_tokens at 10.
  bool prefill_stats = false;
  std::optional<std::int64_t> cached_field;
  for (std::uint32_t i = 2; i < *fields; ++i) {
    switch (i) {
      case 2:
        if (auto read = decode_logprobs(reader, frames, "new_logprobs", logprobs, output.logprobs);
            !read) {
          return read;
        }
        continue;
      case 3:
        if (auto read = decode_logprobs(reader, frames, "new_prompt_logprobs_tensors", logprobs,
                                        output.prompt_logprobs);
            !read) {
          return read;
        }
        continue;
      case 4:
        early = (output.finish_reason = reader.int64()).has_value();
        if (early) continue;
        break;
      case 5:
        if (auto read = early ? decode_stop(reader, output) : decode_finish(reader, output);
            !read) {
          return read;
        }
        continue;
      case 6:
        if (early) break;
        if (auto read = decode_stop(reader, output); !read) return read;
        continue;
      case 8:
        if (early) break;
        if (const auto map = reader.raw_map()) {
          output.kv_transfer_params = *map;
          continue;
        }
        break;
      case 10:
        if (!early && (cached_field = reader.int64())) continue;
        break;
      case 11:
        if (early) break;
        if (const auto entries = reader.map()) {
          prefill_stats = true;
          auto take = [&](std::string_view key) {
            if (key != "num_cached_tokens") return false;
            output.num_cached_tokens = reader.int64();
            return output.num_cached_tokens.has_value();
          };
          if (!read_map(reader, *entries, take)) return fail(reader.error());
          continue;
        }
        break;
      default: break;
    }
    if (!reader.skip()) return fail(reader.error());
  }
  if (!prefill_stats && !early) output.num_cached_tokens = cached_field;
  return {};
}

Result decode_message(MsgpackReader& reader, std::span<const std::string_view> frames,
                      const DecodeLimits& limits, DecodedOutputs& into) {
  const auto fields = reader.array();
  if (!fields || *fields < 2) {
    return fail("EngineCoreOutputs is not an array of at least 2 fields");
  }
  for (std::uint32_t i = 0; i < *fields; ++i) {
    switch (i) {
      case 0:
        if (const auto index = reader.int64()) {
          into.engine_index = *index;
          continue;
        }
        break;
      case 1: {
        const auto count = reader.array();
        if (!count) return fail("EngineCoreOutputs.outputs is not a list");
        into.outputs.reserve(*count);
        for (std::uint32_t k = 0; k < *count; ++k) {
          if (auto read = decode_output(reader, frames, into.outputs.emplace_back(), into.logprobs);
              !read) {
            return read;
          }
        }
        continue;
      }
      case 2:
        if (const auto entries = reader.map()) {
          SchedulerStats stats;
          auto take = [&](std::string_view key) {
            std::int64_t* slot = key == "num_running_reqs"   ? &stats.running
                                 : key == "num_waiting_reqs" ? &stats.waiting
                                                             : nullptr;
            if (slot == nullptr) return false;
            const auto value = reader.int64();
            *slot = value.value_or(0);
            return value.has_value();
          };
          if (!read_map(reader, *entries, take)) return fail(reader.error());
          into.scheduler_stats = stats;
          continue;
        }
        break;
      case 4: {
        // A utility reply: rare and small, so decoded as a tree.
        if (reader.nil()) continue;
        const auto bytes = reader.raw();
        if (!bytes) return fail(reader.error());
        auto handle = wire::decode(*bytes, limits);
        if (!handle) return fail(handle.error());
        auto reply = decode_utility_output(handle->get());
        if (!reply) return fail(reply.error());
        into.utility_output = std::move(*reply);
        continue;
      }
      case 5:
        if (const auto count = reader.array()) {
          for (std::uint32_t k = 0; k < *count; ++k) {
            const auto id = reader.str();
            if (!id) return fail("finished_requests holds a non-string");
            into.finished_requests.push_back(*id);
          }
          continue;
        }
        break;
      case 6:
        if ((into.wave_complete = reader.int64())) continue;
        break;
      case 7:
        if ((into.start_wave = reader.int64())) continue;
        break;
      default: break;
    }
    if (!reader.skip()) return fail(reader.error());
  }
  return {};
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

std::int64_t ArrayView::integer(std::size_t i) const {
  return dtype == Dtype::kInt64 ? load<std::int64_t>(data, i, big_endian)
                                : load<std::int32_t>(data, i, big_endian);
}

double ArrayView::real(std::size_t i) const {
  return dtype == Dtype::kFloat32 ? load<float>(data, i, big_endian)
                                  : static_cast<double>(integer(i));
}

tl::expected<void, std::string> decode_outputs(std::span<const std::string_view> frames,
                                               DecodedOutputs& into, const DecodeLimits& limits) {
  into.engine_index = 0;
  into.outputs.clear();
  into.logprobs.clear();
  into.scheduler_stats.reset();
  into.utility_output.reset();
  into.finished_requests.clear();
  into.wave_complete.reset();
  into.start_wave.reset();
  if (frames.empty()) return fail("an outputs message without frames");
  MsgpackReader reader(frames[0], limits);
  auto decoded = decode_message(reader, frames, limits, into);
  // Malformed bytes explain a failure better than the field that tripped on them.
  if (reader.failed()) return fail(reader.error());
  if (!decoded) return decoded;
  if (!reader.done()) return fail("trailing bytes after the msgpack value");
  // The logprobs no longer move: point each output at its own, in the order they were read.
  auto next = into.logprobs.begin();
  for (OutputView& output : into.outputs) {
    if (output.logprobs == &kPending) output.logprobs = &*next++;
    if (output.prompt_logprobs == &kPending) output.prompt_logprobs = &*next++;
  }
  return {};
}

tl::expected<DecodedOutputs, std::string> decode_outputs(std::span<const std::string_view> frames,
                                                         const DecodeLimits& limits) {
  DecodedOutputs decoded;
  if (auto done = decode_outputs(frames, decoded, limits); !done) return fail(done.error());
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
