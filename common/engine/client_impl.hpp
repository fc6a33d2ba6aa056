#pragma once
// Private to the engine client: the state its IO thread owns and the hand-over structures
// between caller threads and that thread. See client.hpp for the behaviour.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>

#include "common/engine/client.hpp"

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
  std::shared_ptr<Batch> batch;
  std::size_t index = 0;
  int rank = 0;
  std::string method;
  CallOptions options;
  Clock::time_point deadline;
};

// One engine slot (a DP rank) as the IO thread tracks it across restarts.
struct EngineSlot {
  EngineStatus status;
  std::string identity;
  bool got_ready = false;
  bool got_registration = false;
  Clock::time_point ready_deadline;
  int handshake_fd = -1;  // connection fds (ZMQ_SRCFD) tie monitor events to engines
  int input_fd = -1;
  int output_fd = -1;
  bool dead_by_timeout = false;
  std::deque<std::uint64_t> timed_out_calls;  // a late reply to one of these revives the engine
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

  std::mutex queue_mutex;
  std::deque<Submission> queue;
  bool queue_closed = false;  // the IO thread has stopped taking submissions

  // IO thread only.
  std::unordered_map<std::uint64_t, PendingCall> pending;
  std::atomic<std::size_t> pending_count{0};  // pending.size() after each IO round, for all

  std::mutex close_mutex;

  ~Impl();
  void close();
  void submit(Submission submission);
  void wake();

  // The IO thread (client_io.cpp).
  void run();
  void take_submissions();
  void send_call(const Submission& submission, OutgoingCall& call);
  void drain_output();
  void drain_input();
  void drain_handshake();
  void drain_monitor(zmq::socket_t& monitor, bool is_input);
  int unique_fd(int fd, int EngineSlot::*field, const EngineSlot& engine) const;
  void on_hello(EngineSlot& engine, int fd);
  void on_ready(EngineSlot& engine);
  void on_registration(EngineSlot& engine, std::string_view frame, int fd);
  void on_reply(const wire::EngineCoreOutputs& outputs, int fd);
  void admit_if_complete(EngineSlot& engine);
  void set_state(EngineSlot& engine, EngineState state, std::string reason);
  void mark_dead(EngineSlot& engine, const std::string& reason, bool by_timeout = false);
  void fail_pending(int rank, CallErrorKind kind, const std::string& message);
  void expire(Clock::time_point now);
  int poll_timeout_ms(Clock::time_point now) const;
  EngineSlot* slot_for_identity(std::string_view identity);
  void shut_down();
};

}  // namespace vllmd::engine
