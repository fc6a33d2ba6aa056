#pragma once
// The one API table: every route vllmd serves, as data, each row naming the service function
// that answers it (as Redis's command table names each command's function). The daemon's
// router, the service's dispatch, the metrics, vllmctl's commands and help, and the tests
// read it: adding a route is one row, one handler and its tests.

#include <span>
#include <string_view>

#include "common/api/call.hpp"
#include "common/api/engine_args.hpp"

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
  kResetPrefixCache,
  kResetMmCache,
  kResetEncoderCache,
  kSleep,
  kWakeUp,
  kIsSleeping,
  kReleaseKvCacheMemory,
  kModels,
  kServerInfo,
  kCollectiveRpc,
  kWeightChecker,
  kGenerate,
  kCompletions,
  kAbortRequests,
};

// How a route is served. Every switch over it names every kind: a new one does not compile
// until each place handles it.
enum class Handling {
  kLifecycle,  // weight-update calls: one at a time, in order, owned sessions (SerialQueue)
  kRead,       // an engine's state: from known state when certain, else asked of every engine
  kScheduler,  // pause/resume: an engine call outside the lifecycle queue
  kEngine,     // a command or query to every engine (cache resets), outside the lifecycle queue
  kLocal,      // vllmd's own answer, no engine call: served on the event loop
  kGenerate,   // token generation and its aborts: GenerationService (generation.hpp)
};

// The request body a route takes.
enum class Body {
  kNone,      // any body is read and ignored
  kOptional,  // none at all, or a JSON object
  kRequired,  // a JSON object
};

// What a route's one body member must be (validated before anything reaches an engine).
enum class Member {
  kNone,
  kObject,          // init_info: a JSON object
  kObjectOrList,    // update_info: an object, or an array of objects (per worker)
  kString,          // new_version
  kOptionalString,  // weight_version: absent, null or a string
};

// Which of vLLM's operation metrics a route's `metric` label belongs to.
enum class MetricFamily {
  kWeightUpdate,  // vllm:rl_weight_update_operation{s_total,_duration_seconds,s_in_flight}
  kSleepMode,     // vllm:sleep_mode_operation_duration_seconds, ..._operations_in_flight
};

// Which of vllmd's known state the route's engine call changes (uncertain until it succeeds).
enum class Changes { kNothing, kVersion, kPaused };

// How vllmctl turns a route's arguments into the request (see cmd/vllmctl/route_command).
enum class ArgKind {
  kBodyFile,    // FILE ('-': stdin) holding the body member's JSON; repeatable: one call each
  kBodyString,  // a string body member
  kBodyJson,    // a body member given as JSON text on the command line (the server checks it)
  kQuery,       // a query parameter
  kQueryFlag,   // a flag that sets a query parameter to `value`
};

struct CliArg {
  std::string_view name = {};  // "--info", "--version", or a positional name ("V")
  ArgKind kind = ArgKind::kQuery;
  std::string_view key = {};    // the body member or query parameter
  std::string_view value = {};  // kQueryFlag: the value set; kQuery: allowed values, '|'-separated
  std::string_view value_name = {};  // in help: FILE, V, MODE
  std::string_view help = {};
  std::string_view detail = {};  // shown after the success text: "{}" replaced by the value
  bool required = false;
  bool repeatable = false;
};

// vllmctl's side of a route.
struct Cli {
  // "weights init"; empty: no command of its own. "weights start --draft": a flag of the
  // command "weights start" that sends this route instead.
  std::string_view command = {};
  // The success line: "{member}" replaced by the reply's member; empty: the server's
  // "message", lowercased.
  std::string_view success = {};
  std::string_view empty_reply = "{}";  // -o json's document when the reply has no body
  std::span<const CliArg> args = {};
};

class WeightSyncService;
// The service function that answers a route (common/api/service.hpp).
using Handler = void (WeightSyncService::*)(const CallPtr& call, const Done& done);
class GenerationService;
using GenerationHandler = void (GenerationService::*)(const CallPtr& call, const Done& done);

struct Route {
  Operation operation = {};
  std::string_view method = "GET";
  std::string_view path = {};
  Handling handling = Handling::kLocal;
  Handler handler = nullptr;
  GenerationHandler generation_handler = nullptr;  // Handling::kGenerate routes
  bool dev_only = true;                            // 404 unless dev mode is on
  bool open_to_all = false;                        // no API key, no allowlist (/health)
  bool blocking = false;                           // may wait (on files): served off the event loop
  Body body = Body::kNone;
  std::string_view member = {};  // the body member validated and passed on, or empty
  Member member_kind = Member::kNone;
  std::string_view engine_method = {};  // engine-core UTILITY method, or empty (no engine call)
  std::string_view worker_method = {};  // collective_rpc worker method, or empty
  // The engine method's args from the query (checked first; a 400 reaches nothing); none: [].
  EngineArgs engine_args = nullptr;
  std::string_view metric = {};  // its operation label in vLLM's metrics, or empty
  MetricFamily metric_family = MetricFamily::kWeightUpdate;
  Changes changes = Changes::kNothing;
  std::string_view success_message = {};  // {"message": ...} routes
  std::string_view summary = {};          // one line for help and docs
  Cli cli = {};
};

std::span<const Route> routes();
// The route for a path whatever its method, or nullptr.
const Route* find_route(std::string_view path);
const Route& route_for(Operation operation);
// Its index in routes(), for per-route counters.
std::size_t route_index(const Route& route);

}  // namespace vllmd::api
