// ReferenceCore's sleep mode: vLLM's EngineCore.sleep / wake_up / is_sleeping /
// release_kv_cache_memory state machine, its warning no-ops, and the refusal of a weight
// update while the weights sleep.

#include <doctest/doctest.h>

#include "tests/unit/reference/core_calls.hpp"

using namespace vllmd::reference;
using namespace vllmd::reference::testing;

namespace {

std::string tags(ReferenceCore& core) {
  const std::string state = call(core, "reference_state", "[]");
  const auto at = state.find("\"sleeping_tags\":");
  return state.substr(at + 16, state.find(']', at) - at - 15);
}

}  // namespace

TEST_SUITE("reference_sleep") {
  TEST_CASE("level 1 sleeps weights and KV cache; a full wake resumes") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "is_sleeping", "[]") == "false");
    CHECK(call(core, "sleep", R"([1,"abort"])") == "null");
    CHECK(core.paused());
    CHECK(tags(core) == R"(["weights","kv_cache"])");
    CHECK(call(core, "is_sleeping", "[]") == "true");
    CHECK(call(core, "wake_up", "[null]") == "true");
    CHECK_FALSE(core.paused());
    CHECK(tags(core) == "[]");
    CHECK(call(core, "is_sleeping", "[]") == "false");
  }

  TEST_CASE("a weights-only wake does not resume; kv_cache then does") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "sleep", R"([2,"wait"])") == "null");
    CHECK(call(core, "wake_up", R"([["weights"]])") == "false");
    CHECK(core.paused());
    CHECK(tags(core) == R"(["kv_cache"])");
    CHECK(call(core, "is_sleeping", "[]") == "true");
    CHECK(call(core, "wake_up", R"([["kv_cache"]])") == "true");
    CHECK_FALSE(core.paused());
  }

  TEST_CASE("level 0 only pauses; is_sleeping is true while paused") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "sleep", R"([0,"keep"])") == "null");
    CHECK(tags(core) == "[]");
    CHECK(call(core, "is_sleeping", "[]") == "true");
    // "scheduling" only resumes; the executor is awake, so the wake is full.
    CHECK(call(core, "wake_up", R"([["scheduling"]])") == "true");
    CHECK(call(core, "is_sleeping", "[]") == "false");
    CHECK(call(core, "pause_scheduler", R"(["keep",false])") == "null");
    CHECK(call(core, "is_sleeping", "[]") == "true");
  }

  TEST_CASE("where vLLM warns, nothing changes") {
    ReferenceCore core(0, 1, Backend::kNccl);
    // Waking an awake engine: "Executor is not sleeping." (and it resumes).
    CHECK(call(core, "wake_up", R"([["weights"]])") == "true");
    CHECK(call(core, "sleep", "[1]") == "null");
    // Sleeping again: "Executor is already sleeping."
    CHECK(call(core, "sleep", "[2]") == "null");
    CHECK(tags(core) == R"(["weights","kv_cache"])");
    CHECK(call(core, "wake_up", R"([["kv_cache"]])") == "false");
    // A tag that is not asleep: the whole wake is a warning and nothing wakes.
    CHECK(call(core, "wake_up", R"([["weights","kv_cache"]])") == "false");
    CHECK(tags(core) == R"(["weights"])");
  }

  TEST_CASE("a weight update while the weights sleep is refused, before any worker") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "sleep", "[]") == "null");
    for (const char* method : {"init_weight_transfer_engine", "start_weight_update",
                               "update_weights", "finish_weight_update"}) {
      CHECK(rpc(core, method) == error("Cannot run " + std::string(method) +
                                       " while the model weights are asleep (sleep level 1); call "
                                       "wake_up(tags=['weights']) first"));
    }
    CHECK_FALSE(core.workers()[0].update_active);
    CHECK(call(core, "wake_up", R"([["weights"]])") == "false");
    CHECK(rpc(core, "start_weight_update") == "[null]");
  }

  TEST_CASE("release_kv_cache_memory: its preconditions and messages") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "release_kv_cache_memory", "[]") ==
          error("release_kv_cache_memory() requires a completed pause first"));
    CHECK(call(core, "sleep", "[1]") == "null");
    CHECK(call(core, "release_kv_cache_memory", "[]") ==
          error("release_kv_cache_memory() requires all executor memory to be resident"));
    CHECK(call(core, "wake_up", "[null]") == "true");
    CHECK(call(core, "pause_scheduler", R"(["abort",true])") == "null");
    CHECK(call(core, "release_kv_cache_memory", "[]") == "null");
    CHECK(tags(core) == R"(["kv_cache"])");
    CHECK(call(core, "wake_up", R"([["kv_cache"]])") == "true");
    CHECK_FALSE(core.paused());
  }

  TEST_CASE("bad arguments are Python's errors") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "sleep", R"([1,"later"])") ==
          error("Invalid pause mode: 'later'. Expected one of 'abort', 'wait', 'keep'."));
    CHECK(call(core, "sleep", R"(["1"])") == error("sleep level must be an int, not str"));
    CHECK(call(core, "wake_up", R"(["weights"])") ==
          error("wake_up tags must be a list or None, not str"));
    CHECK_FALSE(core.paused());
  }
}

TEST_SUITE("reference_running_requests") {
  TEST_CASE("reset_prefix_cache declines while requests hold blocks, unless they are preempted") {
    ReferenceCore core(0, 1, Backend::kNccl);
    core.set_running_requests(3);
    CHECK(call(core, "reset_prefix_cache", "[false,false]") == "false");
    CHECK(call(core, "reset_prefix_cache", "[true,false]") == "true");
    CHECK(call(core, "release_kv_cache_memory", "[]") ==
          error("release_kv_cache_memory() requires a completed pause first"));
    // keep keeps them; abort (the default) ends them.
    CHECK(call(core, "pause_scheduler", R"(["keep",false])") == "null");
    CHECK(call(core, "reset_prefix_cache", "[]") == "false");
    CHECK(call(core, "pause_scheduler", "[]") == "null");
    CHECK(core.running_requests() == 0);
    CHECK(call(core, "reset_prefix_cache", "[]") == "true");
  }

  TEST_CASE("a sleep ends them as its mode says") {
    ReferenceCore core(0, 1, Backend::kNccl);
    core.set_running_requests(2);
    CHECK(call(core, "sleep", R"([0,"keep"])") == "null");
    CHECK(core.running_requests() == 2);
    CHECK(call(core, "sleep", R"([1,"wait"])") == "null");
    CHECK(core.running_requests() == 0);
  }
}
