#include "common/api/generation.hpp"

#include <chrono>
#include <random>

#include "common/api/request.hpp"
#include "common/api/rollout.hpp"
#include "common/api/rollout_group.hpp"
#include "common/api/service.hpp"
#include "common/util/log.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::api {

namespace {

// vLLM's Python frontend: the id the response carries (and /abort_requests takes).
constexpr std::string_view kIdPrefix = "generate-tokens-";
constexpr std::string_view kCompletionIdPrefix = "cmpl-";
constexpr std::size_t kMaxRequestIdBytes = 256;

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer: distinct inputs, spread bits
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string hex(std::uint64_t value, int digits) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(static_cast<std::size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i, value >>= 4) {
    text[static_cast<std::size_t>(i)] = kDigits[value & 15];
  }
  return text;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

tl::unexpected<ApiError> bad(std::string param, std::string message) {
  return tl::unexpected(invalid_request(std::move(message), std::move(param)));
}

// X-data-parallel-rank: a rank below the number of engines.
tl::expected<std::optional<int>, ApiError> pinned_rank(const Call& call, std::size_t engines) {
  if (!call.data_parallel_rank_header) return std::nullopt;
  const std::string& text = *call.data_parallel_rank_header;
  int rank = 0;
  bool digits = !text.empty() && text.size() <= 9;
  for (const char c : text) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) rank = rank * 10 + (c - '0');
  }
  if (!digits) return bad("X-data-parallel-rank", "X-data-parallel-rank must be an integer");
  if (static_cast<std::size_t>(rank) >= engines) {
    return bad("X-data-parallel-rank", "X-data-parallel-rank " + text + " is out of range: " +
                                           std::to_string(engines) + " engine(s)");
  }
  return rank;
}

// The ids of /abort_requests' body: none, or a list of strings.
tl::expected<std::vector<std::string>, ApiError> abort_ids(const Call& call) {
  std::vector<std::string> ids;
  if (!call.document) return ids;
  auto handle = wire::decode(call.document->msgpack.view());
  if (!handle) return tl::unexpected(json_parse_error("Invalid JSON format"));
  const msgpack::object* list = wire::find_value(handle->get(), "request_ids");
  if (list == nullptr || list->type == msgpack::type::NIL) return ids;
  if (list->type != msgpack::type::ARRAY) {
    return bad("request_ids", "request_ids must be a list of strings");
  }
  for (std::uint32_t i = 0; i < list->via.array.size; ++i) {
    auto id = wire::as_str(list->via.array.ptr[i]);
    if (!id) return bad("request_ids", "request_ids must be a list of strings");
    ids.emplace_back(*id);
  }
  return ids;
}

}  // namespace

GenerationService::GenerationService(engine::EngineRequests& requests,
                                     const engine::EngineCalls& engines, ModelInfo model,
                                     GenerationOptions options)
    : requests_(requests), engines_(engines), model_(std::move(model)), options_(options),
      created_(static_cast<std::int64_t>(unix_seconds())), id_seed_(std::random_device{}()) {}

GenerationService::~GenerationService() = default;

void GenerationService::handle(const CallPtr& call, const Done& done) {
  const Route& route = *call->route;
  if (route.operation != Operation::kGenerate && route.operation != Operation::kCompletions) {
    if (auto valid = validate_body(*call); !valid) return done(error_response(valid.error()));
  }
  (this->*route.generation_handler)(call, done);
}

ModelInfo GenerationService::current_model() const {
  ModelInfo model = model_;
  for (const engine::EngineStatus& engine : engines_.engines()) {
    if (const auto& length = engine.registration.max_model_len) {
      model.max_model_len = std::min(model.max_model_len.value_or(*length), *length);
    }
  }
  return model;
}

std::string GenerationService::fresh_id() {
  const std::uint64_t n = id_counter_.fetch_add(1);
  return hex(mix(id_seed_ ^ mix(n)), 16) + hex(mix(n ^ 0x5bd1e995ULL), 16);
}

void GenerationService::generate(const CallPtr& call, const Done& done) {
  const auto started = std::chrono::steady_clock::now();
  const ModelInfo model = current_model();
  auto parsed = parse_generate_request(call->body, model);
  std::string().swap(call->body);
  if (!parsed) return done(error_response(parsed.error()));
  std::vector<GenerateRequest> prompts;
  prompts.push_back(std::move(*parsed));
  start(call, done, std::move(prompts), {.id_prefix = kIdPrefix}, model, started);
}

void GenerationService::complete(const CallPtr& call, const Done& done) {
  const auto started = std::chrono::steady_clock::now();
  const ModelInfo model = current_model();
  auto parsed = parse_completion_request(call->body, model);
  std::string().swap(call->body);
  if (!parsed) return done(error_response(parsed.error()));
  start(call, done, std::move(parsed->prompts),
        {.id_prefix = kCompletionIdPrefix,
         .completion = true,
         .return_token_ids = parsed->return_token_ids},
        model, started);
}

void GenerationService::start(const CallPtr& call, const Done& done,
                              std::vector<GenerateRequest> prompts, const Shape& shape,
                              const ModelInfo& model,
                              std::chrono::steady_clock::time_point started) {
  const GenerateRequest& first = prompts.front();
  auto rank = pinned_rank(*call, engines_.engines().size());
  if (!rank) return done(error_response(rank.error()));

  std::string base;
  std::string id_param = "request_id";
  if (call->request_id_header) {
    base = *call->request_id_header;
    id_param = "X-Request-Id";
  } else if (first.request_id) {
    base = *first.request_id;
  } else {
    base = fresh_id();
  }
  if (base.empty() || base.size() > kMaxRequestIdBytes) {
    return done(error_response(invalid_request(
        id_param + " must be 1 to " + std::to_string(kMaxRequestIdBytes) + " bytes", id_param)));
  }
  if (call->session_header && call->session_header->size() > kMaxRequestIdBytes) {
    return done(error_response(invalid_request(
        "X-Session-ID must be at most " + std::to_string(kMaxRequestIdBytes) + " bytes",
        "X-Session-ID")));
  }
  RolloutSetup setup;
  setup.completion = shape.completion;
  setup.return_token_ids = shape.return_token_ids;
  setup.request_id = std::string(shape.id_prefix) + base;
  setup.model_name = model.name;
  setup.created = created_;
  setup.stream = first.stream;
  setup.include_usage = first.include_usage;
  setup.continuous_usage = first.continuous_usage_stats;
  setup.logprobs = first.logprobs;
  setup.prompt_logprobs = first.prompt_logprobs.has_value();
  setup.stream_buffer_limit = options_.stream_buffer_limit;
  setup.versions = committed_;
  setup.started = started;
  const std::int64_t n = first.n;
  const std::size_t choices = prompts.size() * static_cast<std::size_t>(n);

  std::shared_ptr<InFlightAnswer> answer;
  std::shared_ptr<RolloutGroup> group;
  if (choices > 1) {
    RolloutSetup head = setup;
    head.prompt_tokens = static_cast<std::int64_t>(first.token_ids.size());
    head.prompt_token_ids = first.token_ids;
    group =
        std::make_shared<RolloutGroup>(*this, requests_, std::move(head), n, choices, call, done);
    answer = group;
  }
  std::vector<engine::Generation> generations;
  generations.reserve(choices);
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    GenerateRequest& prompt = prompts[p];
    // vLLM's names: a completion's prompt i is "<id>-<i>", choice j of n > 1 "<j>_<that>".
    const std::string prompt_id =
        shape.completion ? setup.request_id + "-" + std::to_string(p) : setup.request_id;
    for (std::int64_t j = 0; j < n; ++j) {
      RolloutSetup choice = setup;
      const std::string external_id = n > 1 ? std::to_string(j) + "_" + prompt_id : prompt_id;
      choice.engine_id = external_id + "-" + hex(mix(id_seed_ + id_counter_.fetch_add(1)), 8);
      choice.index = static_cast<std::int64_t>(p) * n + j;
      choice.prompt_tokens = static_cast<std::int64_t>(prompt.token_ids.size());
      choice.prompt_token_ids = prompt.token_ids;
      choice.group = group;

      engine::Generation& generation = generations.emplace_back();
      wire::EngineCoreRequest& request = generation.request;
      request.request_id = choice.engine_id;
      request.prompt_token_ids = j + 1 < n ? prompt.token_ids : std::move(prompt.token_ids);
      request.sampling_params = prompt.sampling;
      // A seed gives each choice its own: seed + j, as vLLM's parallel sampling does.
      if (auto& seed = request.sampling_params->seed; seed && j > 0) {
        *seed = static_cast<std::int64_t>(static_cast<std::uint64_t>(*seed) +
                                          static_cast<std::uint64_t>(j));
      }
      request.arrival_time = unix_seconds();
      request.cache_salt = prompt.cache_salt;
      request.priority = prompt.priority;
      request.external_req_id = external_id;
      generation.rank = *rank;
      generation.session = call->session_header.value_or("");
      generation.follows_previous = j > 0;

      auto rollout = std::make_shared<Rollout>(*this, requests_, std::move(choice), call,
                                               group ? Done{} : done);
      if (group) group->add(rollout);
      if (!answer) answer = rollout;
      generation.sink = std::move(rollout);
    }
  }
  {
    std::lock_guard lock(mutex_);
    if (!in_flight_.emplace(answer->request_id(), answer).second) {
      return done(error_response(invalid_request(
          "request id " + answer->request_id() + " is already in flight", id_param)));
    }
  }
  // From here on a client that leaves stops the engines' work for it.
  call->stream->on_cancel([weak = std::weak_ptr<InFlightAnswer>(answer)] {
    if (auto alive = weak.lock()) alive->cancel();
  });
  if (generations.size() == 1) return requests_.generate(std::move(generations.front()));
  requests_.generate_all(std::move(generations));
}

void GenerationService::finished(const std::string& request_id) {
  std::lock_guard lock(mutex_);
  in_flight_.erase(request_id);
}

std::size_t GenerationService::abort_known(const std::vector<std::string>& ids, AbortCause cause) {
  std::vector<std::shared_ptr<InFlightAnswer>> found;
  {
    std::lock_guard lock(mutex_);
    if (ids.empty()) {
      for (const auto& [id, rollout] : in_flight_) found.push_back(rollout);
    }
    for (const std::string& id : ids) {
      // As the response carries it, or as the client sent it.
      auto entry = in_flight_.find(id);
      if (entry == in_flight_.end()) entry = in_flight_.find(std::string(kIdPrefix) + id);
      if (entry == in_flight_.end()) entry = in_flight_.find(std::string(kCompletionIdPrefix) + id);
      if (entry != in_flight_.end()) found.push_back(entry->second);
    }
  }
  std::vector<std::string> engine_ids;
  engine_ids.reserve(found.size());
  for (const auto& answer : found) answer->abort_with(cause, engine_ids);
  requests_.abort(std::move(engine_ids));
  return found.size();
}

void GenerationService::abort_requests(const CallPtr& call, const Done& done) {
  auto ids = abort_ids(*call);
  if (!ids) return done(error_response(ids.error()));
  const std::size_t aborted = abort_known(*ids, AbortCause::kAbortRequests);
  done(Response{200, R"({"status":"aborted","aborted":)" + std::to_string(aborted) + "}"});
}

std::size_t GenerationService::abort_all() {
  const std::size_t aborted = abort_known({}, AbortCause::kShutdown);
  if (aborted > 0) util::log::notice("aborting ", aborted, " generation(s) in flight");
  return aborted;
}

std::size_t GenerationService::in_flight() const {
  std::lock_guard lock(mutex_);
  return in_flight_.size();
}

}  // namespace vllmd::api
