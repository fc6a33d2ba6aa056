#include "common/reference/engine.hpp"

#include <zmq.h>

#include <cerrno>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/reference/held_replies.hpp"
#include "common/util/log.hpp"
#include "common/wire/messages.hpp"

namespace vllmd::reference {

namespace {

using Clock = std::chrono::steady_clock;

// Longest a blocking wait may run before the thread looks at stop_requested_ again.
constexpr std::chrono::milliseconds kSlice{100};
// Linger for the last message on a socket we close on purpose (READY, ENGINE_CORE_DEAD):
// with 0 it could be dropped before the I/O thread wrote it; bounded so exit cannot hang.
constexpr int kFlushLingerMs = 1000;

enum class Outcome { kStopped, kFaultExit };

std::string_view view(const zmq::message_t& message) {
  return {static_cast<const char*>(message.data()), message.size()};
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Polls one socket; EINTR counts as "nothing happened".
bool poll_one(zmq::socket_t& socket, short events, std::chrono::milliseconds timeout) {
  zmq_pollitem_t item{socket.handle(), 0, events, 0};
  const int rc = zmq_poll(&item, 1, static_cast<long>(timeout.count()));
  if (rc < 0 && zmq_errno() != EINTR) throw zmq::error_t();
  return rc > 0 && (item.revents & events) != 0;
}

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

ParallelSizes parallel_sizes(const ReferenceEngineOptions& options) {
  return {options.rank, options.data_parallel_size, options.tensor_parallel_size,
          options.pipeline_parallel_size, options.prefill_context_parallel_size};
}

// A fault set or map entry for the call: its worker method first, then its engine method.
template <typename Container> auto find_fault(const Container& faults, const ReceivedCall& call) {
  auto found = call.worker_method.empty() ? faults.end() : faults.find(call.worker_method);
  return found != faults.end() ? found : faults.find(call.method);
}

// One connection to a frontend, from HELLO to the end of serving; owns every socket, all on
// the engine thread.
class FrontendConnection {
 public:
  FrontendConnection(const ReferenceEngineOptions& options, const std::atomic<bool>& stop_requested,
                     std::function<bool(std::chrono::milliseconds)> sleep)
      : options_(options), faults_(options.faults), stop_requested_(stop_requested),
        sleep_(std::move(sleep)),
        core_(parallel_sizes(options), options.backend, options.insecure_serialization),
        data_parallel_size_(options.data_parallel_size),
        prefix_("reference engine " + std::to_string(options.rank) + ": ") {
    core_.set_running_requests(options.running_requests);
  }

  Outcome run() {
    // ParallelConfig's own validation (vllm/config/parallel.py): such an engine never starts.
    if (options_.prefill_context_parallel_size > 1 && options_.data_parallel_size > 1) {
      throw std::runtime_error("PCP does not support data parallelism yet.");
    }
    if (!handshake()) return Outcome::kStopped;
    return serve();
  }

 private:
  bool stopping() const { return stop_requested_.load(); }

  zmq::socket_t open(zmq::socket_type type, const std::string& address) {
    zmq::socket_t socket(context_, type);
    socket.set(zmq::sockopt::linger, 0);
    // vLLM's make_zmq_socket: no high-water mark, so thousands of calls or held replies
    // queue up instead of being dropped or blocking.
    socket.set(zmq::sockopt::rcvhwm, 0);
    socket.set(zmq::sockopt::sndhwm, 0);
    if (type == zmq::socket_type::dealer) {
      socket.set(zmq::sockopt::routing_id, wire::engine_identity(options_.rank));
    }
    try {
      socket.connect(address);
    } catch (const zmq::error_t& error) {
      throw std::runtime_error("cannot connect to '" + address + "': " + error.what());
    }
    return socket;
  }

  // Sends one frame, waiting (in slices) while the socket is full; false when stopped first.
  bool send(zmq::socket_t& socket, std::string_view frame) {
    while (!stopping()) {
      if (socket.send(zmq::buffer(frame.data(), frame.size()), zmq::send_flags::dontwait)) {
        return true;
      }
      poll_one(socket, ZMQ_POLLOUT, kSlice);
    }
    return false;
  }

  // All frames of the next message; nullopt when stopped or past the deadline.
  std::optional<std::vector<zmq::message_t>> receive(zmq::socket_t& socket,
                                                     std::optional<Clock::time_point> deadline) {
    while (!stopping()) {
      auto slice = kSlice;
      if (deadline) {
        const auto now = Clock::now();
        if (now >= *deadline) return std::nullopt;
        slice = std::min(slice, std::chrono::ceil<std::chrono::milliseconds>(*deadline - now));
      }
      if (!poll_one(socket, ZMQ_POLLIN, slice)) continue;
      std::vector<zmq::message_t> frames;
      do {
        zmq::message_t frame;
        if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
        frames.push_back(std::move(frame));
      } while (frames.back().more());
      if (!frames.empty()) return frames;
    }
    return std::nullopt;
  }

  // vLLM's DPEngineCoreProc (MoE with DP > 1); dense ranks run as plain EngineCoreProcs.
  bool coordinated() const { return options_.coordinated_dp && options_.data_parallel_size > 1; }

  wire::Registration registration() const {
    wire::Registration registration;
    registration.empty = false;
    registration.world_size = core_.sizes().world_size();
    // Dense ranks are independent: run_engine_core collapses their DP size to 1.
    registration.data_parallel_size = coordinated() ? data_parallel_size_ : 1;
    registration.tensor_parallel_size = options_.tensor_parallel_size;
    registration.pipeline_parallel_size = options_.pipeline_parallel_size;
    registration.decode_context_parallel_size = 1;
    registration.data_parallel_rank = options_.rank;
    registration.vllm_version = options_.vllm_version;
    registration.max_model_len = options_.max_model_len;
    if (options_.backend != Backend::kNone) {
      registration.weight_transfer_backend = std::string(backend_name(options_.backend));
    }
    registration.supports_draft_weight_updates = true;
    return registration;
  }

  // HELLO, INIT, registration and READY. False when stopped; throws on protocol errors.
  bool handshake() {
    util::log::info(prefix_, "connecting to ", options_.handshake_address);
    handshake_ = open(zmq::socket_type::dealer, options_.handshake_address);
    if (!send(handshake_, wire::encode_handshake_status({"HELLO", false, true}))) return false;
    auto frames = receive(handshake_, Clock::now() + options_.init_timeout);
    if (!frames) {
      if (stopping()) return false;
      throw std::runtime_error("no INIT from " + options_.handshake_address + " within " +
                               std::to_string(options_.init_timeout.count()) + " ms");
    }
    auto init = wire::decode_init(view(frames->front()));
    if (!init) throw std::runtime_error("bad INIT message: " + init.error());
    if (init->inputs.size() > 1) {
      util::log::warning(prefix_, "INIT lists ", init->inputs.size(),
                         " input/output pairs; using only the first");
    }
    // vLLM forms the DP group right after INIT, before it loads the model.
    if (coordinated() &&
        !form_dp_group(wire::decode_init_data_parallel_master(view(frames->front())))) {
      return false;
    }
    if (faults_.delay_ready.count() > 0) {  // the model load
      util::log::info(prefix_, "injected delay of ", faults_.delay_ready.count(),
                      " ms before READY");
      if (!sleep_(faults_.delay_ready)) return false;
    }
    input_ = open(zmq::socket_type::dealer, init->inputs.front());
    output_ = open(zmq::socket_type::push, init->outputs.front());

    const std::string registration_frame =
        faults_.empty_registration ? std::string() : wire::encode_registration(registration());
    const std::string ready = wire::encode_handshake_status({"READY", false, true});
    const bool sent = faults_.ready_before_registration
                          ? send(handshake_, ready) && send(input_, registration_frame)
                          : send(input_, registration_frame) && send(handshake_, ready);
    if (!sent) return false;
    // vLLM closes its handshake socket once READY is out.
    handshake_.set(zmq::sockopt::linger, kFlushLingerMs);
    handshake_.close();
    util::log::info(prefix_, "ready; inputs ", init->inputs.front(), ", outputs ",
                    init->outputs.front());
    return true;
  }

  // The DP master comes from INIT; without one the engine keeps its own, as a headless vLLM
  // does (and its group never forms). False when stopped; throws when the group cannot form.
  bool form_dp_group(const std::optional<wire::DataParallelMaster>& from_init) {
    DpGroupRequest request;
    request.rank = options_.rank;
    request.timeout = options_.dp_group_timeout;
    if (from_init) {
      request.master = *from_init;
    } else {
      auto own = own_data_parallel_master(options_.handshake_address, options_.data_parallel_size);
      if (!own) throw std::runtime_error(own.error());
      request.master = std::move(*own);
    }
    request.size = static_cast<int>(request.master.data_parallel_size);
    data_parallel_size_ = request.size;
    util::log::info(prefix_, "forming the DP group of ", request.size, " ranks; DP master ",
                    request.master.ip, ":", request.master.port,
                    from_init ? " from INIT" : " of its own (INIT names none)");
    auto group = reference::form_dp_group(request, stop_requested_);
    if (!group) {
      if (stopping()) return false;
      throw std::runtime_error("EngineCore failed to start: " + group.error());
    }
    group->master_from_init = from_init.has_value();
    util::log::info(prefix_, "DP group formed at ", group->master.ip, ":", group->group_port,
                    " (DP master ", group->master.ip, ":", group->master.port, ", ",
                    group->master_from_init ? "from INIT" : "its own", ")");
    if (options_.on_dp_group) options_.on_dp_group(*group);
    return true;
  }

  void send_due_replies() {
    for (const std::string& frame : held_.take_due(Clock::now())) send(output_, frame);
  }

  Outcome serve() {
    while (!stopping()) {
      send_due_replies();
      auto frames = receive(input_, held_.next_due());
      if (!frames) continue;
      if (frames->size() < 2 || (*frames)[0].size() != 1) {
        util::log::warning(prefix_, "ignoring a malformed request message of ", frames->size(),
                           " frame(s)");
        continue;
      }
      const auto type = static_cast<unsigned char>(view((*frames)[0])[0]);
      if (type != static_cast<unsigned char>(wire::RequestType::kUtility)) {
        util::log::info(prefix_, "ignoring request type ", static_cast<int>(type),
                        " (only UTILITY is served)");
        continue;
      }
      if (auto outcome = handle(view((*frames)[1]))) return *outcome;
    }
    return Outcome::kStopped;
  }

  // Serves one UTILITY call; an outcome when the connection must end.
  std::optional<Outcome> handle(std::string_view payload) {
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

    if (auto outcome = inject_before_reply(call, request->call_id)) return outcome;
    std::string frame = wire::encode_engine_core_outputs(
        options_.rank, answer(call, request->call_id), now_seconds(), faults_.reply_fields);
    if (auto hold = find_fault(faults_.hold, call); hold != faults_.hold.end()) {
      util::log::debug(prefix_, "injected hold: answering ", hold->first, " in ",
                       hold->second.count(), " ms");
      held_.hold(received_at + hold->second, std::move(frame));
    } else {
      send(output_, frame);
    }
    return std::nullopt;
  }

  // The faults that strike before a call is answered: a delay, a death, garbage frames.
  std::optional<Outcome> inject_before_reply(const ReceivedCall& call, wire::CallId call_id) {
    if (auto delay = find_fault(faults_.delay, call); delay != faults_.delay.end()) {
      util::log::info(prefix_, "injected delay of ", delay->second.count(), " ms in ",
                      delay->first);
      if (!sleep_(delay->second)) return Outcome::kStopped;
    }
    if (auto dead = find_fault(faults_.send_dead, call); dead != faults_.send_dead.end()) {
      util::log::warning(prefix_, "injected fault: sending ENGINE_CORE_DEAD in ", *dead);
      send(output_, wire::kEngineCoreDead);
      // Flush the frame before the process may end: close with a bounded linger and wait.
      output_.set(zmq::sockopt::linger, kFlushLingerMs);
      output_.close();
      input_.close();
      context_.close();
      return Outcome::kFaultExit;
    }
    if (auto exit = find_fault(faults_.exit_silently, call); exit != faults_.exit_silently.end()) {
      util::log::warning(prefix_, "injected fault: exiting without a reply in ", *exit);
      return Outcome::kFaultExit;
    }
    if (auto garbage = find_fault(faults_.garbage, call); garbage != faults_.garbage.end()) {
      util::log::warning(prefix_, "injected fault: malformed output frames before the reply to ",
                         *garbage);
      send_garbage(call_id);
    }
    return std::nullopt;
  }

  // The call's result from the core, or its injected failure.
  wire::UtilityOutput answer(const ReceivedCall& call, wire::CallId call_id) {
    const std::string failure_prefix = "Call to " + call.method + " method failed: ";
    wire::UtilityOutput output;
    output.call_id = call_id;
    auto fail = find_fault(faults_.fail, call);
    auto fail_once = find_fault(faults_.fail_once, call);
    const bool once = fail == faults_.fail.end() && fail_once != faults_.fail_once.end() &&
                      failed_once_.insert(*fail_once).second;
    if (fail != faults_.fail.end() || once) {
      const std::string failing = once ? *fail_once : *fail;
      // A worker method's failure stands for the workers raising: it reads like theirs.
      const std::string error = "injected failure in " + failing;
      output.failure_message =
          failure_prefix + (failing == call.worker_method ? core_.worker_error(error) : error);
    } else if (auto result = core_.call(call.method, call.args_msgpack)) {
      output.value_msgpack = std::move(*result);
    } else {
      output.failure_message = failure_prefix + result.error();
    }
    if (output.failure_message) util::log::info(prefix_, *output.failure_message);
    return output;
  }

  // Frames a broken or hostile engine could send: none may crash the client or end the call.
  void send_garbage(wire::CallId call_id) {
    wire::UtilityOutput stray;  // a well-formed reply to a call nobody made
    stray.call_id = call_id;
    stray.call_id.bits += 7919;
    stray.value_msgpack = std::string("\xc0", 1);
    const std::string frames[] = {
        std::string(),                                 // empty
        std::string("\xc1", 1),                        // a byte msgpack never uses
        std::string("\x95\x00\x01", 3),                // truncated array
        "this is not msgpack at all",                  // text
        std::string(4096, '\x91'),                     // deep nesting, no leaf
        std::string("\xdd\xff\xff\xff\xff", 5),        // array claiming 4G elements
        std::string("\x95\xa1x\xa1y\xc0\xc0\xc0", 8),  // outputs of the wrong types
        wire::encode_engine_core_outputs(options_.rank, stray, now_seconds(), faults_.reply_fields),
    };
    for (const std::string& frame : frames) send(output_, frame);
  }

  const ReferenceEngineOptions& options_;
  const Faults& faults_;
  std::set<std::string> failed_once_;  // --inject-fail-once methods that failed already
  const std::atomic<bool>& stop_requested_;
  std::function<bool(std::chrono::milliseconds)> sleep_;
  ReferenceCore core_;
  int data_parallel_size_;  // the engine's, or INIT's for coordinated DP
  std::string prefix_;
  HeldReplies held_;
  // The context outlives the sockets: members are destroyed in reverse order.
  zmq::context_t context_;
  zmq::socket_t handshake_;
  zmq::socket_t input_;
  zmq::socket_t output_;
};

}  // namespace

ReferenceEngine::ReferenceEngine(ReferenceEngineOptions options) : options_(std::move(options)) {}

ReferenceEngine::~ReferenceEngine() { stop(); }

void ReferenceEngine::start() {
  if (thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_requested_ = false;
    error_.clear();
  }
  running_ = true;
  thread_ = std::thread(&ReferenceEngine::run, this);
}

void ReferenceEngine::stop() {
  {
    // Under the mutex so a sleeper cannot miss the notification.
    std::lock_guard lock(mutex_);
    stop_requested_ = true;
  }
  stop_signal_.notify_all();
  wait();
}

void ReferenceEngine::wait() {
  // From the engine thread itself (an on_call or on_fault_exit callback) there is nothing to
  // join: the thread ends once the callback returns.
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

std::string ReferenceEngine::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

bool ReferenceEngine::sleep_unless_stopped(std::chrono::milliseconds duration) {
  std::unique_lock lock(mutex_);
  return !stop_signal_.wait_for(lock, duration, [this] { return stop_requested_.load(); });
}

void ReferenceEngine::run() {
  Outcome outcome = Outcome::kStopped;
  std::string failure;
  try {
    FrontendConnection connection(
        options_, stop_requested_,
        [this](std::chrono::milliseconds duration) { return sleep_unless_stopped(duration); });
    outcome = connection.run();
  } catch (const std::exception& error) {
    failure = error.what();
  }
  if (!failure.empty()) {
    util::log::error("reference engine ", options_.rank, ": ", failure);
    std::lock_guard lock(mutex_);
    error_ = failure;
  }
  running_ = false;
  if (outcome == Outcome::kFaultExit && options_.on_fault_exit) options_.on_fault_exit();
}

}  // namespace vllmd::reference
