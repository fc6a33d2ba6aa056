#include "common/api/generate_request.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "common/api/request.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

namespace {

using Object = msgpack::object;

tl::unexpected<ApiError> bad(std::string_view param, std::string message) {
  return tl::unexpected(invalid_request(std::move(message), std::string(param)));
}

std::string number_text(double value) {
  std::string text = std::to_string(value);
  while (text.size() > 1 && text.back() == '0' && text[text.size() - 2] != '.') text.pop_back();
  return text;
}

// The sampling fields, each read with its own param name: "sampling_params.temperature" on
// /inference/v1/generate, where they sit in sampling_params, "temperature" on /v1/completions,
// where they sit at the top level.
class Sampling {
 public:
  Sampling(const Object& object, std::string_view prefix) : object_(object), prefix_(prefix) {}

  tl::expected<std::optional<double>, ApiError> number(std::string_view key) const {
    const Object* value = wire::find_value(object_, key);
    if (value == nullptr) return std::nullopt;
    auto number = wire::as_double(*value);
    if (!number || !std::isfinite(*number))
      return bad(param(key), param(key) + " must be a number");
    return number;
  }

  tl::expected<std::optional<std::int64_t>, ApiError> integer(std::string_view key) const {
    const Object* value = wire::find_value(object_, key);
    if (value == nullptr) return std::nullopt;
    if (value->type == msgpack::type::POSITIVE_INTEGER && !wire::as_int64(*value)) {
      return std::numeric_limits<std::int64_t>::max();  // huge: callers clamp or refuse it
    }
    auto integer = wire::as_int64(*value);
    if (!integer) return bad(param(key), param(key) + " must be an integer");
    return integer;
  }

  tl::expected<std::optional<bool>, ApiError> flag(std::string_view key) const {
    const Object* value = wire::find_value(object_, key);
    if (value == nullptr) return std::nullopt;
    auto flag = wire::as_bool(*value);
    if (!flag) return bad(param(key), param(key) + " must be a boolean");
    return flag;
  }

  tl::expected<std::optional<std::vector<std::int64_t>>, ApiError> ids(std::string_view key) const {
    const Object* value = wire::find_value(object_, key);
    if (value == nullptr) return std::nullopt;
    if (value->type != msgpack::type::ARRAY) {
      return bad(param(key), param(key) + " must be a list of token ids");
    }
    std::vector<std::int64_t> ids;
    for (std::uint32_t i = 0; i < value->via.array.size; ++i) {
      auto id = wire::as_int64(value->via.array.ptr[i]);
      if (!id || *id < 0) {
        return bad(param(key), param(key) + " must be a list of non-negative token ids");
      }
      ids.push_back(*id);
    }
    return ids;
  }

  const Object* raw(std::string_view key) const { return wire::find_value(object_, key); }
  std::string param(std::string_view key) const { return std::string(prefix_).append(key); }

 private:
  const Object& object_;
  std::string_view prefix_;
};

tl::expected<void, ApiError> in_range(const Sampling& in, std::string_view key,
                                      const std::optional<double>& value, double low, double high,
                                      bool low_open, std::string_view range) {
  if (!value) return {};
  const bool below = low_open ? *value <= low : *value < low;
  if (below || *value > high) {
    return bad(in.param(key), std::string(key) + " must be in " + std::string(range) + ", got " +
                                  number_text(*value) + ".");
  }
  return {};
}

tl::expected<void, ApiError> in_vocabulary(std::string_view param, std::string_view what,
                                           const std::vector<std::int64_t>& ids,
                                           const ModelInfo& model) {
  if (!model.vocab_size) return {};
  std::vector<std::int64_t> outside;
  for (std::int64_t id : ids) {
    if (id >= *model.vocab_size && outside.size() < 8) outside.push_back(id);
  }
  if (outside.empty()) return {};
  std::string list;
  for (std::int64_t id : outside) list += (list.empty() ? "" : ", ") + std::to_string(id);
  return bad(param,
             "token_id(s) [" + list + "] in " + std::string(what) +
                 " are out of vocabulary. Vocabulary size: " + std::to_string(*model.vocab_size));
}

// logprobs / prompt_logprobs: -1 (the whole vocabulary) or 0..max_logprobs.
tl::expected<void, ApiError> logprob_count(const Sampling& in, std::string_view key,
                                           const std::optional<std::int64_t>& value,
                                           const ModelInfo& model) {
  if (!value) return {};
  if (*value < -1) {
    return bad(in.param(key), std::string(key) + " must be non-negative or -1, got " +
                                  std::to_string(*value) + ".");
  }
  if (*value > model.max_logprobs) {
    return bad(in.param(key),
               "Requested " + std::string(key) + " of " + std::to_string(*value) +
                   ", which is greater than max allowed: " + std::to_string(model.max_logprobs));
  }
  return {};
}

tl::expected<void, ApiError> refuse_text_input(const Object& root, const Sampling& sampling) {
  constexpr std::string_view kNoTokenizer =
      "vllmd has no tokenizer: it takes and returns token ids only";
  if (const Object* stop = sampling.raw("stop")) {
    const bool empty = (stop->type == msgpack::type::ARRAY && stop->via.array.size == 0) ||
                       (stop->type == msgpack::type::STR && stop->via.str.size == 0);
    if (!empty) {
      return bad(sampling.param("stop"),
                 std::string(kNoTokenizer) + "; stop strings need one: use stop_token_ids");
    }
  }
  if (const Object* words = sampling.raw("bad_words")) {
    if (words->type != msgpack::type::ARRAY || words->via.array.size != 0) {
      return bad(sampling.param("bad_words"), std::string(kNoTokenizer) + "; bad_words need one");
    }
  }
  for (std::string_view key : {"features", "content_parts", "multi_modal_data"}) {
    if (wire::find_value(root, key) != nullptr) {
      return bad(key, std::string(kNoTokenizer) + "; multimodal input is not supported");
    }
  }
  if (const Object* mode = wire::find_value(root, "output_mode")) {
    if (wire::as_str(*mode) != "tokens") {
      return bad("output_mode", std::string(kNoTokenizer) + "; output_mode must be \"tokens\"");
    }
  }
  return {};
}

// The merged extra_args map: vllm_xargs, then kv_transfer_params and ec_transfer_params.
std::string extra_args(const Object& root, const Object& sampling) {
  std::vector<std::pair<std::string_view, const Object*>> entries;
  if (const Object* xargs = wire::find_value(sampling, "vllm_xargs");
      xargs != nullptr && xargs->type == msgpack::type::MAP) {
    for (std::uint32_t i = 0; i < xargs->via.map.size; ++i) {
      if (auto key = wire::as_str(xargs->via.map.ptr[i].key)) {
        entries.emplace_back(*key, &xargs->via.map.ptr[i].val);
      }
    }
  }
  for (std::string_view key : {"kv_transfer_params", "ec_transfer_params"}) {
    if (const Object* value = wire::find_value(root, key)) entries.emplace_back(key, value);
  }
  if (entries.empty()) return {};
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  packer.pack_map(static_cast<std::uint32_t>(entries.size()));
  for (const auto& [key, value] : entries) {
    wire::pack_str(packer, key);
    const std::string bytes = wire::encode_object(*value);
    buffer.write(bytes.data(), bytes.size());
  }
  return buffer.take();
}

// The request's own fields, validated (ranges, types), before anything is lowered.
tl::expected<void, ApiError> read_sampling(const Sampling& in, const ModelInfo& model,
                                           GenerateRequest& out) {
  wire::SamplingParams& p = out.sampling;
  auto temperature = in.number("temperature");
  auto top_p = in.number("top_p");
  auto min_p = in.number("min_p");
  auto frequency = in.number("frequency_penalty");
  auto presence = in.number("presence_penalty");
  auto repetition = in.number("repetition_penalty");
  for (auto* result : {&temperature, &top_p, &min_p, &frequency, &presence, &repetition}) {
    if (!result->has_value()) return tl::unexpected(result->error());
  }
  if (auto ok = in_range(in, "temperature", *temperature, 0, 2, false, "[0, 2]"); !ok) return ok;
  if (auto ok = in_range(in, "top_p", *top_p, 0, 1, true, "(0, 1]"); !ok) return ok;
  if (auto ok = in_range(in, "min_p", *min_p, 0, 1, false, "[0, 1]"); !ok) return ok;
  if (auto ok = in_range(in, "frequency_penalty", *frequency, -2, 2, false, "[-2, 2]"); !ok)
    return ok;
  if (auto ok = in_range(in, "presence_penalty", *presence, -2, 2, false, "[-2, 2]"); !ok)
    return ok;
  if (*repetition && **repetition <= 0) {
    return bad(
        in.param("repetition_penalty"),
        "repetition_penalty must be greater than zero, got " + number_text(**repetition) + ".");
  }
  p.temperature = temperature->has_value() ? *temperature : model.temperature;
  p.top_p = top_p->has_value() ? *top_p : model.top_p;
  p.min_p = min_p->has_value() ? *min_p : model.min_p;
  p.repetition_penalty = repetition->has_value() ? *repetition : model.repetition_penalty;
  p.frequency_penalty = *frequency;
  p.presence_penalty = *presence;

  auto n = in.integer("n");
  if (!n) return tl::unexpected(n.error());
  if (*n && **n < 1)
    return bad(in.param("n"), "n must be at least 1, got " + std::to_string(**n) + ".");
  if (*n && **n > kMaxChoicesPerPrompt) {
    return bad(in.param("n"), "n must be at most " + std::to_string(kMaxChoicesPerPrompt) +
                                  " (vllmd's limit of choices per prompt), got " +
                                  std::to_string(**n) + ".");
  }
  // The engine gets n = 1: vllmd fans a request out into n, as vLLM's Python frontend does.
  if (*n) out.n = **n;
  auto top_k = in.integer("top_k");
  if (!top_k) return tl::unexpected(top_k.error());
  if (*top_k && **top_k < -1) {
    return bad(in.param("top_k"),
               "top_k must be -1 (disable), or at least 1, got " + std::to_string(**top_k) + ".");
  }
  // -1, 0 and anything the vocabulary cannot reach all mean "every token": vLLM's 0.
  const auto reaches = [&](std::int64_t k) {
    return k > 0 && k < std::min<std::int64_t>(model.vocab_size.value_or(std::int64_t{1} << 31),
                                               std::int64_t{1} << 31);
  };
  if (*top_k) {
    if (reaches(**top_k)) p.top_k = **top_k;
  } else if (model.top_k && reaches(*model.top_k)) {
    p.top_k = model.top_k;
  }
  auto seed = in.integer("seed");
  if (!seed) return tl::unexpected(seed.error());
  if (*seed && **seed != -1) p.seed = **seed;

  auto max_tokens = in.integer("max_tokens");
  auto min_tokens = in.integer("min_tokens");
  auto logprobs = in.integer("logprobs");
  auto prompt_logprobs = in.integer("prompt_logprobs");
  for (auto* result : {&max_tokens, &min_tokens, &logprobs, &prompt_logprobs}) {
    if (!result->has_value()) return tl::unexpected(result->error());
  }
  if (*max_tokens && **max_tokens < 1) {
    return bad(in.param("max_tokens"),
               "max_tokens must be at least 1, got " + std::to_string(**max_tokens) + ".");
  }
  if (*min_tokens && **min_tokens < 0) {
    return bad(in.param("min_tokens"),
               "min_tokens must be at least 0, got " + std::to_string(**min_tokens) + ".");
  }
  if (auto ok = logprob_count(in, "logprobs", *logprobs, model); !ok) return ok;
  if (auto ok = logprob_count(in, "prompt_logprobs", *prompt_logprobs, model); !ok) return ok;
  p.max_tokens = *max_tokens;
  p.min_tokens = *min_tokens;
  out.logprobs = *logprobs;
  out.prompt_logprobs = *prompt_logprobs;
  p.logprobs = *logprobs;
  p.prompt_logprobs = *prompt_logprobs;

  auto stop_ids = in.ids("stop_token_ids");
  if (!stop_ids) return tl::unexpected(stop_ids.error());
  if (*stop_ids) {
    if (auto ok = in_vocabulary(in.param("stop_token_ids"), "stop_token_ids", **stop_ids, model);
        !ok) {
      return ok;
    }
  }
  p.stop_token_ids = stop_ids->value_or(std::vector<std::int64_t>{});
  auto allowed = in.ids("allowed_token_ids");
  if (!allowed) return tl::unexpected(allowed.error());
  if (*allowed) {
    if (auto ok =
            in_vocabulary(in.param("allowed_token_ids"), "allowed_token_ids", **allowed, model);
        !ok) {
      return ok;
    }
    p.other.emplace_back("allowed_token_ids", wire::encode_object(*in.raw("allowed_token_ids")));
  }
  auto ignore_eos = in.flag("ignore_eos");
  if (!ignore_eos) return tl::unexpected(ignore_eos.error());
  if (*ignore_eos && **ignore_eos) p.ignore_eos = true;
  return {};
}

// lower_sampling_params: max_tokens against the context, EOS and the stop sets.
tl::expected<void, ApiError> lower(const Sampling& in, const ModelInfo& model,
                                   std::string_view prompt_param, GenerateRequest& out) {
  wire::SamplingParams& p = out.sampling;
  const auto prompt = static_cast<std::int64_t>(out.token_ids.size());
  if (model.max_model_len) {
    if (prompt >= *model.max_model_len) {
      return bad(prompt_param, "this model's maximum context length is " +
                                   std::to_string(*model.max_model_len) +
                                   " tokens, but the prompt contains " + std::to_string(prompt) +
                                   " input tokens");
    }
    const std::int64_t room = *model.max_model_len - prompt;
    p.max_tokens = std::min(p.max_tokens.value_or(model.max_new_tokens.value_or(room)), room);
  } else if (!p.max_tokens && model.max_new_tokens) {
    p.max_tokens = model.max_new_tokens;
  }
  if (p.min_tokens && p.max_tokens && *p.min_tokens > *p.max_tokens) {
    return bad(in.param("min_tokens"), "min_tokens must be less than or equal to max_tokens=" +
                                           std::to_string(*p.max_tokens) + ", got " +
                                           std::to_string(*p.min_tokens) + ".");
  }
  std::set<std::int64_t> all_stops(p.stop_token_ids->begin(), p.stop_token_ids->end());
  if (!p.ignore_eos) {
    p.eos_token_id = model.eos_token_id;
    for (std::int64_t id : model.extra_eos_token_ids) {
      if (std::find(p.stop_token_ids->begin(), p.stop_token_ids->end(), id) ==
          p.stop_token_ids->end()) {
        p.stop_token_ids->push_back(id);
      }
    }
  }
  // min_tokens masks every stop and EOS id, ignore_eos or not (as vLLM's Rust client sets it).
  if (model.eos_token_id) all_stops.insert(*model.eos_token_id);
  all_stops.insert(model.extra_eos_token_ids.begin(), model.extra_eos_token_ids.end());
  p.all_stop_token_ids = std::vector<std::int64_t>(all_stops.begin(), all_stops.end());
  // Python's frontend reads no prefix cache for prompt logprobs: cached positions have none.
  if (out.prompt_logprobs) p.skip_reading_prefix_cache = true;
  return {};
}

tl::expected<void, ApiError> read_model(const Object& root, const ModelInfo& model) {
  if (const Object* name = wire::find_value(root, "model")) {
    auto text = wire::as_str(*name);
    if (!text) return bad("model", "model must be a string");
    if (*text != model.name) {
      ApiError error = invalid_request("The model `" + std::string(*text) + "` does not exist.",
                                       std::string("model"));
      error.status = 404;
      error.type = "NotFoundError";
      error.code = "model_not_found";
      return tl::unexpected(error);
    }
  }
  return {};
}

// The prompt's token ids, a non-empty list (`param` names it in errors).
tl::expected<void, ApiError> read_prompt(const Object& ids, std::string_view param,
                                         const ModelInfo& model, GenerateRequest& out) {
  const std::string name(param);
  if (ids.type != msgpack::type::ARRAY) return bad(param, name + " must be a list of token ids");
  if (ids.via.array.size == 0) return bad(param, name + " must contain at least one token ID.");
  out.token_ids.reserve(ids.via.array.size);
  for (std::uint32_t i = 0; i < ids.via.array.size; ++i) {
    auto id = wire::as_int64(ids.via.array.ptr[i]);
    if (!id) return bad(param, name + " must be a list of integers");
    if (*id < 0) return bad(param, name + " must not contain negative values");
    out.token_ids.push_back(*id);
  }
  return in_vocabulary(param, "prompt", out.token_ids, model);
}

// stream, stream_options, request_id, cache_salt, priority: the same on both routes.
tl::expected<void, ApiError> read_options(const Object& root, GenerateRequest& out) {
  if (const Object* stream = wire::find_value(root, "stream")) {
    auto flag = wire::as_bool(*stream);
    if (!flag) return bad("stream", "stream must be a boolean");
    out.stream = *flag;
  }
  if (const Object* options = wire::find_value(root, "stream_options")) {
    if (!out.stream) {
      return bad("stream_options", "stream_options are only supported when stream=true.");
    }
    if (options->type != msgpack::type::MAP) {
      return bad("stream_options", "stream_options must be a JSON object");
    }
    for (auto [key, field] : {std::pair{"include_usage", &out.include_usage},
                              std::pair{"continuous_usage_stats", &out.continuous_usage_stats}}) {
      if (const Object* value = wire::find_value(*options, key)) {
        auto flag = wire::as_bool(*value);
        if (!flag)
          return bad(std::string("stream_options.") + key, std::string(key) + " must be a boolean");
        *field = *flag;
      }
    }
    if (out.continuous_usage_stats && !out.include_usage) {
      return bad("stream_options.continuous_usage_stats",
                 "continuous_usage_stats needs include_usage");
    }
  }
  if (const Object* id = wire::find_value(root, "request_id")) {
    auto text = wire::as_str(*id);
    if (!text || text->empty()) return bad("request_id", "request_id must be a non-empty string");
    out.request_id = std::string(*text);
  }
  if (const Object* salt = wire::find_value(root, "cache_salt")) {
    auto text = wire::as_str(*salt);
    if (!text || text->empty() || text->size() > 1024) {
      return bad("cache_salt", "cache_salt must be a string of 1 to 1024 characters");
    }
    out.cache_salt = std::string(*text);
  }
  if (const Object* priority = wire::find_value(root, "priority")) {
    auto value = wire::as_int64(*priority);
    if (!value) return bad("priority", "priority must be an integer");
    out.priority = *value;
  }
  return {};
}

// The body as one msgpack object, handed to `read` (a 400 when it is no JSON object).
template <typename Read> auto read_body(std::string_view body, Read&& read)
    -> decltype(read(std::declval<Object>())) {
  auto transcoded = parse_object_body(body);
  if (!transcoded) return tl::unexpected(transcoded.error());
  auto handle = wire::decode(transcoded->msgpack.view());
  if (!handle) return tl::unexpected(json_parse_error("Invalid JSON body: " + handle.error()));
  return read(handle->get());
}

tl::expected<GenerateRequest, ApiError> read_generate(const Object& root, const ModelInfo& model) {
  GenerateRequest request;
  if (auto ok = read_model(root, model); !ok) return tl::unexpected(ok.error());
  const Object* ids = wire::find_value(root, "token_ids");
  if (ids == nullptr) return bad("token_ids", "token_ids is required");
  if (auto ok = read_prompt(*ids, "token_ids", model, request); !ok) {
    return tl::unexpected(ok.error());
  }
  if (auto ok = read_options(root, request); !ok) return tl::unexpected(ok.error());
  const Object* sampling = wire::find_value(root, "sampling_params");
  if (sampling == nullptr) return bad("sampling_params", "sampling_params is required");
  if (sampling->type != msgpack::type::MAP) {
    return bad("sampling_params", "sampling_params must be a JSON object");
  }
  const Sampling in(*sampling, "sampling_params.");
  if (auto ok = refuse_text_input(root, in); !ok) return tl::unexpected(ok.error());
  if (request.stream && wire::find_value(*sampling, "prompt_logprobs") != nullptr) {
    return bad("sampling_params.prompt_logprobs",
               "`prompt_logprobs` are not available when `stream=true`.");
  }
  if (auto ok = read_sampling(in, model, request); !ok) return tl::unexpected(ok.error());
  if (auto ok = lower(in, model, "token_ids", request); !ok) return tl::unexpected(ok.error());
  request.sampling.extra_args_msgpack = extra_args(root, *sampling);
  return request;
}

tl::expected<CompletionRequest, ApiError> read_completion(const Object& root,
                                                          const ModelInfo& model) {
  CompletionRequest completion;
  GenerateRequest request;  // the sampling all prompts share
  if (auto ok = read_model(root, model); !ok) return tl::unexpected(ok.error());
  constexpr std::string_view kNoTokenizer =
      "vllmd has no tokenizer: it takes and returns token ids only";
  const Object* prompt = wire::find_value(root, "prompt");
  if (prompt == nullptr || (prompt->type == msgpack::type::ARRAY && prompt->via.array.size == 0)) {
    return bad("prompt", "Either prompt or prompt_embeds must be provided and non-empty.");
  }
  if (prompt->type == msgpack::type::STR || (prompt->type == msgpack::type::ARRAY &&
                                             prompt->via.array.ptr[0].type == msgpack::type::STR)) {
    return bad("prompt", std::string(kNoTokenizer) + ": the prompt must be a list of token ids");
  }
  // A list of lists is a batch, answered in prompt order.
  std::vector<const Object*> prompts{prompt};
  if (prompt->type == msgpack::type::ARRAY &&
      prompt->via.array.ptr[0].type == msgpack::type::ARRAY) {
    prompts.clear();
    for (std::uint32_t i = 0; i < prompt->via.array.size; ++i) {
      prompts.push_back(&prompt->via.array.ptr[i]);
    }
  }
  if (auto ok = read_options(root, request); !ok) return tl::unexpected(ok.error());
  // What only a tokenizer, beam search or a grammar engine can do.
  const std::pair<std::string_view, std::string_view> refused[] = {
      {"echo", "echo needs the prompt as text"},
      {"suffix", "suffix is text"},
      {"use_beam_search", "beam search is not supported"},
      {"response_format", "structured outputs are not supported"},
      {"structured_outputs", "structured outputs are not supported"},
  };
  for (const auto& [key, why] : refused) {
    const Object* value = wire::find_value(root, key);
    const bool off =
        value == nullptr || (value->type == msgpack::type::BOOLEAN && !value->via.boolean);
    if (!off) return bad(key, std::string(kNoTokenizer) + "; " + std::string(why));
  }
  // Tokens are "token_id:N" placeholders whether or not return_tokens_as_token_ids asks:
  // there is nothing else to print without a tokenizer.
  bool as_token_ids = false;
  for (auto [key, field] : {std::pair{"return_token_ids", &completion.return_token_ids},
                            std::pair{"return_tokens_as_token_ids", &as_token_ids}}) {
    if (const Object* value = wire::find_value(root, key)) {
      auto flag = wire::as_bool(*value);
      if (!flag) return bad(key, std::string(key) + " must be a boolean");
      *field = *flag;
    }
  }
  const Sampling in(root, "");
  if (auto ok = refuse_text_input(root, in); !ok) return tl::unexpected(ok.error());
  if (request.stream && wire::find_value(root, "prompt_logprobs") != nullptr) {
    return bad("prompt_logprobs", "`prompt_logprobs` are not available when `stream=true`.");
  }
  if (auto ok = read_sampling(in, model, request); !ok) return tl::unexpected(ok.error());
  request.sampling.extra_args_msgpack = extra_args(root, root);
  const auto choices = static_cast<std::int64_t>(prompts.size()) * request.n;
  if (choices > kMaxChoicesPerRequest) {
    return bad("prompt", "a request may ask for at most " + std::to_string(kMaxChoicesPerRequest) +
                             " choices (prompts x n), got " + std::to_string(choices));
  }
  completion.prompts.reserve(prompts.size());
  for (const Object* ids : prompts) {
    GenerateRequest& one = completion.prompts.emplace_back(request);
    if (auto ok = read_prompt(*ids, "prompt", model, one); !ok) return tl::unexpected(ok.error());
    if (auto ok = lower(in, model, "prompt", one); !ok) return tl::unexpected(ok.error());
  }
  return completion;
}

}  // namespace

tl::expected<GenerateRequest, ApiError> parse_generate_request(std::string_view body,
                                                               const ModelInfo& model) {
  return read_body(body, [&](const Object& root) { return read_generate(root, model); });
}

tl::expected<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   const ModelInfo& model) {
  return read_body(body, [&](const Object& root) { return read_completion(root, model); });
}

}  // namespace vllmd::api
