#pragma once
// The one API table: every route vllmd serves, as data. The daemon's router, vllmctl's
// commands and help, and the tests all read it, so a route exists in exactly one place.

#include <array>
#include <string_view>

namespace vllmd::api {

enum class Operation {
  kInitWeightTransfer,
  kStartWeightUpdate,
  kStartDraftWeightUpdate,
  kUpdateWeights,
  kFinishWeightUpdate,
  kUpdateWeightVersion,
  kWeightInfo,
  kWorldSize,
  kPause,
  kResume,
  kIsPaused,
  kHealth,
  kVersion,
  kMetrics,
  kReload,
  kSessionStatus,
};

enum class Body {
  kNone,      // any body is read and ignored
  kOptional,  // none at all, or a JSON object
  kRequired,  // a JSON object
};

struct Route {
  Operation operation;
  std::string_view method;  // "GET" or "POST"
  std::string_view path;
  bool dev_only;   // 404 unless dev mode is on
  bool lifecycle;  // serialized across clients
  Body body;
  std::string_view worker_method;     // collective_rpc worker method, or empty
  std::string_view engine_method;     // engine-core UTILITY method, or empty (no engine call)
  std::string_view metric_operation;  // label in the operation-duration histogram, or empty
  std::string_view success_message;   // {"message": ...} routes
  std::string_view cli;               // vllmctl command
  std::string_view summary;
};

inline constexpr std::array<Route, 16> kRoutes{{
    {Operation::kInitWeightTransfer, "POST", "/init_weight_transfer_engine", true, true,
     Body::kRequired, "init_weight_transfer_engine", "collective_rpc", "init",
     "Weight transfer initialized", "weights init",
     "initialize the weight transfer engine on every worker (body: {\"init_info\": {...}})"},
    {Operation::kStartWeightUpdate, "POST", "/start_weight_update", true, true, Body::kNone,
     "start_weight_update", "collective_rpc", "start", "Weight update started", "weights start",
     "open a weight-update session"},
    {Operation::kStartDraftWeightUpdate, "POST", "/start_draft_weight_update", true, true,
     Body::kNone, "start_draft_weight_update", "collective_rpc", "start_draft",
     "Draft weight update started", "weights start --draft",
     "open a weight-update session for the draft model"},
    {Operation::kUpdateWeights, "POST", "/update_weights", true, true, Body::kRequired,
     "update_weights", "collective_rpc", "update", "Weights updated", "weights update",
     "receive one chunk of weights (body: {\"update_info\": {...} | [{...}, ...]})"},
    {Operation::kFinishWeightUpdate, "POST", "/finish_weight_update", true, true, Body::kOptional,
     "finish_weight_update", "collective_rpc", "finish", "Weight update finished", "weights finish",
     "close the session; commit {\"weight_version\": ...} only on success"},
    {Operation::kUpdateWeightVersion, "POST", "/update_weight_version", true, true, Body::kRequired,
     "", "set_weight_version", "set_version", "", "weights set-version",
     "set the weight version label (body: {\"new_version\": ...})"},
    {Operation::kWeightInfo, "GET", "/weight_info", true, false, Body::kNone, "",
     "get_weight_version", "", "", "weights info", "the current weight version"},
    {Operation::kWorldSize, "GET", "/get_world_size", true, false, Body::kNone, "", "", "", "",
     "world-size", "inference world size (TP x PP, times DP unless include_dp=false)"},
    {Operation::kPause, "POST", "/pause", true, false, Body::kNone, "", "pause_scheduler", "", "",
     "pause", "pause generation (query: mode=abort|wait|keep, clear_cache=true|false)"},
    {Operation::kResume, "POST", "/resume", true, false, Body::kNone, "", "resume_scheduler", "",
     "", "resume", "resume generation"},
    {Operation::kIsPaused, "GET", "/is_paused", true, false, Body::kNone, "", "is_scheduler_paused",
     "", "", "status", "whether generation is paused"},
    {Operation::kHealth, "GET", "/health", false, false, Body::kNone, "", "", "", "", "health",
     "200 when every engine is attached and alive, else 503"},
    {Operation::kVersion, "GET", "/version", false, false, Body::kNone, "", "", "", "", "",
     "vllmd version (and the engines' vLLM version)"},
    {Operation::kMetrics, "GET", "/metrics", false, false, Body::kNone, "", "", "", "", "",
     "Prometheus metrics"},
    // vllmd's own: what ExecReload= runs (through vllmctl), answering once the reload is done.
    {Operation::kReload, "POST", "/reload", false, false, Body::kNone, "", "", "", "", "reload",
     "reload vllmd's configuration as SIGHUP does; fails (78) and changes nothing when invalid"},
    // vllmd's own: the weight-update session it knows of (vllmctl status shows it).
    {Operation::kSessionStatus, "GET", "/weight_update_session", true, false, Body::kNone, "", "",
     "", "", "", "the open weight-update session: owned or anonymous, age, updates"},
}};

// The route for a path whatever its method, or nullptr.
const Route* find_route(std::string_view path);
const Route& route_for(Operation operation);

}  // namespace vllmd::api
