#include "common/reference/connection.hpp"

#include <zmq.h>

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/reference/handshake.hpp"
#include "common/util/log.hpp"
#include "common/wire/messages.hpp"

namespace vllmd::reference {

namespace {

using Clock = std::chrono::steady_clock;

// Offset just past the header of the msgpack array starting at bytes[0]; nullopt if none.
std::optional<std::size_t> skip_array_header(std::string_view bytes) {
  if (bytes.empty()) return std::nullopt;
  const auto head = static_cast<unsigned char>(bytes[0]);
  if ((head & 0xf0) == 0x90) return 1;
  if (head == 0xdc) return 3;
  if (head == 0xdd) return 5;
  return std::nullopt;
}

// The UTILITY payload's args array exactly as sent (decode_utility_request re-encodes it).
// The payload was already decoded with limits, so walking its first items is safe.
std::optional<std::string_view> raw_args(std::string_view payload) {
  auto offset = skip_array_header(payload);
  if (!offset) return std::nullopt;
  try {
    for (int i = 0; i < 3; ++i) msgpack::unpack(payload.data(), payload.size(), *offset);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return payload.substr(*offset);
}

// args[0] when it is a string: the worker method of a collective_rpc call.
std::string first_string(std::string_view args) {
  auto offset = skip_array_header(args);
  if (!offset || *offset >= args.size()) return {};
  try {
    const msgpack::object_handle item = msgpack::unpack(args.data(), args.size(), *offset);
    if (item.get().type == msgpack::type::STR) return item.get().as<std::string>();
  } catch (const std::exception&) {
  }
  return {};
}

// Input messages taken in one turn before a due step goes out: bounds a step's delay under
// a burst of ADDs without making the burst wait a step interval per message.
constexpr int kMessagesPerTurn = 512;
constexpr std::chrono::milliseconds kLongestWait{100};  // then the stop request is looked at

ParallelSizes parallel_sizes(const ReferenceEngineOptions& options) {
  return {options.rank, options.data_parallel_size, options.tensor_parallel_size,
          options.pipeline_parallel_size, options.prefill_context_parallel_size};
}

SchedulerOptions scheduler_options(const ReferenceEngineOptions& options) {
  SchedulerOptions scheduler;
  scheduler.engine_index = options.rank;
  scheduler.max_num_seqs = options.max_num_seqs;
  scheduler.tokens_per_step = options.tokens_per_step;
  scheduler.vocab_size = options.vocab_size;
  scheduler.max_model_len = options.max_model_len;
  // vLLM's include_finished_set: data_parallel_size > 1, which only coordinated ranks keep.
  scheduler.include_finished_set = options.coordinated_dp && options.data_parallel_size > 1;
  return scheduler;
}

double monotonic_seconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

}  // namespace

FrontendConnection::FrontendConnection(const ReferenceEngineOptions& options,
                                       const std::atomic<bool>& stop_requested,
                                       std::function<bool(std::chrono::milliseconds)> sleep)
    : options_(options), prefix_("reference engine " + std::to_string(options.rank) + ": "),
      sockets_(options.rank, stop_requested), faults_(options, sockets_, std::move(sleep), prefix_),
      core_(parallel_sizes(options), options.backend, options.insecure_serialization,
            scheduler_options(options)),
      layout_(wire::request_layout_for(options.vllm_version)) {
  core_.set_running_requests(options.running_requests);
  if (options.model) core_.set_model(options.model, options.model_source);
  encoding_.outputs_fields = static_cast<std::size_t>(options.faults.reply_fields);
  encoding_.zero_copy_threshold = options.zero_copy_threshold;
}

Outcome FrontendConnection::run() {
  // ParallelConfig's own validation (vllm/config/parallel.py): such an engine never starts.
  if (options_.prefill_context_parallel_size > 1 && options_.data_parallel_size > 1) {
    throw std::runtime_error("PCP does not support data parallelism yet.");
  }
  const auto handshake = run_handshake(
      options_, core_.sizes().world_size(), sockets_,
      [this](std::chrono::milliseconds duration) { return faults_.sleep(duration); }, prefix_);
  if (!handshake.completed) return Outcome::kStopped;
  return serve();
}

void FrontendConnection::send_due_replies() {
  for (const std::string& frame : held_.take_due(Clock::now())) {
    sockets_.send(sockets_.output, frame);
  }
}

Outcome FrontendConnection::serve() {
  auto next_step = Clock::now();
  while (!sockets_.stopping()) {
    send_due_replies();
    for (int i = 0; i < kMessagesPerTurn; ++i) {
      auto frames = sockets_.try_receive(sockets_.input);
      if (!frames) break;
      if (auto outcome = handle(*frames)) return *outcome;
    }
    const bool stepping = core_.scheduler().has_work();
    if (stepping && Clock::now() >= next_step) {
      run_step();
      next_step = Clock::now() + options_.step_interval;
      continue;
    }
    auto deadline = held_.next_due();
    if (stepping) deadline = deadline ? std::min(*deadline, next_step) : next_step;
    wait_for_input(deadline);
  }
  return Outcome::kStopped;
}

void FrontendConnection::wait_for_input(std::optional<Clock::time_point> deadline) {
  auto timeout = kLongestWait;
  if (deadline) {
    const auto now = Clock::now();
    if (now >= *deadline) return;
    timeout = std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(*deadline - now));
  }
  EngineSockets::poll_one(sockets_.input, ZMQ_POLLIN, timeout);
}

std::optional<Outcome> FrontendConnection::handle(const std::vector<zmq::message_t>& frames) {
  if (frames.size() < 2 || frames[0].size() != 1) {
    util::log::warning(prefix_, "ignoring a malformed request message of ", frames.size(),
                       " frame(s)");
    return std::nullopt;
  }
  const auto type = static_cast<wire::RequestType>(view(frames[0])[0]);
  const std::string_view payload = view(frames[1]);
  switch (type) {
    case wire::RequestType::kUtility: return handle_utility(payload);
    case wire::RequestType::kAdd: handle_add(payload); break;
    case wire::RequestType::kAbort: handle_abort(payload); break;
    default: util::log::info(prefix_, "ignoring request type ", static_cast<int>(type)); break;
  }
  return std::nullopt;
}

void FrontendConnection::handle_add(std::string_view payload) {
  if (options_.on_call) options_.on_call(ReceivedCall{"ADD", std::string(payload), {}});
  auto request = wire::decode_engine_core_request(payload, layout_);
  if (!request) {
    util::log::warning(prefix_, "ignoring an ADD that does not decode as ", layout_.name, ": ",
                       request.error());
    return;
  }
  const bool fail = faults_.fails("generate");
  if (fail) util::log::info(prefix_, "injected failure in generate: ", request->request_id);
  core_.scheduler().add(std::move(*request), fail);
}

void FrontendConnection::handle_abort(std::string_view payload) {
  if (options_.on_call) options_.on_call(ReceivedCall{"ABORT", std::string(payload), {}});
  auto ids = wire::decode_abort(payload);
  if (!ids) {
    util::log::warning(prefix_, "ignoring a malformed ABORT: ", ids.error());
    return;
  }
  core_.scheduler().abort(*ids);
}

void FrontendConnection::run_step() {
  const wire::OutputsToSend& outputs = core_.scheduler().step(monotonic_seconds());
  sockets_.send_frames(sockets_.output, wire::encode_outputs(outputs, encoding_));
  if (options_.on_first_outputs) {
    // A request's first output is the one that carries its prefill stats.
    std::vector<std::string> first;
    for (const wire::OutputToSend& output : outputs.outputs) {
      if (output.num_cached_tokens) first.push_back(output.request_id);
    }
    if (!first.empty()) options_.on_first_outputs(first, monotonic_seconds());
  }
  // Pauses in mode wait complete once nothing runs.
  if (core_.scheduler().running() == 0) {
    for (const std::string& frame : held_.take_when_idle()) sockets_.send(sockets_.output, frame);
  }
}

std::optional<Outcome> FrontendConnection::handle_utility(std::string_view payload) {
  const auto received_at = Clock::now();
  auto request = wire::decode_utility_request(payload);
  if (!request) {
    util::log::warning(prefix_, "ignoring a malformed UTILITY request: ", request.error());
    return std::nullopt;
  }
  if (request->client_index != 0) {
    util::log::warning(prefix_, "client_index ", request->client_index,
                       " requested; replying on the only output socket");
  }
  ReceivedCall call;
  call.method = std::move(request->method);
  auto args = raw_args(payload);
  call.args_msgpack = args ? std::string(*args) : std::move(request->args_msgpack);
  if (call.method == "collective_rpc") call.worker_method = first_string(call.args_msgpack);
  util::log::debug(prefix_, "call ", request->call_id.bits, ": ", call.method,
                   call.worker_method.empty() ? "" : " ", call.worker_method);
  if (options_.on_call) options_.on_call(call);

  if (auto outcome = faults_.before_reply(call, request->call_id)) return outcome;
  std::string frame = wire::encode_engine_core_outputs(
      options_.rank, answer(call, request->call_id), now_seconds(), options_.faults.reply_fields);
  // A pause in mode abort: the ABORT outputs go before its reply.
  if (core_.scheduler().has_endings()) run_step();
  if (core_.take_reply_when_idle()) {
    held_.hold_until_idle(std::move(frame));
  } else if (auto hold = find_fault(options_.faults.hold, call);
             hold != options_.faults.hold.end()) {
    util::log::debug(prefix_, "injected hold: answering ", hold->first, " in ",
                     hold->second.count(), " ms");
    held_.hold(received_at + hold->second, std::move(frame));
  } else {
    sockets_.send(sockets_.output, frame);
  }
  return std::nullopt;
}

// The call's result from the core, or its injected failure.
wire::UtilityOutput FrontendConnection::answer(const ReceivedCall& call, wire::CallId call_id) {
  const std::string failure_prefix = "Call to " + call.method + " method failed: ";
  wire::UtilityOutput output;
  output.call_id = call_id;
  if (auto failing = faults_.failure(call)) {
    // A worker method's failure stands for the workers raising: it reads like theirs.
    const std::string error = "injected failure in " + *failing;
    output.failure_message =
        failure_prefix + (*failing == call.worker_method ? core_.worker_error(error) : error);
  } else if (auto result = core_.call(call.method, call.args_msgpack)) {
    output.value_msgpack = std::move(*result);
  } else {
    output.failure_message = failure_prefix + result.error();
  }
  if (output.failure_message) util::log::info(prefix_, *output.failure_message);
  return output;
}

}  // namespace vllmd::reference
