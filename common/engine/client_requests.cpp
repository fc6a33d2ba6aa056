// The engine client's IO thread, continued: generation requests. Each one in flight is an
// entry of `requests` (engine id → rank and sink), apart from the utility calls' `pending`:
// requests never hold a probe back, never expire on a timer and are never scanned per round.
// An engine's outputs are demultiplexed here by request id, straight from the decoded message
// to the request's sink.

#include <algorithm>
#include <map>

#include "common/engine/client_impl.hpp"
#include "common/util/log.hpp"

namespace vllmd::engine {

namespace {

// A step's deliveries handed on between two looks at the ADDs waiting (about 0.1 ms' worth).
constexpr std::size_t kDeliveriesBetweenAdds = 64;
constexpr std::size_t kPrefetchAhead = 8;

}  // namespace

std::string_view closed_name(Closed why) {
  switch (why) {
    case Closed::kAborted: return "aborted";
    case Closed::kEngineLost: return "engine lost";
    case Closed::kRefused: return "refused";
    case Closed::kShutdown: return "shutdown";
  }
  return "unknown";
}

std::int64_t load_score(const EngineLoad& load) {
  const auto in_flight = static_cast<std::int64_t>(load.requests_in_flight);
  return std::max(in_flight, load.running + load.waiting) + 3 * load.waiting;
}

EngineSlot* EngineClient::Impl::choose_engine(const Generation& generation, std::string& why) {
  if (const std::optional<int>& rank = generation.rank) {
    if (*rank < 0 || *rank >= options.data_parallel_size) {
      why = "data-parallel rank " + std::to_string(*rank) + " is out of range (" +
            std::to_string(options.data_parallel_size) + " engines)";
      return nullptr;
    }
    EngineSlot& engine = engines[static_cast<std::size_t>(*rank)];
    if (auto refused = refusal(engine, {})) {
      why = *refused;
      return nullptr;
    }
    return &engine;
  }
  // The first least loaded, in rank order (as vLLM's Rust client picks).
  EngineSlot* best = nullptr;
  std::int64_t best_score = 0;
  candidates.clear();
  for (EngineSlot& engine : engines) {
    const bool ready = engine.status.state == EngineState::kReady;
    const std::int64_t score = load_score({engine.status.rank, engine.requests_in_flight,
                                           engine.stats.running, engine.stats.waiting});
    candidates.push_back({ready, score});
    if (ready && (best == nullptr || score < best_score)) {
      best = &engine;
      best_score = score;
    }
  }
  if (best == nullptr) {
    why = "no engine is ready";
    for (const EngineSlot& engine : engines) why += "; " + refusal(engine, {}).value_or("");
    return nullptr;
  }
  if (generation.session.empty()) return best;
  std::string moved;
  const int rank = sessions.choose(generation.session, candidates, best->status.rank, moved);
  if (!moved.empty()) {
    util::log::info("session ", generation.session, " moves to engine rank ", rank, ": ", moved);
  }
  return &engines[static_cast<std::size_t>(rank)];
}

void EngineClient::Impl::send_generation(Generation& generation) {
  const std::string& id = generation.request.request_id;
  const int leader_rank = previous_rank;
  previous_rank = -1;
  if (requests.contains(id)) {
    return generation.sink->on_closed(Closed::kRefused,
                                      "request id " + id + " is already in flight");
  }
  std::string why;
  if (generation.follows_previous) {
    if (leader_rank < 0) {
      return generation.sink->on_closed(Closed::kRefused, "the request it goes with was refused");
    }
    generation.rank = leader_rank;
  }
  EngineSlot* engine = choose_engine(generation, why);
  if (engine == nullptr) return generation.sink->on_closed(Closed::kRefused, why);
  const wire::RequestLayout& layout =
      wire::request_layout_for(engine->status.registration.vllm_version);
  zmq::message_t payload(wire::encode_engine_core_request(generation.request, layout));
  if (const int error = send_message(*engine, wire::RequestType::kAdd, payload); error != 0) {
    if (error == EHOSTUNREACH) mark_disconnected(*engine, "input connection gone");
    return generation.sink->on_closed(Closed::kRefused, "cannot send to engine rank " +
                                                            std::to_string(engine->status.rank) +
                                                            ": " + zmq_strerror(error));
  }
  ++engine->requests_in_flight;
  loads_changed = true;
  previous_rank = engine->status.rank;
  generation.sink->on_sent(engine->status.rank);
  requests.emplace(id, InFlight{engine->status.rank, std::move(generation.sink)});
}

EngineClient::Impl::InFlight EngineClient::Impl::take_request(RequestTable::iterator found) {
  InFlight request = std::move(found->second);
  requests.erase(found);
  --engines[static_cast<std::size_t>(request.rank)].requests_in_flight;
  loads_changed = true;
  return request;
}

void EngineClient::Impl::send_aborts(const std::vector<std::string>& ids) {
  std::map<int, std::vector<std::string>> by_rank;
  for (const std::string& id : ids) {
    auto found = requests.find(id);
    if (found == requests.end()) continue;
    InFlight request = take_request(found);
    by_rank[request.rank].push_back(id);
    request.sink->on_closed(Closed::kAborted, "aborted");
  }
  // One ABORT per engine. The engine answers none: a lost one only costs it the tokens it
  // goes on generating, and outputs that still come for these ids are dropped.
  for (auto& [rank, engine_ids] : by_rank) {
    EngineSlot& engine = engines[static_cast<std::size_t>(rank)];
    if (engine.status.state == EngineState::kDead && !engine.dead_by_timeout) continue;
    zmq::message_t payload(wire::encode_abort(engine_ids));
    if (const int error = send_message(engine, wire::RequestType::kAbort, payload); error != 0) {
      util::log::debug("engine link: cannot send ABORT to engine rank ", rank, ": ",
                       zmq_strerror(error));
    }
  }
}

void EngineClient::Impl::on_outputs(const wire::DecodedOutputs& decoded) {
  // Outputs are signs of life: a busy engine need not be probed.
  const std::int64_t index = decoded.engine_index;
  if (index >= 0 && index < options.data_parallel_size) {
    EngineSlot& engine = engines[static_cast<std::size_t>(index)];
    if (decoded.scheduler_stats) {
      engine.stats = *decoded.scheduler_stats;
      loads_changed = true;
    }
    if (options.probe_interval.count() > 0 && engine.status.state == EngineState::kReady) {
      engine.next_probe = Clock::now() + options.probe_interval;
    }
  }
  // First outputs go first: a new request's first token then leaves ahead of the step's
  // burst of deltas for the others, and the time to first token does not grow with how many
  // streams are open. ADDs that came meanwhile go out before that burst too, and between
  // its parts, rather than after it: a step for thousands of streams takes milliseconds to
  // hand on. Sinks erase no request meanwhile but their own, as they finish.
  later.clear();
  for (const wire::OutputView& delta : decoded.outputs) {
    // An id not in flight: a request aborted or ended meanwhile, or none of ours.
    auto found = requests.find(delta.request_id);
    if (found == requests.end()) continue;
    if (found->second.started) {
      later.emplace_back(&found->second, &delta);
      continue;
    }
    found->second.started = true;
    deliver(found->second, delta);
  }
  for (std::size_t i = 0; i < later.size(); ++i) {
    if (i % kDeliveriesBetweenAdds == 0) send_waiting_generations();
    // Each sink is a cache miss of its own, and thousands are handed on in a row: ask for
    // one a few deliveries ahead of its turn.
    if (i + kPrefetchAhead < later.size()) {
      __builtin_prefetch(later[i + kPrefetchAhead].first->sink.get());
    }
    deliver(*later[i].first, *later[i].second);
  }
  // Finished without a finishing output: no request may wait for one that never comes.
  for (std::string_view id : decoded.finished_requests) {
    auto found = requests.find(id);
    if (found == requests.end()) continue;
    InFlight request = take_request(found);
    request.sink->on_closed(Closed::kEngineLost,
                            "engine rank " + std::to_string(request.rank) +
                                " finished the request without a final output");
  }
}

void EngineClient::Impl::deliver(InFlight& request, const wire::OutputView& delta) {
  if (!delta.finish_reason) return request.sink->on_output(delta);
  const auto found = requests.find(delta.request_id);
  if (found == requests.end()) return;
  const InFlight ended = take_request(found);
  ended.sink->on_output(delta);
}

// Only the ADDs: aborts wait for the round's end, as they erase requests `later` points to.
void EngineClient::Impl::send_waiting_generations() {
  if (!generations_waiting.load(std::memory_order_relaxed)) return;
  std::deque<Generation> taken;
  {
    std::lock_guard lock(queue_mutex);
    taken.swap(generations);
    generations_waiting.store(false, std::memory_order_relaxed);
  }
  for (Generation& generation : taken) send_generation(generation);
}

void EngineClient::Impl::end_requests(int rank, Closed why, const std::string& message) {
  std::vector<std::shared_ptr<RequestSink>> ended;
  for (auto it = requests.begin(); it != requests.end();) {
    if (it->second.rank != rank) {
      ++it;
      continue;
    }
    ended.push_back(std::move(it->second.sink));
    it = requests.erase(it);
  }
  if (ended.empty()) return;
  engines[static_cast<std::size_t>(rank)].requests_in_flight = 0;
  loads_changed = true;
  for (const auto& sink : ended) sink->on_closed(why, message);
}

void EngineClient::Impl::publish_loads() {
  if (!loads_changed) return;
  loads_changed = false;
  std::vector<EngineLoad> loads;
  loads.reserve(engines.size());
  for (const EngineSlot& engine : engines) {
    loads.push_back({engine.status.rank, engine.requests_in_flight, engine.stats.running,
                     engine.stats.waiting});
  }
  std::lock_guard lock(loads_mutex);
  published_loads = std::move(loads);
}

}  // namespace vllmd::engine
