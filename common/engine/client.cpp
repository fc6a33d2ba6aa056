#include "common/engine/client.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/engine/client_impl.hpp"
#include "common/engine/endpoints.hpp"
#include "common/util/errno_text.hpp"
#include "common/util/log.hpp"
#include "common/util/memory.hpp"

namespace vllmd::engine {

std::string_view state_name(EngineState state) {
  switch (state) {
    case EngineState::kWaiting: return "waiting";
    case EngineState::kHandshaking: return "loading";
    case EngineState::kReady: return "ready";
    case EngineState::kDisconnected: return "disconnected";
    case EngineState::kDead: return "dead";
  }
  return "unknown";
}

std::string_view error_kind_name(CallErrorKind kind) {
  switch (kind) {
    case CallErrorKind::kFailed: return "failed";
    case CallErrorKind::kTimeout: return "timeout";
    case CallErrorKind::kUnavailable: return "unavailable";
  }
  return "unknown";
}

void Batch::complete(std::size_t index, tl::expected<std::string, CallError> value) {
  EngineClient::Completion completion;
  std::vector<EngineReply> all;
  {
    std::lock_guard lock(mutex);
    if (filled[index]) return;  // the caller gave up on it already
    filled[index] = true;
    replies[index].value = std::move(value);
    if (--remaining > 0) return;
    if (on_complete) {
      completion = std::move(on_complete);
      all = std::move(replies);
    }
  }
  if (completion) {
    completion(std::move(all));
  } else {
    done.notify_all();
  }
}

namespace {

// Sockets the frontend binds: no linger, so closing never waits for unsent messages.
zmq::socket_t make_socket(zmq::context_t& context, zmq::socket_type type,
                          const std::string& address) {
  zmq::socket_t socket(context, type);
  socket.set(zmq::sockopt::linger, 0);
  if (auto endpoint = parse_endpoint(address); endpoint && endpoint->ipv6()) {
    socket.set(zmq::sockopt::ipv6, 1);
  }
  return socket;
}

// Watches a socket's connections so a dropped engine is noticed at once.
zmq::socket_t watch(zmq::context_t& context, zmq::socket_t& socket, const std::string& name,
                    int events) {
  if (zmq_socket_monitor(socket.handle(), name.c_str(), events) != 0) {
    throw zmq::error_t();
  }
  zmq::socket_t monitor(context, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::linger, 0);
  monitor.connect(name);
  return monitor;
}

void bind_or_throw(zmq::socket_t& socket, const std::string& address, const char* purpose) {
  try {
    socket.bind(address);
  } catch (const zmq::error_t& error) {
    throw std::runtime_error(std::string("cannot bind the ") + purpose + " socket at " + address +
                             ": " + error.what());
  }
}

}  // namespace

tl::expected<std::unique_ptr<EngineClient>, std::string> EngineClient::create(
    ClientOptions options) {
  if (options.data_parallel_size < 1 || options.data_parallel_size > 65536) {
    return tl::unexpected("data_parallel_size must be between 1 and 65536, got " +
                          std::to_string(options.data_parallel_size));
  }
  auto plan = plan_sockets(options.handshake_address, options.input_address, options.output_address,
                           options.advertised_host);
  if (!plan) return tl::unexpected(plan.error());

  auto impl = std::make_unique<Impl>();
  try {
    Impl& io = *impl;
    io.options = std::move(options);
    io.sessions = SessionAffinity(io.options.session_imbalance);
    const std::string tag = std::to_string(reinterpret_cast<std::uintptr_t>(&io));
    // Output and input first, then the handshake socket: an engine that says HELLO must find
    // the addresses of INIT already listening.
    io.output = make_socket(io.context, zmq::socket_type::pull, plan->output_bind);
    io.output.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(io.options.reply_limits.str));
    bind_or_throw(io.output, plan->output_bind, "output");
    io.input = make_socket(io.context, zmq::socket_type::router, plan->input_bind);
    io.input.set(zmq::sockopt::router_mandatory, 1);
    io.input.set(zmq::sockopt::sndhwm, 0);           // never block the IO thread on a full pipe
    io.input.set(zmq::sockopt::router_handover, 1);  // a restarted engine takes over its identity
    // A reconnected engine is routable once its ZeroMQ handshake succeeded: probe it then.
    io.input_monitor =
        watch(io.context, io.input, "inproc://vllmd-input-monitor-" + tag,
              ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED);
    bind_or_throw(io.input, plan->input_bind, "input");
    io.handshake = make_socket(io.context, zmq::socket_type::router, io.options.handshake_address);
    io.handshake.set(zmq::sockopt::router_mandatory, 1);
    io.handshake.set(zmq::sockopt::router_handover, 1);
    io.handshake_monitor =
        watch(io.context, io.handshake, "inproc://vllmd-handshake-monitor-" + tag,
              ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED);
    bind_or_throw(io.handshake, io.options.handshake_address, "handshake");

    io.handshake_endpoint = io.handshake.get(zmq::sockopt::last_endpoint);
    auto input = advertise(io.input.get(zmq::sockopt::last_endpoint), plan->advertised_host);
    auto output = advertise(io.output.get(zmq::sockopt::last_endpoint), plan->advertised_host);
    if (!input) return tl::unexpected(input.error());
    if (!output) return tl::unexpected(output.error());
    io.input_endpoint = *input;
    io.output_endpoint = *output;
    io.init_message = wire::encode_init({{io.input_endpoint}, {io.output_endpoint}},
                                        io.options.data_parallel_master);

    io.engines.resize(static_cast<std::size_t>(io.options.data_parallel_size));
    for (int rank = 0; rank < io.options.data_parallel_size; ++rank) {
      io.engines[rank].status.rank = rank;
      io.engines[rank].identity = wire::engine_identity(rank);
    }
    io.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (io.wake_fd < 0) return tl::unexpected(std::string("eventfd: ") + util::errno_text(errno));
    util::log::info("engine link: handshake ", io.handshake_endpoint, ", input ", io.input_endpoint,
                    ", output ", io.output_endpoint, "; waiting for ",
                    io.options.data_parallel_size, " engine(s)");
    io.io_thread = std::thread([&io] { io.run(); });
  } catch (const std::exception& error) {
    return tl::unexpected(std::string(error.what()));
  }
  return std::unique_ptr<EngineClient>(new EngineClient(std::move(impl)));
}

EngineClient::EngineClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EngineClient::~EngineClient() = default;

void EngineClient::close() { impl_->close(); }

void EngineClient::Impl::close() {
  std::lock_guard lock(close_mutex);
  stopping.store(true);
  wake();
  if (io_thread.joinable()) io_thread.join();
}

EngineClient::Impl::~Impl() {
  close();
  if (wake_fd >= 0) ::close(wake_fd);
}

void EngineClient::Impl::wake() {
  if (wake_fd < 0) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto written = ::write(wake_fd, &one, sizeof one);
}

void EngineClient::Impl::submit(Submission submission) {
  {
    std::lock_guard lock(queue_mutex);
    if (!queue_closed) {
      queue.push_back(std::move(submission));
      wake();
      return;
    }
  }
  // The IO thread is gone: nobody else will ever answer these calls.
  fail_submission(submission, "engine client is shutting down");
}

void EngineClient::generate(Generation generation) {
  std::vector<Generation> one;
  one.push_back(std::move(generation));
  generate_all(std::move(one));
}

void EngineClient::generate_all(std::vector<Generation> generations) {
  if (generations.empty()) return;
  {
    std::lock_guard lock(impl_->queue_mutex);
    if (!impl_->queue_closed) {
      // One wake-up per batch: the IO thread takes the whole queue at once. Pushed under one
      // lock, a group stays together in the queue.
      const bool first = impl_->generations.empty() && impl_->aborts.empty();
      for (Generation& generation : generations) {
        impl_->generations.push_back(std::move(generation));
      }
      impl_->generations_waiting.store(true, std::memory_order_relaxed);
      if (first) impl_->wake();
      return;
    }
  }
  for (Generation& generation : generations) {
    generation.sink->on_closed(Closed::kShutdown, "engine client is shutting down");
  }
}

void EngineClient::abort(std::vector<std::string> request_ids) {
  std::lock_guard lock(impl_->queue_mutex);
  if (impl_->queue_closed || request_ids.empty()) return;
  const bool first = impl_->generations.empty() && impl_->aborts.empty();
  impl_->aborts.insert(impl_->aborts.end(), std::make_move_iterator(request_ids.begin()),
                       std::make_move_iterator(request_ids.end()));
  if (first) impl_->wake();
}

std::vector<EngineLoad> EngineClient::loads() const {
  std::lock_guard lock(impl_->loads_mutex);
  if (!impl_->published_loads.empty()) return impl_->published_loads;
  std::vector<EngineLoad> idle(static_cast<std::size_t>(impl_->options.data_parallel_size));
  for (std::size_t rank = 0; rank < idle.size(); ++rank) idle[rank].rank = static_cast<int>(rank);
  return idle;
}

void EngineClient::Impl::run_on_io_thread(std::function<void()> command) {
  std::lock_guard lock(queue_mutex);
  if (queue_closed) return;  // nothing left to change
  commands.push_back(std::move(command));
  wake();
}

void EngineClient::set_state_listener(StateListener listener) {
  auto shared = listener ? std::make_shared<const StateListener>(std::move(listener)) : nullptr;
  std::lock_guard lock(impl_->listener_mutex);
  impl_->state_listener = std::move(shared);
}

void EngineClient::mark_dead(int rank, std::string reason) {
  if (rank < 0 || rank >= impl_->options.data_parallel_size) return;
  Impl& io = *impl_;
  io.run_on_io_thread([&io, rank, reason = std::move(reason)] {
    io.mark_dead(io.engines[static_cast<std::size_t>(rank)], reason);
  });
}

const std::string& EngineClient::handshake_endpoint() const { return impl_->handshake_endpoint; }
const std::string& EngineClient::input_endpoint() const { return impl_->input_endpoint; }
const std::string& EngineClient::output_endpoint() const { return impl_->output_endpoint; }
int EngineClient::data_parallel_size() const { return impl_->options.data_parallel_size; }

std::uint64_t EngineClient::admissions() const { return impl_->admissions_total.load(); }

std::size_t EngineClient::pending_calls() const {
  return impl_->pending_count.load(std::memory_order_relaxed);
}

std::vector<EngineStatus> EngineClient::engines() const {
  std::lock_guard lock(impl_->state_mutex);
  std::vector<EngineStatus> statuses;
  for (const EngineSlot& slot : impl_->engines) statuses.push_back(slot.status);
  return statuses;
}

bool EngineClient::all_ready() const {
  std::lock_guard lock(impl_->state_mutex);
  for (const EngineSlot& slot : impl_->engines) {
    if (slot.status.state != EngineState::kReady) return false;
  }
  return true;
}

bool EngineClient::wait_all_ready(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->state_mutex);
  return impl_->state_changed.wait_for(lock, timeout, [this] {
    for (const EngineSlot& slot : impl_->engines) {
      if (slot.status.state != EngineState::kReady) return false;
    }
    return true;
  });
}

EngineReply EngineClient::call(int rank, std::string_view method, const ArgParts& args,
                               const CallOptions& options) {
  if (rank < 0 || rank >= impl_->options.data_parallel_size) {
    return {rank, tl::unexpected(CallError{CallErrorKind::kUnavailable,
                                           "no engine with rank " + std::to_string(rank)})};
  }
  return std::move(wait(submit({rank}, method, args, options, nullptr), options).front());
}

std::vector<EngineReply> EngineClient::call_all(std::string_view method, const ArgParts& args,
                                                const CallOptions& options) {
  return wait(submit(all_ranks(), method, args, options, nullptr), options);
}

void EngineClient::call_all_async(std::string_view method, const ArgParts& args,
                                  const CallOptions& options, Completion done) {
  submit(all_ranks(), method, args, options, std::move(done));
}

void EngineClient::call_ranks_async(const std::vector<int>& ranks, std::string_view method,
                                    const ArgParts& args, const CallOptions& options,
                                    Completion done) {
  for (const int rank : ranks) {
    if (rank < 0 || rank >= impl_->options.data_parallel_size) {
      std::vector<EngineReply> replies;
      replies.reserve(ranks.size());
      for (const int each : ranks) {
        replies.push_back(
            {each, tl::unexpected(CallError{CallErrorKind::kUnavailable,
                                            "no engine with rank " + std::to_string(each)})});
      }
      return done(std::move(replies));
    }
  }
  submit(ranks, method, args, options, std::move(done));
}

std::vector<int> EngineClient::all_ranks() const {
  std::vector<int> ranks(static_cast<std::size_t>(impl_->options.data_parallel_size));
  for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
  return ranks;
}

std::shared_ptr<Batch> EngineClient::submit(const std::vector<int>& ranks, std::string_view method,
                                            const ArgParts& args, const CallOptions& options,
                                            Completion done) {
  auto batch = std::make_shared<Batch>();
  batch->replies.resize(ranks.size());
  batch->filled.assign(ranks.size(), false);
  batch->remaining = ranks.size();
  batch->on_complete = std::move(done);
  for (std::size_t i = 0; i < ranks.size(); ++i) batch->replies[i].rank = ranks[i];

  Submission submission;
  submission.batch = batch;
  submission.method = std::string(method);
  submission.options = options;
  submission.deadline = Clock::now() + options.timeout;
  if (impl_->stopping.load()) {
    submission.calls.resize(ranks.size());
    for (std::size_t i = 0; i < ranks.size(); ++i) submission.calls[i].index = i;
    fail_submission(submission, "engine client is shutting down");
    return batch;
  }
  // Frames are built here, on the caller's thread, so a large payload is copied once and the
  // IO thread only moves it to the socket.
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    OutgoingCall call;
    call.index = i;
    call.rank = ranks[i];
    call.call_id = impl_->next_call_id.fetch_add(1);
    const std::string prefix = wire::utility_request_prefix(0, {call.call_id, false}, method);
    std::size_t size = prefix.size();
    for (const std::string_view part : args) size += part.size();
    call.payload.rebuild(size);
    util::advise_huge_pages(call.payload.data(), size);
    auto* out = static_cast<char*>(call.payload.data());
    out = std::copy(prefix.begin(), prefix.end(), out);
    for (const std::string_view part : args) out = std::copy(part.begin(), part.end(), out);
    submission.calls.push_back(std::move(call));
  }
  impl_->submit(std::move(submission));
  return batch;
}

// A blocking caller's wait. The IO thread enforces the deadline; the grace period only guards
// against a stuck client.
std::vector<EngineReply> EngineClient::wait(const std::shared_ptr<Batch>& batch,
                                            const CallOptions& options) {
  std::unique_lock lock(batch->mutex);
  const bool finished = batch->done.wait_for(lock, options.timeout + std::chrono::seconds(5),
                                             [&] { return batch->remaining == 0; });
  if (!finished) {
    for (std::size_t i = 0; i < batch->replies.size(); ++i) {
      if (batch->filled[i]) continue;
      batch->filled[i] = true;
      batch->replies[i].value = tl::unexpected(
          CallError{CallErrorKind::kTimeout, "engine client did not complete the call"});
    }
    batch->remaining = 0;
  }
  return std::move(batch->replies);
}

}  // namespace vllmd::engine
