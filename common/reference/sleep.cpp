// Sleep mode of ReferenceCore, as vLLM's EngineCore and executor implement it: a sleep pauses
// the scheduler and (level >= 1) puts the executor's memory to sleep under the CuMem tags
// "weights" and "kv_cache"; a wake removes tags and resumes the scheduler only once nothing
// sleeps any more (vllm#44395: a partial wake that resumed ran on released memory). Where
// vLLM warns and does nothing, so does this; a weight update while the weights sleep, which
// crashes vLLM's engine (vllm#57853), is refused.

#include <array>

#include "common/reference/core.hpp"
#include "common/util/fail.hpp"
#include "common/util/log.hpp"
#include "common/wire/msgpack_codec.hpp"

namespace vllmd::reference {

namespace {

using util::fail;

constexpr std::string_view kWeights = "weights";
constexpr std::string_view kKvCache = "kv_cache";

// The worker methods that touch the weights' memory.
constexpr std::array<std::string_view, 5> kWeightTransferMethods = {
    "init_weight_transfer_engine", "start_weight_update", "start_draft_weight_update",
    "update_weights", "finish_weight_update"};

}  // namespace

// abort (the default) aborts every request, wait drains the running ones (the reply waits
// for that), keep freezes them. The scheduler is paused in every mode.
void ReferenceCore::end_requests(const msgpack::object* mode) {
  const auto text = mode != nullptr ? wire::as_str(*mode) : std::nullopt;
  const PauseMode pause = !text || *text == "abort" ? PauseMode::kAbort
                          : *text == "wait"         ? PauseMode::kWait
                                                    : PauseMode::kKeep;
  scheduler_.pause(pause);
  reply_when_idle_ = pause == PauseMode::kWait && scheduler_.running() > 0;
}

void ReferenceCore::warn(std::string_view text) const {
  util::log::warning("reference engine dp", sizes_.data_parallel_rank, ": ", text);
}

std::optional<std::string> ReferenceCore::asleep_refusal(std::string_view worker_method) const {
  if (!weights_asleep_) return std::nullopt;
  for (std::string_view method : kWeightTransferMethods) {
    if (method != worker_method) continue;
    return "Cannot run " + std::string(worker_method) +
           " while the model weights are asleep (sleep level " + std::to_string(sleep_level_) +
           "); call wake_up(tags=['weights']) first";
  }
  return std::nullopt;
}

// EngineCore.sleep(level=1, mode="abort"): pause_scheduler(mode, clear_cache=level >= 1),
// then for level >= 1 the executor's sleep (level 1 offloads the weights, level 2 discards
// them; the KV cache is discarded either way).
ReferenceCore::Result ReferenceCore::sleep(const std::string& qualname, Positional args) {
  auto bound = bind_call(qualname, {{"level", false}, {"mode", false}}, args, nullptr);
  if (!bound) return fail(bound.error());
  const msgpack::object* level_arg = (*bound)[0];
  std::int64_t level = 1;
  if (level_arg != nullptr) {
    if (level_arg->type == msgpack::type::POSITIVE_INTEGER) {
      level = static_cast<std::int64_t>(level_arg->via.u64);
    } else if (level_arg->type == msgpack::type::NEGATIVE_INTEGER) {
      level = level_arg->via.i64;
    } else {
      return fail(type_error("sleep level", "an int", *level_arg));
    }
  }
  if (auto error = pause_mode_error((*bound)[1])) return fail(*error);
  end_requests((*bound)[1]);
  if (level < 1) return none_value();
  if (weights_asleep_ || kv_cache_asleep_) {
    warn("Executor is already sleeping.");
    return none_value();
  }
  weights_asleep_ = true;
  kv_cache_asleep_ = true;
  sleep_level_ = static_cast<int>(level);
  // Level 2 discards the weights: what the workers hold after waking is garbage until the
  // weights are sent again (vllm#29341), and their checksums say so.
  if (level >= 2) {
    for (WorkerState& worker : workers_) {
      for (auto& entry : worker.weights) entry.second.assign(entry.second.size(), '\0');
    }
    if (model_) model_->discard_weights();
  }
  return none_value();
}

// EngineCore.wake_up(tags=None) -> bool: the tags named (none: all) wake, unless one of them
// is not asleep (vLLM then warns and wakes nothing); "scheduling" only resumes. Returns
// whether the executor is fully awake, and resumes the scheduler only then.
ReferenceCore::Result ReferenceCore::wake_up(const std::string& qualname, Positional args) {
  auto bound = bind_call(qualname, {{"tags", false}}, args, nullptr);
  if (!bound) return fail(bound.error());
  const msgpack::object* tags_arg = (*bound)[0];
  const bool all = tags_arg == nullptr || wire::is_nil(*tags_arg);
  if (!all && tags_arg->type != msgpack::type::ARRAY) {
    return fail(type_error("wake_up tags", "a list or None", *tags_arg));
  }
  bool weights = all;
  bool kv_cache = all;
  std::vector<std::string> unknown;
  bool any = all;
  const Positional tags = all ? Positional{} : positional(*tags_arg);
  for (std::uint32_t i = 0; i < tags.size; ++i) {
    const msgpack::object& item = tags.items[i];
    const auto tag = wire::as_str(item);
    if (!tag) return fail(type_error("wake_up tag", "a str", item));
    if (*tag == "scheduling") continue;
    any = true;
    if (*tag == kWeights && weights_asleep_) {
      weights = true;
    } else if (*tag == kKvCache && kv_cache_asleep_) {
      kv_cache = true;
    } else {
      unknown.emplace_back(*tag);
    }
  }
  if (any) {
    if (!weights_asleep_ && !kv_cache_asleep_) {
      warn("Executor is not sleeping.");
    } else if (!unknown.empty()) {
      std::string asleep = "{";
      if (weights_asleep_) asleep += "'weights'";
      if (kv_cache_asleep_) asleep += std::string(weights_asleep_ ? ", " : "") + "'kv_cache'";
      warn("Tag " + unknown.front() + " is not in sleeping tags " + asleep + "}");
    } else {
      if (weights) weights_asleep_ = false;
      if (kv_cache) kv_cache_asleep_ = false;
    }
  }
  const bool fully_awake = !weights_asleep_ && !kv_cache_asleep_;
  if (fully_awake) scheduler_.resume();
  return bool_value(fully_awake);
}

// EngineCore.is_sleeping(): paused, or any memory asleep.
ReferenceCore::Result ReferenceCore::is_sleeping(const std::string& qualname, Positional args) {
  if (auto bound = bind_call(qualname, {}, args, nullptr); !bound) return fail(bound.error());
  return bool_value(scheduler_.paused() || weights_asleep_ || kv_cache_asleep_);
}

// EngineCore.release_kv_cache_memory(): discards the KV cache of a paused engine whose memory
// is all resident; wake_up(tags=["kv_cache"]) restores it.
ReferenceCore::Result ReferenceCore::release_kv_cache_memory(const std::string& qualname,
                                                             Positional args) {
  if (auto bound = bind_call(qualname, {}, args, nullptr); !bound) return fail(bound.error());
  if (!scheduler_.paused() || running_requests() > 0) {
    return fail("release_kv_cache_memory() requires a completed pause first");
  }
  if (weights_asleep_ || kv_cache_asleep_) {
    return fail("release_kv_cache_memory() requires all executor memory to be resident");
  }
  kv_cache_asleep_ = true;
  return none_value();
}

}  // namespace vllmd::reference
