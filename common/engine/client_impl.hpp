#pragma once
// Private to the engine client: the state its IO thread owns and the hand-over structures
// between caller threads and that thread. See client.hpp for the behaviour.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>

#include "common/engine/client.hpp"
#include "common/engine/engine_requests.hpp"
#include "common/engine/session_affinity.hpp"
#include "common/wire/generation_output.hpp"

namespace vllmd::engine {

using Clock = std::chrono::steady_clock;

// The replies of one call, filled by the IO thread: awaited by a blocking caller, or handed
// to the completion of an asynchronous one when the last reply is in.
struct Batch {
  std::mutex mutex;
  std::condition_variable done;
  std::vector<EngineReply> replies;
  std::vector<bool> filled;
  std::size_t remaining = 0;
  EngineClient::Completion on_complete;  // empty for blocking calls

  void complete(std::size_t index, tl::expected<std::string, CallError> value);
};

struct OutgoingCall {
  std::size_t index = 0;  // into Batch::replies
  int rank = 0;
  std::uint64_t call_id = 0;
  zmq::message_t payload;
};

struct Submission {
  std::shared_ptr<Batch> batch;
  std::string method;
  std::vector<OutgoingCall> calls;
  CallOptions options;
  Clock::time_point deadline;
};

void fail_submission(Submission& submission, const std::string& message);

struct PendingCall {
  std::shared_ptr<Batch> batch;  // null for a probe, which no caller waits for
  std::size_t index = 0;
  int rank = 0;
  std::string method;
  CallOptions options;
  Clock::time_point deadline;
};

constexpr std::size_t kDrainBatch = 256;  // messages per socket per round, for fairness
// Frames of one output message: the EngineCoreOutputs and one per large logprob array.
constexpr std::size_t kMaxOutputFrames = 1U << 16;

// Receives one multipart message without blocking; extra frames beyond `frames` are dropped.
inline bool receive(zmq::socket_t& socket, std::vector<zmq::message_t>& parts, std::size_t frames) {
  parts.clear();
  zmq::message_t part;
  if (!socket.recv(part, zmq::recv_flags::dontwait)) return false;
  for (;;) {
    const bool more = part.more();
    if (parts.size() < frames) parts.push_back(std::move(part));
    if (!more) return true;
    part = zmq::message_t();
    (void)socket.recv(part);  // the rest of a multipart message is already here
  }
}

// The connection a message came in on (ZMQ_SRCFD), or -1 when libzmq does not know it.
inline int source_fd(const zmq::message_t& message) {
  return zmq_msg_get(const_cast<zmq_msg_t*>(message.handle()), ZMQ_SRCFD);
}

inline std::string_view view(const zmq::message_t& message) {
  return {static_cast<const char*>(message.data()), message.size()};
}

// Utility outputs no call asked for: elastic EP notifications (-1) and fault-tolerance
// status (-2) (docs/engine-protocol.md §4.4). They are not replies and must never be taken for
// one.
bool is_unsolicited(const wire::CallId& call_id);

// Which of the two monitored sockets a connection event is about.
enum class Link { kHandshake, kInput };

// One engine slot (a DP rank) as the IO thread tracks it across restarts.
struct EngineSlot {
  EngineStatus status;
  std::string identity;
  bool got_ready = false;
  bool got_registration = false;
  Clock::time_point startup_deadline = Clock::time_point::max();
  bool startup_timed_out = false;  // dead for it, yet a late READY is still admitted
  bool input_lost = false;         // its input connection dropped before it was admitted
  int handshake_fd = -1;           // connection fds (ZMQ_SRCFD) tie monitor events to engines
  int input_fd = -1;
  int output_fd = -1;
  bool dead_by_timeout = false;
  std::deque<std::uint64_t> timed_out_calls;  // a late reply to one of these revives the engine
  std::size_t calls_in_flight = 0;            // callers' calls, not probes
  std::size_t probes_in_flight = 0;
  std::size_t requests_in_flight = 0;  // generations: not calls, they never hold a probe back
  wire::SchedulerStats stats;          // from its latest scheduler_stats
  Clock::time_point next_probe = Clock::time_point::max();
};

// Sets a flag for a scope, unless it is already set: the drains and event handlers below
// call one another but must never re-enter themselves.
class Reentry {
 public:
  explicit Reentry(bool& flag) : flag_(flag), entered_(!flag) { flag_ = true; }
  ~Reentry() {
    if (entered_) flag_ = false;
  }
  Reentry(const Reentry&) = delete;
  Reentry& operator=(const Reentry&) = delete;
  bool entered() const { return entered_; }

 private:
  bool& flag_;
  bool entered_;
};

struct EngineClient::Impl {
  ClientOptions options;
  zmq::context_t context;
  zmq::socket_t handshake;
  zmq::socket_t input;
  zmq::socket_t output;
  zmq::socket_t handshake_monitor;
  zmq::socket_t input_monitor;
  std::string handshake_endpoint;  // as bound
  std::string input_endpoint;      // as advertised in INIT
  std::string output_endpoint;
  std::string init_message;
  int wake_fd = -1;

  std::atomic<bool> stopping{false};
  std::atomic<std::uint64_t> next_call_id{1};
  std::thread io_thread;

  // Engine slots: written by the IO thread, read by callers, under state_mutex.
  mutable std::mutex state_mutex;
  mutable std::condition_variable state_changed;
  std::vector<EngineSlot> engines;
  std::atomic<std::uint64_t> admissions_total{0};  // the engines' admissions, summed

  std::mutex listener_mutex;
  std::shared_ptr<const StateListener> state_listener;  // copied out, then called unlocked

  std::mutex queue_mutex;
  std::deque<Submission> queue;
  std::deque<std::function<void()>> commands;  // for the IO thread (mark_dead)
  std::deque<Generation> generations;          // ADDs to send
  // Set while `generations` is not empty: the IO thread looks between a step's deliveries.
  std::atomic<bool> generations_waiting{false};
  std::vector<std::string> aborts;  // ids to abort
  bool queue_closed = false;        // the IO thread has stopped taking submissions

  // The engines' loads as of the IO thread's last round, for loads().
  mutable std::mutex loads_mutex;
  std::vector<EngineLoad> published_loads;

  // IO thread only.
  struct InFlight {
    int rank = 0;
    std::shared_ptr<RequestSink> sink;
    bool started = false;  // an output came for it
  };
  // Looked up by the string_view an output holds: no string is built per output.
  struct IdHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view id) const { return std::hash<std::string_view>{}(id); }
  };
  // Generations, by engine request id.
  using RequestTable = std::unordered_map<std::string, InFlight, IdHash, std::equal_to<>>;
  RequestTable requests;
  // on_outputs' second pass, reused message after message. Pointers, not iterators: ADDs
  // sent meanwhile may rehash the table, which moves no element.
  std::vector<std::pair<InFlight*, const wire::OutputView*>> later;
  SessionAffinity sessions{ClientOptions{}.session_imbalance};
  std::vector<SessionAffinity::Candidate> candidates;  // choose_engine's, reused
  int previous_rank = -1;  // where the last generation went (-1: refused), for followers
  // The message being handed on, decoded into the same vectors message after message.
  wire::DecodedOutputs received;
  bool loads_changed = false;
  std::unordered_map<std::uint64_t, PendingCall> pending;
  std::size_t probes_pending = 0;
  std::atomic<std::size_t> pending_count{0};  // callers' pending calls after each IO round
  // Input connections accepted, still open, that no engine is known to use: after a
  // reconnect, when only one is left, it is the reconnected engine's.
  std::set<int> fresh_input_fds;
  bool draining_handshake = false;  // Reentry flags
  bool draining_input = false;
  bool reading_handshake_events = false;
  bool reading_input_events = false;

  std::mutex close_mutex;

  ~Impl();
  void close();
  void submit(Submission submission);
  void run_on_io_thread(std::function<void()> command);
  void wake();

  // The IO thread: calls and replies (client_io.cpp).
  void run();
  void take_submissions();
  void send_call(const Submission& submission, OutgoingCall& call);
  std::optional<std::string> refusal(const EngineSlot& engine, const CallOptions& call) const;
  int send_utility(EngineSlot& engine, zmq::message_t& payload);
  int send_message(EngineSlot& engine, wire::RequestType type, zmq::message_t& payload);
  void add_pending(std::uint64_t call_id, PendingCall call);
  PendingCall take_pending(std::unordered_map<std::uint64_t, PendingCall>::iterator found);
  void drain_output();
  void on_core_dead(int fd);
  void on_reply(const wire::UtilityOutput& reply, std::int64_t engine_index, int fd);
  void on_late_reply(std::uint64_t call_id);
  void fail_pending(int rank, CallErrorKind kind, const std::string& message);
  void expire(Clock::time_point now);
  int poll_timeout_ms(Clock::time_point now) const;
  void shut_down();

  // Generations (client_requests.cpp).
  void send_generation(Generation& generation);
  InFlight take_request(RequestTable::iterator found);
  EngineSlot* choose_engine(const Generation& generation, std::string& why);
  void send_aborts(const std::vector<std::string>& ids);
  void deliver(InFlight& request, const wire::OutputView& delta);
  void send_waiting_generations();
  void on_outputs(const wire::DecodedOutputs& decoded);
  void end_requests(int rank, Closed why, const std::string& message);
  void publish_loads();

  // Handshakes and connection events (client_handshake.cpp).
  void drain_input();
  void drain_handshake();
  void read_events(Link link);
  void on_connection_event(Link link, std::uint16_t event, int fd);
  void on_input_dropped(int fd);
  void on_handshake_dropped(int fd);
  EngineSlot* slot_for_identity(std::string_view identity);
  EngineSlot* slot_with(int EngineSlot::*field, int fd);
  int unique_fd(int fd, int EngineSlot::*field, const EngineSlot& engine) const;
  void on_hello(EngineSlot& engine, int fd);
  void on_ready(EngineSlot& engine);
  void on_registration(EngineSlot& engine, std::string_view frame, int fd);
  void admit_if_complete(EngineSlot& engine);
  void expire_startups(Clock::time_point now);

  // States and probes (client_liveness.cpp).
  void set_state(EngineSlot& engine, EngineState state, std::string reason);
  void mark_dead(EngineSlot& engine, const std::string& reason, bool by_timeout = false);
  void mark_disconnected(EngineSlot& engine, const std::string& reason);
  void revive(EngineSlot& engine, std::string_view why);
  void drop_probes(int rank);
  bool wants_probe(const EngineSlot& engine) const;  // as soon as next_probe comes
  void send_probes(Clock::time_point now);
  void send_probe(EngineSlot& engine, Clock::time_point now);
  void on_probe_answer(EngineSlot& engine);
  void on_probe_timeout(EngineSlot& engine);
  void claim_fresh_input_fd(EngineSlot& engine);
};

}  // namespace vllmd::engine
