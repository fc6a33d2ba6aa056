#include "common/api/table.hpp"

#include <array>

#include "common/api/service.hpp"

namespace vllmd::api {

namespace {

using S = WeightSyncService;

constexpr CliArg kInitArgs[] = {
    {.name = "--info",
     .kind = ArgKind::kBodyFile,
     .key = "init_info",
     .value_name = "FILE",
     .help = "JSON file holding init_info ('-': stdin)",
     .detail = "{}",
     .required = true},
};
constexpr CliArg kUpdateArgs[] = {
    {.name = "--info",
     .kind = ArgKind::kBodyFile,
     .key = "update_info",
     .value_name = "FILE",
     .help = "JSON file holding update_info, one call each (repeatable; '-': stdin)",
     .detail = "{}",
     .required = true,
     .repeatable = true},
};
constexpr CliArg kFinishArgs[] = {
    {.name = "--version",
     .kind = ArgKind::kBodyString,
     .key = "weight_version",
     .value_name = "V",
     .help = "weight version to commit on success",
     .detail = "version {}"},
};
constexpr CliArg kSetVersionArgs[] = {
    {.name = "V",
     .kind = ArgKind::kBodyString,
     .key = "new_version",
     .help = "the new weight version",
     .required = true},
};
constexpr CliArg kWorldSizeArgs[] = {
    {.name = "--no-dp",
     .kind = ArgKind::kQueryFlag,
     .key = "include_dp",
     .value = "false",
     .help = "exclude data parallelism (include_dp=false)"},
};
constexpr CliArg kResetPrefixCacheArgs[] = {
    {.name = "--running-requests",
     .kind = ArgKind::kQueryFlag,
     .key = "reset_running_requests",
     .value = "true",
     .help = "also reset the blocks of running requests (they are preempted)"},
    {.name = "--external",
     .kind = ArgKind::kQueryFlag,
     .key = "reset_external",
     .value = "true",
     .help = "also reset the KV connector's external cache"},
};
constexpr CliArg kPauseArgs[] = {
    {.name = "--mode",
     .kind = ArgKind::kQuery,
     .key = "mode",
     .value = "abort|wait|keep",
     .value_name = "MODE",
     .help = "abort|wait|keep (server default: abort)"},
    {.name = "--keep-cache",
     .kind = ArgKind::kQueryFlag,
     .key = "clear_cache",
     .value = "false",
     .help = "keep the prefix cache (clear_cache=false)"},
};

constexpr std::array kRoutes{
    Route{.operation = Operation::kInitWeightTransfer,
          .method = "POST",
          .path = "/init_weight_transfer_engine",
          .handling = Handling::kLifecycle,
          .handler = &S::forward_to_workers,
          .body = Body::kRequired,
          .member = "init_info",
          .member_kind = Member::kObject,
          .engine_method = "collective_rpc",
          .worker_method = "init_weight_transfer_engine",
          .metric = "init",
          .success_message = "Weight transfer initialized",
          .summary = "initialize the weight transfer engine on every worker "
                     "(body: {\"init_info\": {...}})",
          .cli = {.command = "weights init", .args = kInitArgs}},
    Route{.operation = Operation::kStartWeightUpdate,
          .method = "POST",
          .path = "/start_weight_update",
          .handling = Handling::kLifecycle,
          .handler = &S::start,
          .engine_method = "collective_rpc",
          .worker_method = "start_weight_update",
          .metric = "start",
          .success_message = "Weight update started",
          .summary = "open a weight-update session",
          .cli = {.command = "weights start"}},
    Route{.operation = Operation::kStartDraftWeightUpdate,
          .method = "POST",
          .path = "/start_draft_weight_update",
          .handling = Handling::kLifecycle,
          .handler = &S::start,
          .engine_method = "collective_rpc",
          .worker_method = "start_draft_weight_update",
          .metric = "start_draft",
          .success_message = "Draft weight update started",
          .summary = "open a weight-update session for the draft model",
          .cli = {.command = "weights start --draft"}},
    Route{.operation = Operation::kUpdateWeights,
          .method = "POST",
          .path = "/update_weights",
          .handling = Handling::kLifecycle,
          .handler = &S::update,
          .body = Body::kRequired,
          .member = "update_info",
          .member_kind = Member::kObjectOrList,
          .engine_method = "collective_rpc",
          .worker_method = "update_weights",
          .metric = "update",
          .success_message = "Weights updated",
          .summary = "receive one chunk of weights (body: {\"update_info\": {...} | [{...}, ...]})",
          .cli = {.command = "weights update", .args = kUpdateArgs}},
    Route{.operation = Operation::kFinishWeightUpdate,
          .method = "POST",
          .path = "/finish_weight_update",
          .handling = Handling::kLifecycle,
          .handler = &S::finish,
          .body = Body::kOptional,
          .member = "weight_version",
          .member_kind = Member::kOptionalString,
          .engine_method = "collective_rpc",
          .worker_method = "finish_weight_update",
          .metric = "finish",
          .changes = Changes::kVersion,
          .success_message = "Weight update finished",
          .summary = "close the session; commit {\"weight_version\": ...} only on success",
          .cli = {.command = "weights finish", .args = kFinishArgs}},
    Route{.operation = Operation::kUpdateWeightVersion,
          .method = "POST",
          .path = "/update_weight_version",
          .handling = Handling::kLifecycle,
          .handler = &S::set_version_label,
          .body = Body::kRequired,
          .member = "new_version",
          .member_kind = Member::kString,
          .engine_method = "set_weight_version",
          .metric = "set_version",
          .changes = Changes::kVersion,
          .summary = "set the weight version label (body: {\"new_version\": ...})",
          .cli = {.command = "weights set-version",
                  .success = "weight version set to {new_version}",
                  .args = kSetVersionArgs}},
    Route{.operation = Operation::kWeightInfo,
          .path = "/weight_info",
          .handling = Handling::kRead,
          .handler = &S::read,
          .engine_method = "get_weight_version",
          .summary = "the current weight version",
          .cli = {.command = "weights info", .success = "{weight_version}"}},
    Route{.operation = Operation::kWorldSize,
          .path = "/get_world_size",
          .handling = Handling::kLocal,
          .handler = &S::world_size,
          .summary = "inference world size (TP x PP, times DP unless include_dp=false)",
          .cli = {.command = "world-size", .success = "{world_size}", .args = kWorldSizeArgs}},
    Route{.operation = Operation::kPause,
          .method = "POST",
          .path = "/pause",
          .handling = Handling::kScheduler,
          .handler = &S::scheduler,
          .engine_method = "pause_scheduler",
          .changes = Changes::kPaused,
          .summary = "pause generation (query: mode=abort|wait|keep, clear_cache=true|false)",
          .cli = {.command = "pause", .success = "generation paused", .args = kPauseArgs}},
    Route{.operation = Operation::kResume,
          .method = "POST",
          .path = "/resume",
          .handling = Handling::kScheduler,
          .handler = &S::scheduler,
          .engine_method = "resume_scheduler",
          .changes = Changes::kPaused,
          .summary = "resume generation",
          .cli = {.command = "resume", .success = "generation resumed"}},
    Route{.operation = Operation::kIsPaused,
          .path = "/is_paused",
          .handling = Handling::kRead,
          .handler = &S::read,
          .engine_method = "is_scheduler_paused",
          .summary = "whether generation is paused"},
    Route{.operation = Operation::kHealth,
          .path = "/health",
          .handling = Handling::kLocal,
          .handler = &S::health,
          .dev_only = false,
          .open_to_all = true,
          .summary = "200 when every engine is attached and alive, else 503",
          .cli = {.command = "health", .success = "healthy", .empty_reply = R"({"healthy":true})"}},
    Route{.operation = Operation::kVersion,
          .path = "/version",
          .handling = Handling::kLocal,
          .handler = &S::version,
          .dev_only = false,
          .summary = "vllmd version (and the engines' vLLM version)"},
    Route{.operation = Operation::kMetrics,
          .path = "/metrics",
          .handling = Handling::kLocal,
          .handler = &S::metrics,
          .dev_only = false,
          .summary = "Prometheus metrics"},
    // vllmd's own: what ExecReload= runs (through vllmctl), answering once the reload is done.
    Route{.operation = Operation::kReload,
          .method = "POST",
          .path = "/reload",
          .handling = Handling::kLocal,
          .handler = &S::reload,
          .dev_only = false,
          .blocking = true,
          .summary = "reload vllmd's configuration as SIGHUP does; fails (78) and changes nothing "
                     "when invalid",
          .cli = {.command = "reload", .success = "configuration reloaded"}},
    // vllmd's own: the weight-update session it knows of (vllmctl status shows it).
    Route{.operation = Operation::kSessionStatus,
          .path = "/weight_update_session",
          .handling = Handling::kLocal,
          .handler = &S::session_status,
          .summary = "the open weight-update session: owned or anonymous, age, updates"},
    Route{.operation = Operation::kResetPrefixCache,
          .method = "POST",
          .path = "/reset_prefix_cache",
          .handling = Handling::kEngine,
          .handler = &S::reset_prefix_cache,
          .engine_method = "reset_prefix_cache",
          .summary = "reset the prefix cache (query: reset_running_requests, reset_external)",
          .cli = {.command = "cache reset",
                  .success = "prefix cache reset (success: {success})",
                  .args = kResetPrefixCacheArgs}},
    Route{.operation = Operation::kResetMmCache,
          .method = "POST",
          .path = "/reset_mm_cache",
          .handling = Handling::kEngine,
          .handler = &S::engine_command,
          .engine_method = "reset_mm_cache",
          .summary = "reset the multi-modal cache",
          .cli = {.command = "cache reset --mm", .success = "multi-modal cache reset"}},
    Route{.operation = Operation::kResetEncoderCache,
          .method = "POST",
          .path = "/reset_encoder_cache",
          .handling = Handling::kEngine,
          .handler = &S::engine_command,
          .engine_method = "reset_encoder_cache",
          .summary = "reset the encoder cache",
          .cli = {.command = "cache reset --encoder", .success = "encoder cache reset"}},
};

}  // namespace

std::span<const Route> routes() { return kRoutes; }

const Route* find_route(std::string_view path) {
  for (const Route& route : kRoutes) {
    if (route.path == path) return &route;
  }
  return nullptr;
}

const Route& route_for(Operation operation) {
  for (const Route& route : kRoutes) {
    if (route.operation == operation) return route;
  }
  return kRoutes.front();  // unreachable: every Operation has a row (test_table checks)
}

std::size_t route_index(const Route& route) {
  return static_cast<std::size_t>(&route - kRoutes.data());
}

}  // namespace vllmd::api
