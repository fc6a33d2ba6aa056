// ReferenceCore: vLLM's weight-update state machine and its exact error texts, without sockets.

#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "common/reference/core.hpp"
#include "tests/unit/reference/core_calls.hpp"

namespace {

using vllmd::reference::Backend;
using vllmd::reference::ReferenceCore;
using vllmd::reference::testing::call;
using vllmd::reference::testing::error;
using vllmd::reference::testing::rpc;

constexpr std::string_view kNcclInit =
    R"({"init_info":{"master_address":"10.0.0.1","master_port":29500,"rank_offset":1,"world_size":2}})";
constexpr std::string_view kNcclUpdate =
    R"({"update_info":{"names":["a","b"],"dtype_names":["bfloat16","float32"],"shapes":[[2,3],[4]]}})";

}  // namespace

TEST_SUITE("reference_core") {
  TEST_CASE("a full NCCL session succeeds and is counted") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(rpc(core, "init_weight_transfer_engine", kNcclInit) == "[null]");
    CHECK(rpc(core, "start_weight_update") == "[null]");
    CHECK(core.workers()[0].update_active);
    CHECK(rpc(core, "update_weights", kNcclUpdate) == "[null]");
    CHECK(rpc(core, "update_weights", kNcclUpdate) == "[null]");
    CHECK(rpc(core, "finish_weight_update", "null") == "[null]");
    CHECK(
        call(core, "reference_state", "[]") ==
        R"({"weight_version":"default","paused":false,"sleeping_tags":[],"workers":[{"initialized":true,)"
        R"("update_active":false,"draft":false,"updates_in_session":2,"sessions_finished":1,)"
        R"("tensors_received":4}]})");
  }

  TEST_CASE("TP=2 returns one nil per worker and updates every worker") {
    ReferenceCore core(0, 2, Backend::kNccl);
    CHECK(rpc(core, "init_weight_transfer_engine", kNcclInit) == "[null,null]");
    CHECK(rpc(core, "start_weight_update") == "[null,null]");
    CHECK(rpc(core, "update_weights", kNcclUpdate) == "[null,null]");
    for (const auto& worker : core.workers()) {
      CHECK(worker.initialized);
      CHECK(worker.tensors_received == 2);
    }
  }

  TEST_CASE("an engine has PP x TP x PCP workers; a list update_info has one entry each") {
    vllmd::reference::ParallelSizes sizes;
    sizes.data_parallel_rank = 1;
    sizes.data_parallel_size = 2;
    sizes.pipeline_parallel_size = 2;
    sizes.tensor_parallel_size = 2;
    CHECK(sizes.world_size() == 4);
    sizes.prefill_context_parallel_size = 3;
    CHECK(sizes.world_size() == 12);
    sizes.prefill_context_parallel_size = 1;
    ReferenceCore core(sizes, Backend::kNccl);  // workers 4..7 of 8
    REQUIRE(core.workers().size() == 4);
    CHECK(rpc(core, "init_weight_transfer_engine", kNcclInit) == "[null,null,null,null]");
    CHECK(rpc(core, "start_weight_update") == "[null,null,null,null]");
    std::string entries;
    for (int worker = 0; worker < 8; ++worker) {  // worker i's entry names i + 1 tensors
      std::string names;
      std::string shapes;
      for (int i = 0; i <= worker; ++i) {
        names += std::string(i == 0 ? "" : ",") + "\"w\"";
        shapes += std::string(i == 0 ? "" : ",") + "[1]";
      }
      entries += std::string(worker == 0 ? "" : ",") + "{\"names\":[" + names +
                 "],\"dtype_names\":[" + names + "],\"shapes\":[" + shapes + "]}";
    }
    CHECK(rpc(core, "update_weights", "{\"update_info\":[" + entries + "]}") ==
          "[null,null,null,null]");
    for (std::size_t rank = 0; rank < 4; ++rank) {
      CAPTURE(rank);
      CHECK(core.workers()[rank].tensors_received == 5 + rank);  // entry 4 + rank
    }
  }

  TEST_CASE("worker errors come wrapped whenever vLLM runs its MultiprocExecutor") {
    const std::string busy =
        "start_weight_update called while a weight update is already active. "
        "Call finish_weight_update first.";
    const auto second_start = [](const vllmd::reference::ParallelSizes& sizes) {
      ReferenceCore core(sizes, Backend::kNccl);
      REQUIRE(rpc(core, "start_weight_update").find("error") == std::string::npos);
      return rpc(core, "start_weight_update");
    };
    // One worker and no DP: UniProcExecutor raises the worker's exception itself.
    CHECK(second_start({}) == error(busy));
    const std::string wrapped = error("Worker failed with error '" + busy +
                                      "', please check the stack trace above for the root cause");
    CHECK(second_start({0, 1, 2, 1, 1}) == wrapped);  // TP=2
    CHECK(second_start({0, 1, 1, 2, 1}) == wrapped);  // PP=2
    CHECK(second_start({0, 1, 1, 1, 2}) == wrapped);  // PCP=2
    // DP=2 alone: ParallelConfig picks "mp" when world_size x DP exceeds 1.
    CHECK(second_start({1, 2, 1, 1, 1}) == wrapped);
    // Errors of collective_rpc itself are the engine's, never wrapped.
    ReferenceCore core({0, 1, 2, 1, 1}, Backend::kNccl);
    CHECK(call(core, "collective_rpc", "[1,null,[],{}]") ==
          error("collective_rpc() argument 'method' must be a str, not int"));
  }

  TEST_CASE("session errors carry vLLM's messages") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(rpc(core, "update_weights", kNcclUpdate) ==
          error("start_weight_update must be called before update_weights."));
    CHECK(rpc(core, "finish_weight_update") ==
          error("finish_weight_update called without a matching start_weight_update."));
    CHECK(rpc(core, "start_weight_update") == "[null]");
    CHECK(rpc(core, "start_weight_update") ==
          error("start_weight_update called while a weight update is already active. Call "
                "finish_weight_update first."));
    CHECK(rpc(core, "start_draft_weight_update") ==
          error("start_draft_weight_update called while a weight update is already active. "
                "Call finish_weight_update first."));
    // Updating before init fails and ends the session.
    CHECK(rpc(core, "update_weights", kNcclUpdate) ==
          error("Weight transfer engine not initialized. Call init_weight_transfer_engine first."));
    CHECK_FALSE(core.workers()[0].update_active);
    CHECK(rpc(core, "finish_weight_update") ==
          error("finish_weight_update called without a matching start_weight_update."));
  }

  TEST_CASE("draft sessions are flagged until finished") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(rpc(core, "start_draft_weight_update") == "[null]");
    CHECK(core.workers()[0].draft);
    CHECK(rpc(core, "finish_weight_update") == "[null]");
    CHECK_FALSE(core.workers()[0].draft);
    CHECK(core.workers()[0].sessions_finished == 1);
  }

  TEST_CASE("NCCL init_info is checked like NCCLWeightTransferInitInfo(**init_info)") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(rpc(core, "init_weight_transfer_engine",
              R"({"init_info":{"master_address":"h","rank_offset":0,"world_size":2}})") ==
          error("NCCLWeightTransferInitInfo.__init__() missing 1 required positional argument: "
                "'master_port'"));
    CHECK(rpc(core, "init_weight_transfer_engine", R"({"init_info":{"master_address":"h"}})") ==
          error("NCCLWeightTransferInitInfo.__init__() missing 3 required positional arguments: "
                "'master_port', 'rank_offset', and 'world_size'"));
    CHECK(rpc(core, "init_weight_transfer_engine",
              R"({"init_info":{"master_address":"h","master_port":1,"rank_offset":0,)"
              R"("world_size":2,"x":1}})") ==
          error("NCCLWeightTransferInitInfo.__init__() got an unexpected keyword argument 'x'"));
    CHECK(rpc(core, "init_weight_transfer_engine", R"({"init_info":[1]})") ==
          error("init_info must be a dict, not list"));
    CHECK(rpc(core, "init_weight_transfer_engine", "{}") ==
          error("Worker.init_weight_transfer_engine() missing 1 required positional argument: "
                "'init_info'"));
    CHECK_FALSE(core.workers()[0].initialized);
    CHECK(rpc(core, "init_weight_transfer_engine",
              R"({"init_info":{"master_address":"h","master_port":1,"rank_offset":0,)"
              R"("world_size":2,"packed":true,"packed_buffer_size_bytes":1024,)"
              R"("packed_num_buffers":2,"nccl_unique_id_b64":"AAAA"}})") == "[null]");
    CHECK(core.workers()[0].initialized);
  }

  TEST_CASE("init_info may also be passed positionally, as Python allows") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "collective_rpc",
               R"(["init_weight_transfer_engine",null,[{"master_address":"h","master_port":1,)"
               R"("rank_offset":0,"world_size":2}],null])") == "[null]");
    CHECK(call(core, "collective_rpc",
               R"(["init_weight_transfer_engine",null,[{}],{"init_info":{}}])") ==
          error("Worker.init_weight_transfer_engine() got multiple values for argument "
                "'init_info'"));
    CHECK(call(core, "collective_rpc", R"(["start_weight_update",null,[1],null])") ==
          error("Worker.start_weight_update() takes 1 positional argument but 2 were given"));
    CHECK(rpc(core, "start_weight_update", R"({"is_checkpoint_format":true})") ==
          error("Worker.start_weight_update() got an unexpected keyword argument "
                "'is_checkpoint_format'"));
  }

  TEST_CASE("NCCL update_info must hold equally long lists; a failure ends the session") {
    ReferenceCore core(0, 1, Backend::kNccl);
    REQUIRE(rpc(core, "init_weight_transfer_engine", kNcclInit) == "[null]");
    REQUIRE(rpc(core, "start_weight_update") == "[null]");
    CHECK(rpc(core, "update_weights",
              R"({"update_info":{"names":["a","b"],"dtype_names":["f"],"shapes":[[1],[2]]}})") ==
          error("names, dtype_names and shapes must have the same length, got 2, 1 and 2"));
    CHECK_FALSE(core.workers()[0].update_active);

    REQUIRE(rpc(core, "start_weight_update") == "[null]");
    CHECK(rpc(core, "update_weights", R"({"update_info":{"names":["a"]}})") ==
          error("NCCLWeightTransferUpdateInfo.__init__() missing 2 required positional "
                "arguments: 'dtype_names' and 'shapes'"));
    CHECK_FALSE(core.workers()[0].update_active);

    REQUIRE(rpc(core, "start_weight_update") == "[null]");
    CHECK(rpc(core, "update_weights",
              R"({"update_info":{"names":"a","dtype_names":["f"],"shapes":[[1]]}})") ==
          error("names must be a list, not str"));
    REQUIRE(rpc(core, "start_weight_update") == "[null]");
    CHECK(rpc(core, "update_weights",
              R"({"update_info":{"names":[1],"dtype_names":["f"],"shapes":[[1]]}})") ==
          error("names[0] must be a str, not int"));
    REQUIRE(rpc(core, "start_weight_update") == "[null]");
    CHECK(rpc(core, "update_weights", R"({"update_info":"x"})") ==
          error("update_info must be a dict, not str"));
    CHECK(core.workers()[0].tensors_received == 0);

    // Unknown keys are tolerated (trainers add options such as packed).
    REQUIRE(rpc(core, "start_weight_update") == "[null]");
    CHECK(rpc(core, "update_weights",
              R"({"update_info":{"names":["a"],"dtype_names":["f"],"shapes":[[1]],)"
              R"("packed":true}})") == "[null]");
    CHECK(core.workers()[0].tensors_received == 1);
  }

  TEST_CASE("a list update_info gives worker dp_rank * tp + rank its element") {
    ReferenceCore core(1, 2, Backend::kNccl);  // workers 2 and 3
    REQUIRE(rpc(core, "init_weight_transfer_engine", kNcclInit) == "[null,null]");
    REQUIRE(rpc(core, "start_weight_update") == "[null,null]");
    const std::string entry_bad = R"({"names":["x"],"dtype_names":[],"shapes":[]})";
    const std::string entry_one = R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]]})";
    const std::string entry_three =
        R"({"names":["a","b","c"],"dtype_names":["f","f","f"],"shapes":[[1],[2],[3]]})";
    CHECK(rpc(core, "update_weights",
              "{\"update_info\":[" + entry_bad + "," + entry_bad + "," + entry_one + "," +
                  entry_three + "]}") == "[null,null]");
    CHECK(core.workers()[0].tensors_received == 1);
    CHECK(core.workers()[1].tensors_received == 3);

    CHECK(rpc(core, "update_weights",
              "{\"update_info\":[" + entry_one + "," + entry_one + "," + entry_one + "]}") ==
          error("Worker failed with error 'update_info is a list of 3 entries, but worker 3 "
                "(dp_rank * world_size + rank) needs entry 3', please check the stack trace above "
                "for the root cause"));
    // Worker 2 succeeded, worker 3 failed: the session of the failing worker ended.
    CHECK(core.workers()[0].update_active);
    CHECK_FALSE(core.workers()[1].update_active);
  }

  TEST_CASE("IPC update_info is checked like IPCWeightTransferUpdateInfo(**update_info)") {
    ReferenceCore core(0, 1, Backend::kIpc);
    CHECK(rpc(core, "init_weight_transfer_engine", R"({"init_info":{"master_port":1}})") ==
          error("IPCWeightTransferInitInfo.__init__() got an unexpected keyword argument "
                "'master_port'"));
    // No init needed for IPC updates. Each failure ends the session; start a new one.
    const auto update = [&](std::string_view info_json) {
      REQUIRE(rpc(core, "start_weight_update") == "[null]");
      return rpc(core, "update_weights", "{\"update_info\":" + std::string(info_json) + "}");
    };
    const std::string invalid = "Invalid update_info for IPCWeightTransferEngine: ";
    // Building the dataclass: TypeErrors, which parse_update_info turns into ValueErrors.
    CHECK(update(R"({"names":["a"]})") ==
          error(invalid +
                "IPCWeightTransferUpdateInfo.__init__() missing 2 required positional arguments: "
                "'dtype_names' and 'shapes'"));
    CHECK(update(R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]],"packed":true})") ==
          error(invalid +
                "IPCWeightTransferUpdateInfo.__init__() got an unexpected keyword argument "
                "'packed'"));
    CHECK(update(R"("x")") ==
          error(invalid +
                "vllm.distributed.weight_transfer.ipc_engine.IPCWeightTransferUpdateInfo() "
                "argument after ** must be a mapping, not str"));
    CHECK(update(R"({"names":1,"dtype_names":["f"],"shapes":[[1]],"ipc_handles":[{}]})") ==
          error(invalid + "object of type 'int' has no len()"));
    CHECK(update(R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]],)"
                 R"("ipc_handles_pickled":["x"]})") ==
          error(invalid + "argument should be a bytes-like object or ASCII string, not 'list'"));
    // __post_init__: its ValueErrors as they are.
    CHECK(update(R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]]})") ==
          error("Either `ipc_handles` or `ipc_handles_pickled` must be provided"));
    CHECK(update(R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]],"ipc_handles":null,)"
                 R"("ipc_handles_pickled":null})") ==
          error("Either `ipc_handles` or `ipc_handles_pickled` must be provided"));
    CHECK(update(R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]],"ipc_handles":[{}],)"
                 R"("ipc_handles_pickled":"gASV"})") ==
          error("Cannot specify both `ipc_handles` and `ipc_handles_pickled`"));
    CHECK(update(R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]],)"
                 R"("ipc_handles_pickled":"gAé"})") ==
          error("string argument should contain only ASCII characters"));
    CHECK(update(R"({"names":["a","b"],"dtype_names":["f"],"shapes":[[1],[2]],)"
                 R"("ipc_handles_pickled":"gASV"})") ==
          error("`dtype_names` should be of the same size as `names`: got 1 and 2"));
    CHECK(update(R"({"names":"ab","dtype_names":["f","f"],"shapes":[[1]],)"
                 R"("ipc_handles_pickled":"gASV"})") ==
          error("`shapes` should be of the same size as `names`: got 1 and 2"));
    CHECK(update(R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]],"ipc_handles":[{},{}]})") ==
          error("`ipc_handles` should be of the same size as `names`: got 2 and 1"));
    // receive_weights, unpacked: `assert isinstance(update_info.ipc_handles, list)`.
    CHECK(update(R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]],"ipc_handles":{"g":[]}})") ==
          error(""));
    CHECK_FALSE(core.workers()[0].update_active);
    CHECK(core.workers()[0].tensors_received == 0);

    // Accepted: pickled handles (HTTP) or direct ones (Ray); tensor_sizes optional.
    CHECK(update(R"({"names":["a"],"dtype_names":["f"],"shapes":[[1]],)"
                 R"("ipc_handles_pickled":"gASV","tensor_sizes":[4]})") == "[null]");
    CHECK(rpc(core, "update_weights",
              R"({"update_info":{"names":["a","b"],"dtype_names":["f","f"],)"
              R"("shapes":[[1],[2]],"ipc_handles":[{"gpu":[]},{"gpu":[]}]}})") == "[null]");
    CHECK(rpc(core, "update_weights",
              R"({"update_info":{"names":["c"],"dtype_names":["f"],"shapes":[[1]],)"
              R"("ipc_handles_pickled":"gASV","tensor_sizes":null}})") == "[null]");
    CHECK(rpc(core, "finish_weight_update") == "[null]");
    CHECK(core.workers()[0].tensors_received == 4);
    CHECK(rpc(core, "init_weight_transfer_engine", R"({"init_info":{}})") == "[null]");
  }

  TEST_CASE("without VLLM_ALLOW_INSECURE_SERIALIZATION pickled IPC handles are refused") {
    ReferenceCore core(vllmd::reference::ParallelSizes{}, Backend::kIpc, false);
    REQUIRE(rpc(core, "start_weight_update") == "[null]");
    CHECK(rpc(core, "update_weights",
              R"({"update_info":{"names":["a"],"dtype_names":["f"],"shapes":[[1]],)"
              R"("ipc_handles_pickled":"gASV"}})") ==
          error("Refusing to deserialize `ipc_handles_pickled` without "
                "VLLM_ALLOW_INSECURE_SERIALIZATION=1"));
    REQUIRE(rpc(core, "start_weight_update") == "[null]");
    CHECK(rpc(core, "update_weights",
              R"({"update_info":{"names":["a"],"dtype_names":["f"],"shapes":[[1]],)"
              R"("ipc_handles":[{}]}})") == "[null]");
  }

  TEST_CASE("without a weight transfer backend every worker method fails") {
    ReferenceCore core(0, 1, Backend::kNone);
    const std::string not_configured = error(
        "Weight transfer not configured. Please set weight_transfer_config to enable weight "
        "transfer.");
    CHECK(rpc(core, "init_weight_transfer_engine", kNcclInit) == not_configured);
    CHECK(rpc(core, "start_weight_update") == not_configured);
    CHECK(rpc(core, "start_draft_weight_update") == not_configured);
    CHECK(rpc(core, "update_weights", kNcclUpdate) == not_configured);
    CHECK(rpc(core, "finish_weight_update") == not_configured);
    // Engine-core methods still work.
    CHECK(call(core, "get_weight_version", "[]") == "\"default\"");
  }

  TEST_CASE("reload_weights needs a model: the reference engine has no other weights to read") {
    ReferenceCore core(0, 2, Backend::kTcp);
    CHECK(rpc(core, "reload_weights") ==
          error("Worker failed with error 'reload_weights: this reference engine runs no model to "
                "reload (start it with --model)', please check the stack trace above for the "
                "root cause"));
    CHECK(rpc(core, "reload_weights", R"({"x":1})") ==
          error("Worker failed with error 'Worker.reload_weights() got an unexpected keyword "
                "argument 'x'', please check the stack trace above for the root cause"));
  }

  TEST_CASE("weight versions") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "get_weight_version", "[]") == "\"default\"");
    CHECK(call(core, "set_weight_version", R"(["step-42"])") == "null");
    CHECK(core.weight_version() == "step-42");
    CHECK(call(core, "get_weight_version", "[]") == "\"step-42\"");
    CHECK(call(core, "set_weight_version", "[]") ==
          error("EngineCore.set_weight_version() missing 1 required positional argument: "
                "'version'"));
    CHECK(call(core, "set_weight_version", "[42]") ==
          error("weight version must be a str, not int"));
    CHECK(call(core, "get_weight_version", "[1]") ==
          error("EngineCore.get_weight_version() takes 1 positional argument but 2 were given"));
  }

  TEST_CASE("pause modes") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "is_scheduler_paused", "[]") == "false");
    for (const char* mode : {"abort", "wait", "keep"}) {
      CAPTURE(mode);
      CHECK(call(core, "pause_scheduler", "[\"" + std::string(mode) + "\",true]") == "null");
      CHECK(call(core, "is_scheduler_paused", "[]") == "true");
      CHECK(call(core, "resume_scheduler", "[]") == "null");
      CHECK_FALSE(core.paused());
    }
    CHECK(call(core, "pause_scheduler", "[]") == "null");  // defaults: abort, clear cache
    CHECK(core.paused());
    CHECK(call(core, "resume_scheduler", "[]") == "null");
    CHECK(call(core, "pause_scheduler", R"(["later",false])") ==
          error("Invalid pause mode: 'later'. Expected one of 'abort', 'wait', 'keep'."));
    CHECK(call(core, "pause_scheduler", R"(["wait","yes"])") ==
          error("clear_cache must be a bool, not str"));
    CHECK(call(core, "pause_scheduler", R"(["wait",true,1])") ==
          error("EngineCore.pause_scheduler() takes from 1 to 3 positional arguments but 4 were "
                "given"));
    CHECK_FALSE(core.paused());
  }

  TEST_CASE("unknown methods") {
    ReferenceCore core(0, 2, Backend::kNccl);
    CHECK(call(core, "profile", "[]") == error("'EngineCore' object has no attribute 'profile'"));
    // TP=2: the workers' AttributeError comes through MultiprocExecutor, quotes and all.
    CHECK(rpc(core, "load_model") ==
          error("Worker failed with error ''Worker' object has no attribute 'load_model'', "
                "please check the stack trace above for the root cause"));
  }

  TEST_CASE("malformed arguments give TypeErrors, never a crash") {
    ReferenceCore core(0, 1, Backend::kNccl);
    CHECK(call(core, "collective_rpc", "[]") ==
          error("EngineCore.collective_rpc() missing 1 required positional argument: 'method'"));
    CHECK(call(core, "collective_rpc", "[1,null,[],{}]") ==
          error("collective_rpc() argument 'method' must be a str, not int"));
    CHECK(call(core, "collective_rpc", R"(["start_weight_update","soon",[],{}])") ==
          error("collective_rpc() argument 'timeout' must be a float or None, not str"));
    CHECK(call(core, "collective_rpc", R"(["start_weight_update",null,{},{}])") ==
          error("collective_rpc() argument 'args' must be a list, not dict"));
    CHECK(call(core, "collective_rpc", R"(["start_weight_update",null,[],[]])") ==
          error("collective_rpc() argument 'kwargs' must be a dict or None, not list"));
    CHECK(call(core, "collective_rpc", R"(["start_weight_update",1.5,[],{},1])") ==
          error("EngineCore.collective_rpc() takes from 2 to 5 positional arguments but 6 were "
                "given"));
    CHECK(call(core, "get_weight_version", "{}") ==
          error("utility call arguments must be a list, not dict"));
    auto garbage = core.call("get_weight_version", std::string("\x92\x01", 2));
    REQUIRE_FALSE(garbage);
    CHECK(garbage.error().find("cannot decode") == 0);
    // A timeout (int or float) and only the method name are accepted.
    CHECK(call(core, "collective_rpc", R"(["start_weight_update",30])") == "[null]");
    CHECK(call(core, "collective_rpc", R"(["finish_weight_update",1.5,[],{}])") == "[null]");
    CHECK(rpc(core, "update_weights", R"({"update_info":{},"extra":1})") ==
          error("Worker.update_weights() got an unexpected keyword argument 'extra'"));
  }

  TEST_CASE("backend names") {
    Backend backend = Backend::kNone;
    CHECK(vllmd::reference::parse_backend("ipc", backend));
    CHECK(backend == Backend::kIpc);
    CHECK(vllmd::reference::parse_backend("nccl", backend));
    CHECK(backend == Backend::kNccl);
    CHECK_FALSE(vllmd::reference::parse_backend("gloo", backend));
    CHECK(vllmd::reference::backend_name(Backend::kNone) == "none");
  }
}
