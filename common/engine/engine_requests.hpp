#pragma once
// Generation requests on the engines, beside the UTILITY calls of engine_calls.hpp: an ADD goes
// to one engine (the least loaded, or the rank the caller pins), and that engine's outputs for
// it come back, step by step, to the request's sink. EngineClient implements it over ZeroMQ;
// the generation service takes only this interface.
//
// Every sink call happens on the engine client's IO thread, one request's calls in order, and
// exactly one of them is the last: an output with a finish_reason, or on_closed. There is no
// thread, lock or allocation per output on the way: a sink must be quick and must not block.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/engine/engine_calls.hpp"
#include "common/wire/generation_output.hpp"
#include "common/wire/generation_request.hpp"

namespace vllmd::engine {

// Why a request ended without the engine finishing it.
enum class Closed : std::uint8_t {
  kAborted,     // abort() was called for it: the engine sends nothing more
  kEngineLost,  // its engine died, disconnected or restarted
  kRefused,     // never sent: no engine (or not the pinned one) is ready, or the id is in use
  kShutdown,    // the client is closing
};
std::string_view closed_name(Closed why);

class RequestSink {
 public:
  RequestSink() = default;
  virtual ~RequestSink() = default;
  RequestSink(const RequestSink&) = delete;
  RequestSink& operator=(const RequestSink&) = delete;

  // Told which engine took the request, before any output.
  virtual void on_sent(int rank) = 0;
  // One step's delta. `output` views the engine's message: it is valid during the call only.
  // With a finish_reason it is the last call.
  virtual void on_output(const wire::OutputView& output) = 0;
  // The last call when no finishing output came; `message` says why, for people.
  virtual void on_closed(Closed why, std::string_view message) = 0;
};

struct Generation {
  wire::EngineCoreRequest request;  // request_id: the engine's id, unique among those in flight
  std::optional<int> rank;          // pinned (X-data-parallel-rank); else the least loaded
  std::shared_ptr<RequestSink> sink;
  std::string session;  // X-Session-ID: its session's engine (session_affinity.hpp)
  // generate_all: to the engine of the generation before it (the n choices of one prompt
  // share its prefix cache there).
  bool follows_previous = false;
};

// Per engine, for balancing and /metrics.
struct EngineLoad {
  int rank = 0;
  std::size_t requests_in_flight = 0;  // sent by this client and not finished
  std::int64_t running = 0;            // the engine's last scheduler_stats
  std::int64_t waiting = 0;
};

class EngineRequests {
 public:
  EngineRequests() = default;
  virtual ~EngineRequests() = default;
  EngineRequests(const EngineRequests&) = delete;
  EngineRequests& operator=(const EngineRequests&) = delete;

  // Returns at once; the sink hears the rest on the IO thread.
  virtual void generate(Generation generation) = 0;
  // Several at once, in order (one answer's choices): none is sent before all are submitted,
  // so an abort for all of them misses none. One with follows_previous goes to the engine the
  // one before it went to, or is refused with it.
  virtual void generate_all(std::vector<Generation> generations) = 0;
  // Ends these requests (engine ids): each sink still in flight gets on_closed(kAborted), and
  // each engine one ABORT with its ids. Unknown and finished ids are ignored.
  virtual void abort(std::vector<std::string> request_ids) = 0;
  virtual std::vector<EngineLoad> loads() const = 0;
};

// vLLM's Rust client's score (lower is less loaded): its own count of requests in flight, or the
// engine's running + waiting when that is higher, plus three times the waiting ones.
std::int64_t load_score(const EngineLoad& load);

}  // namespace vllmd::engine
