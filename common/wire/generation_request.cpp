#include "common/wire/generation_request.hpp"

#include <array>
#include <charconv>

#include "common/util/fail.hpp"

namespace vllmd::wire {

namespace {

using util::fail;
using F = RequestField;

// vLLM's EngineCoreRequest since prompt_is_token_ids was inserted at index 10, ahead of
// client_index (spring 2026). Fields 0-8 have no default and are always sent.
constexpr std::array kLayout2026{F::kRequestId,
                                 F::kPromptTokenIds,
                                 F::kMmFeatures,
                                 F::kSamplingParams,
                                 F::kPoolingParams,
                                 F::kArrivalTime,
                                 F::kLoraRequest,
                                 F::kCacheSalt,
                                 F::kDataParallelRank,
                                 F::kPromptEmbeds,
                                 F::kPromptIsTokenIds,
                                 F::kClientIndex,
                                 F::kCurrentWave,
                                 F::kPriority,
                                 F::kTraceHeaders,
                                 F::kResumable,
                                 F::kExternalReqId,
                                 F::kReasoningEnded,
                                 F::kReasoningParserKwargs,
                                 F::kAbortImmediately,
                                 F::kSessionId};
// Before it: prompt_embeds (v0.11, PR #24278) directly followed by client_index. Fields that
// were appended later are harmless to older engines (msgspec ignores extra trailing fields).
constexpr std::array kLayout2025{
    F::kRequestId,        F::kPromptTokenIds,        F::kMmFeatures,       F::kSamplingParams,
    F::kPoolingParams,    F::kArrivalTime,           F::kLoraRequest,      F::kCacheSalt,
    F::kDataParallelRank, F::kPromptEmbeds,          F::kClientIndex,      F::kCurrentWave,
    F::kPriority,         F::kTraceHeaders,          F::kResumable,        F::kExternalReqId,
    F::kReasoningEnded,   F::kReasoningParserKwargs, F::kAbortImmediately, F::kSessionId};

constexpr std::array kLayouts{
    RequestLayout{"2026", ">= 0.20, and engines that register no version", kLayout2026},
    RequestLayout{"2025", "0.11 to 0.19", kLayout2025},
};
// The first version with prompt_is_token_ids at index 10 (inferred: docs/engine-protocol.md §8.2).
constexpr std::array kFirst2026Version{0, 20};

void pack_int_list(Packer& packer, const std::vector<std::int64_t>& values) {
  packer.pack_array(static_cast<std::uint32_t>(values.size()));
  for (std::int64_t value : values) packer.pack_int64(value);
}

// Writes the map's entries (key, value) in one order: vLLM's Rust client's field order, where a
// key it lacks sits beside its neighbours in Python's SamplingParams. A map is order-free to the
// engine; a fixed order keeps the bytes comparable with the test vectors.
template <typename Entry> void for_each_entry(const SamplingParams& p, Entry&& entry) {
  auto number = [&](std::string_view key, const auto& value) {
    if (value)
      entry(key, [&](Packer& packer, StringBuffer& buffer) {
        if constexpr (std::is_same_v<std::decay_t<decltype(*value)>, double>) {
          pack_float64(buffer, *value);
        } else {
          packer.pack_int64(*value);
        }
      });
  };
  auto list = [&](std::string_view key, const std::optional<std::vector<std::int64_t>>& value) {
    if (value) entry(key, [&](Packer& packer, StringBuffer&) { pack_int_list(packer, *value); });
  };
  auto flag = [&](std::string_view key, const std::optional<bool>& value) {
    if (value)
      entry(key, [&](Packer& packer, StringBuffer&) {
        if (*value)
          packer.pack_true();
        else
          packer.pack_false();
      });
  };
  auto raw = [&](std::string_view key, std::string_view msgpack) {
    entry(key,
          [&](Packer&, StringBuffer& buffer) { buffer.write(msgpack.data(), msgpack.size()); });
  };
  number("temperature", p.temperature);
  number("top_p", p.top_p);
  number("top_k", p.top_k);
  number("seed", p.seed);
  number("max_tokens", p.max_tokens);
  number("min_tokens", p.min_tokens);
  number("logprobs", p.logprobs);
  number("prompt_logprobs", p.prompt_logprobs);
  number("min_p", p.min_p);
  number("frequency_penalty", p.frequency_penalty);
  number("presence_penalty", p.presence_penalty);
  number("repetition_penalty", p.repetition_penalty);
  list("stop_token_ids", p.stop_token_ids);
  flag("ignore_eos", p.ignore_eos);
  number("_eos_token_id", p.eos_token_id);
  list("_all_stop_token_ids", p.all_stop_token_ids);
  flag("skip_reading_prefix_cache", p.skip_reading_prefix_cache);
  if (!p.extra_args_msgpack.empty()) raw("extra_args", p.extra_args_msgpack);
  for (const auto& [key, value] : p.other) raw(key, value);
}

void write_sampling_params(Packer& packer, StringBuffer& buffer, const SamplingParams& params) {
  std::uint32_t count = 0;
  for_each_entry(params, [&](std::string_view, auto&&) { ++count; });
  packer.pack_map(count);
  for_each_entry(params, [&](std::string_view key, auto&& write_value) {
    pack_str(packer, key);
    write_value(packer, buffer);
  });
}

// Whether the field holds something other than its default: the array is cut after the last
// field that does (fields 0-8 are always written).
bool is_set(const EngineCoreRequest& r, RequestField field) {
  switch (field) {
    case F::kClientIndex: return r.client_index != 0;
    case F::kCurrentWave: return r.current_wave != 0;
    case F::kPriority: return r.priority != 0;
    case F::kTraceHeaders: return !r.trace_headers.empty();
    case F::kExternalReqId: return r.external_req_id.has_value();
    case F::kSessionId: return r.session_id.has_value();
    default: return false;
  }
}

void write_field(Packer& packer, StringBuffer& buffer, const EngineCoreRequest& r,
                 RequestField field) {
  auto optional_str = [&](const std::optional<std::string>& value) {
    if (value)
      pack_str(packer, *value);
    else
      packer.pack_nil();
  };
  switch (field) {
    case F::kRequestId: pack_str(packer, r.request_id); break;
    case F::kPromptTokenIds: pack_int_list(packer, r.prompt_token_ids); break;
    case F::kSamplingParams:
      if (r.sampling_params)
        write_sampling_params(packer, buffer, *r.sampling_params);
      else
        packer.pack_nil();
      break;
    case F::kArrivalTime: pack_float64(buffer, r.arrival_time); break;
    case F::kCacheSalt: optional_str(r.cache_salt); break;
    case F::kDataParallelRank:
      if (r.data_parallel_rank)
        packer.pack_int64(*r.data_parallel_rank);
      else
        packer.pack_nil();
      break;
    case F::kClientIndex: packer.pack_int64(r.client_index); break;
    case F::kCurrentWave: packer.pack_int64(r.current_wave); break;
    case F::kPriority: packer.pack_int64(r.priority); break;
    case F::kTraceHeaders:
      if (r.trace_headers.empty()) {
        packer.pack_nil();
      } else {
        packer.pack_map(static_cast<std::uint32_t>(r.trace_headers.size()));
        for (const auto& [key, value] : r.trace_headers) {
          pack_str(packer, key);
          pack_str(packer, value);
        }
      }
      break;
    case F::kResumable:
    case F::kAbortImmediately: packer.pack_false(); break;
    case F::kExternalReqId: optional_str(r.external_req_id); break;
    case F::kSessionId: optional_str(r.session_id); break;
    default: packer.pack_nil(); break;  // multimodal, pooling, LoRA, embeddings, reasoning
  }
}

std::optional<std::vector<std::int64_t>> int_list(const msgpack::object& object) {
  if (object.type != msgpack::type::ARRAY) return std::nullopt;
  std::vector<std::int64_t> values;
  values.reserve(object.via.array.size);
  for (std::uint32_t i = 0; i < object.via.array.size; ++i) {
    auto value = as_int64(object.via.array.ptr[i]);
    if (!value) return std::nullopt;
    values.push_back(*value);
  }
  return values;
}

std::string bad_key(std::string_view key) {
  std::string text = "sampling_params.";
  text.append(key).append(" has the wrong type");
  return text;
}

tl::expected<void, std::string> read_sampling_key(SamplingParams& p, std::string_view key,
                                                  const msgpack::object& value) {
  auto number = [&](std::optional<double>& field) -> tl::expected<void, std::string> {
    auto parsed = as_double(value);
    if (!parsed) return fail(bad_key(key));
    field = *parsed;
    return {};
  };
  auto integer = [&](std::optional<std::int64_t>& field) -> tl::expected<void, std::string> {
    if (is_nil(value)) return {};
    auto parsed = as_int64(value);
    if (!parsed) return fail(bad_key(key));
    field = *parsed;
    return {};
  };
  auto list =
      [&](std::optional<std::vector<std::int64_t>>& field) -> tl::expected<void, std::string> {
    if (is_nil(value)) return {};
    auto parsed = int_list(value);
    if (!parsed) return fail(bad_key(key));
    field = std::move(*parsed);
    return {};
  };
  auto flag = [&](std::optional<bool>& field) -> tl::expected<void, std::string> {
    if (is_nil(value)) return {};
    auto parsed = as_bool(value);
    if (!parsed) return fail(bad_key(key));
    field = *parsed;
    return {};
  };
  if (key == "temperature") return number(p.temperature);
  if (key == "top_p") return number(p.top_p);
  if (key == "top_k") return integer(p.top_k);
  if (key == "seed") return integer(p.seed);
  if (key == "max_tokens") return integer(p.max_tokens);
  if (key == "min_tokens") return integer(p.min_tokens);
  if (key == "logprobs") return integer(p.logprobs);
  if (key == "prompt_logprobs") return integer(p.prompt_logprobs);
  if (key == "min_p") return number(p.min_p);
  if (key == "frequency_penalty") return number(p.frequency_penalty);
  if (key == "presence_penalty") return number(p.presence_penalty);
  if (key == "repetition_penalty") return number(p.repetition_penalty);
  if (key == "stop_token_ids") return list(p.stop_token_ids);
  if (key == "ignore_eos") return flag(p.ignore_eos);
  if (key == "_eos_token_id") return integer(p.eos_token_id);
  if (key == "_all_stop_token_ids") return list(p.all_stop_token_ids);
  if (key == "skip_reading_prefix_cache") return flag(p.skip_reading_prefix_cache);
  if (key == "extra_args") {
    if (value.type != msgpack::type::MAP && !is_nil(value)) return fail(bad_key(key));
    if (!is_nil(value)) p.extra_args_msgpack = encode_object(value);
    return {};
  }
  p.other.emplace_back(std::string(key), encode_object(value));
  return {};
}

std::optional<std::string> optional_text(const msgpack::object& object) {
  auto text = as_str(object);
  return text ? std::optional<std::string>(std::string(*text)) : std::nullopt;
}

}  // namespace

std::span<const RequestLayout> request_layouts() { return kLayouts; }
const RequestLayout& newest_request_layout() { return kLayouts.front(); }

std::optional<std::vector<int>> parse_version(std::string_view version) {
  std::vector<int> parts;
  const char* at = version.data();
  const char* end = at + version.size();
  while (at < end) {
    int part = 0;
    auto [next, error] = std::from_chars(at, end, part);
    if (error != std::errc()) break;
    parts.push_back(part);
    at = next;
    if (at == end || *at != '.') break;
    ++at;
  }
  if (parts.empty()) return std::nullopt;
  return parts;
}

const RequestLayout& request_layout_for(const std::optional<std::string>& vllm_version) {
  if (!vllm_version) return newest_request_layout();
  auto parsed = parse_version(*vllm_version);
  if (!parsed) return newest_request_layout();
  parsed->resize(std::max<std::size_t>(parsed->size(), kFirst2026Version.size()), 0);
  const bool older = std::lexicographical_compare(
      parsed->begin(), parsed->end(), kFirst2026Version.begin(), kFirst2026Version.end());
  return older ? kLayouts[1] : kLayouts[0];
}

std::string encode_sampling_params(const SamplingParams& params) {
  StringBuffer buffer;
  Packer packer(buffer);
  write_sampling_params(packer, buffer, params);
  return buffer.take();
}

std::string encode_engine_core_request(const EngineCoreRequest& request,
                                       const RequestLayout& layout, bool every_field) {
  std::size_t count = every_field ? layout.fields.size() : 9;
  for (std::size_t i = count; i < layout.fields.size(); ++i) {
    if (is_set(request, layout.fields[i])) count = i + 1;
  }
  StringBuffer buffer;
  Packer packer(buffer);
  packer.pack_array(static_cast<std::uint32_t>(count));
  for (std::size_t i = 0; i < count; ++i) write_field(packer, buffer, request, layout.fields[i]);
  return buffer.take();
}

std::string encode_abort(std::span<const std::string> request_ids) {
  StringBuffer buffer;
  Packer packer(buffer);
  packer.pack_array(static_cast<std::uint32_t>(request_ids.size()));
  for (const std::string& id : request_ids) pack_str(packer, id);
  return buffer.take();
}

tl::expected<SamplingParams, std::string> decode_sampling_params(const msgpack::object& map) {
  if (map.type != msgpack::type::MAP) return fail("sampling_params is not a map");
  SamplingParams params;
  for (std::uint32_t i = 0; i < map.via.map.size; ++i) {
    auto key = as_str(map.via.map.ptr[i].key);
    if (!key) return fail("sampling_params has a key that is not a string");
    auto read = read_sampling_key(params, *key, map.via.map.ptr[i].val);
    if (!read) return fail(read.error());
  }
  return params;
}

tl::expected<EngineCoreRequest, std::string> decode_engine_core_request(
    std::string_view payload, const RequestLayout& layout, const DecodeLimits& limits) {
  auto handle = decode(payload, limits);
  if (!handle) return fail(handle.error());
  const msgpack::object& array = handle->get();
  if (array.type != msgpack::type::ARRAY || array.via.array.size < 9) {
    return fail("EngineCoreRequest is not an array of at least 9 fields");
  }
  EngineCoreRequest request;
  const std::size_t count = std::min<std::size_t>(array.via.array.size, layout.fields.size());
  for (std::size_t i = 0; i < count; ++i) {
    const msgpack::object& value = array.via.array.ptr[i];
    switch (layout.fields[i]) {
      case F::kRequestId: {
        auto id = as_str(value);
        if (!id) return fail("request_id is not a string");
        request.request_id = std::string(*id);
        break;
      }
      case F::kPromptTokenIds: {
        auto ids = int_list(value);
        if (!ids) return fail("prompt_token_ids is not a list of integers");
        request.prompt_token_ids = std::move(*ids);
        break;
      }
      case F::kSamplingParams:
        if (!is_nil(value)) {
          auto params = decode_sampling_params(value);
          if (!params) return fail(params.error());
          request.sampling_params = std::move(*params);
        }
        break;
      case F::kArrivalTime: request.arrival_time = as_double(value).value_or(0.0); break;
      case F::kCacheSalt: request.cache_salt = optional_text(value); break;
      case F::kDataParallelRank: request.data_parallel_rank = as_int64(value); break;
      case F::kClientIndex: request.client_index = as_int64(value).value_or(0); break;
      case F::kCurrentWave: request.current_wave = as_int64(value).value_or(0); break;
      case F::kPriority: request.priority = as_int64(value).value_or(0); break;
      case F::kTraceHeaders:
        if (value.type == msgpack::type::MAP) {
          for (std::uint32_t j = 0; j < value.via.map.size; ++j) {
            auto key = as_str(value.via.map.ptr[j].key);
            auto text = as_str(value.via.map.ptr[j].val);
            if (key && text) request.trace_headers.emplace_back(*key, *text);
          }
        }
        break;
      case F::kExternalReqId: request.external_req_id = optional_text(value); break;
      case F::kSessionId: request.session_id = optional_text(value); break;
      default: break;
    }
  }
  return request;
}

tl::expected<std::vector<std::string>, std::string> decode_abort(std::string_view payload,
                                                                 const DecodeLimits& limits) {
  auto handle = decode(payload, limits);
  if (!handle) return fail(handle.error());
  const msgpack::object& array = handle->get();
  if (array.type != msgpack::type::ARRAY) return fail("ABORT payload is not an array");
  std::vector<std::string> ids;
  ids.reserve(array.via.array.size);
  for (std::uint32_t i = 0; i < array.via.array.size; ++i) {
    auto id = as_str(array.via.array.ptr[i]);
    if (!id) return fail("ABORT payload holds something other than request ids");
    ids.emplace_back(*id);
  }
  return ids;
}

}  // namespace vllmd::wire
