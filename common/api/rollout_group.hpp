#pragma once
// The answer of a request with several choices: n > 1, or a batch of prompts on
// /v1/completions. vllmd fans it out into one engine request per choice, each a Rollout (as
// vLLM's Python frontend fans out child requests: the engines only see n = 1), and gathers
// them here. A stream's chunks go out as each choice's deltas come, each with its index, then
// one usage chunk and [DONE] once every choice has ended; a body waits for all of them. The
// first choice that fails, or a client that leaves, ends the whole answer and stops the rest.
// Everything here runs on the engine client's IO thread, but cancel() and append_engine_ids().

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/api/rollout.hpp"

namespace vllmd::api {

class RolloutGroup final : public InFlightAnswer {
 public:
  // `head`: the answer's setup (its id and shape; the first prompt's ids for the generate
  // route's body). `n` choices per prompt, `choices` in all.
  RolloutGroup(GenerationService& service, engine::EngineRequests& requests, RolloutSetup head,
               std::int64_t n, std::size_t choices, CallPtr call, Done done);

  // Each choice, in index order, before any is submitted.
  void add(const std::shared_ptr<Rollout>& choice);

  const std::string& request_id() const override { return head_.request_id; }
  void abort_with(AbortCause cause, std::vector<std::string>& engine_ids) override;
  void cancel() override;

  // From its choices.
  void begin_stream();
  bool streaming() const { return streaming_; }
  void choice_finished(ChoiceEnd end);
  // A choice failed, or the client left: the whole answer ends with this.
  void end(Response response);

 private:
  void answer();  // every choice ended well
  void finish(Response response);

  GenerationService& service_;
  engine::EngineRequests& requests_;
  const RolloutSetup head_;
  const std::int64_t n_;
  CallPtr call_;
  Done done_;
  std::vector<std::weak_ptr<Rollout>> choices_;  // fixed once submitted: read by any thread
  std::vector<std::string> engine_ids_;          // likewise
  std::vector<ChoiceEnd> finished_;              // by index
  std::vector<bool> has_finished_;               // likewise
  std::size_t left_;
  bool streaming_ = false;
  bool ended_ = false;
};

}  // namespace vllmd::api
