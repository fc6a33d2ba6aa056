#pragma once
// Token generation: POST /inference/v1/generate and POST /abort_requests (docs/http-api.md).
// A request is validated on the caller's thread (a 400 reaches no engine), then handed to the
// engines as one ADD; from there on it lives on the engine client's IO thread as a Rollout
// (generation.cpp), which renders each engine step's delta into the answer: one JSON body at
// the end, or one SSE event per step. Nothing here blocks, and there is no thread or lock per
// token: the only lock guards the table of requests in flight, taken when one starts or ends.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/api/call.hpp"
#include "common/api/committed_version.hpp"
#include "common/api/generate_request.hpp"
#include "common/engine/engine_calls.hpp"
#include "common/engine/engine_requests.hpp"

namespace vllmd::api {

struct GenerationOptions {
  // A stream whose client reads too slowly is cut once this much waits for it (unsent bytes
  // plus the deltas merged meanwhile): vllmd's memory per stream stays bounded.
  std::size_t stream_buffer_limit = std::size_t{8} << 20;
};

class InFlightAnswer;

class GenerationService {
 public:
  // `requests` and `engines` are the daemon's EngineClient (or fakes); both outlive the service.
  GenerationService(engine::EngineRequests& requests, const engine::EngineCalls& engines,
                    ModelInfo model, GenerationOptions options = {});
  ~GenerationService();
  GenerationService(const GenerationService&) = delete;
  GenerationService& operator=(const GenerationService&) = delete;

  // Where each generated token's weight version is read (it outlives the service).
  void label_tokens(const CommittedVersion* committed) { committed_ = committed; }

  // A Handling::kGenerate route's call.
  void handle(const CallPtr& call, const Done& done);
  void generate(const CallPtr& call, const Done& done);
  // POST /v1/completions with token ids: the same, answered in the completions shape.
  void complete(const CallPtr& call, const Done& done);
  void abort_requests(const CallPtr& call, const Done& done);

  // Ends every generation in flight as a pause with mode=abort would: with the tokens so far
  // and finish_reason "abort". For a stop. Returns how many there were.
  std::size_t abort_all();
  std::size_t in_flight() const;

  // Rollouts report their end here (IO thread).
  void finished(const std::string& request_id);

 private:
  // The model as requests see it now: --model's metadata and the engines' max_model_len.
  ModelInfo current_model() const;
  std::string fresh_id();
  // How a route names its requests and shapes its answers.
  struct Shape {
    std::string_view id_prefix;  // "generate-tokens-", "cmpl-"
    bool completion = false;
    bool return_token_ids = false;
  };
  // A parsed request on its way: ids, engine choice, one Rollout per choice (grouped when
  // there are several), the ADDs.
  void start(const CallPtr& call, const Done& done, std::vector<GenerateRequest> prompts,
             const Shape& shape, const ModelInfo& model,
             std::chrono::steady_clock::time_point started);
  // Aborts these requests (ids as clients know them); how many were in flight.
  std::size_t abort_known(const std::vector<std::string>& ids, AbortCause cause);

  engine::EngineRequests& requests_;
  const engine::EngineCalls& engines_;
  const ModelInfo model_;
  const GenerationOptions options_;
  const std::int64_t created_;  // Unix seconds, for the responses' "created"
  const std::uint64_t id_seed_;
  const CommittedVersion* committed_ = nullptr;
  std::atomic<std::uint64_t> id_counter_{0};

  mutable std::mutex mutex_;
  // By the request_id the response carries. The rollout's engine id is unique.
  std::unordered_map<std::string, std::shared_ptr<InFlightAnswer>> in_flight_;
};

}  // namespace vllmd::api
