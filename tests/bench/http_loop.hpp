#pragma once
// The engine of http_load: one epoll loop driving some keep-alive connections through a fixed
// request sequence, and the figures it collects. See http_load.cpp for what is counted.

#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/bench/http_response.hpp"

namespace vllmd::bench {

using Clock = std::chrono::steady_clock;

struct RequestSpec {
  std::string label;  // "POST /update_weights (41234567 bytes)"
  std::string head;   // request line and headers, through the empty line
  std::shared_ptr<const std::string> body;
};

// ---------------------------------------------------------------------------------------------
// Figures

struct StepStats {
  std::vector<double> micros;  // completed in the window
  std::map<int, std::uint64_t> status;
  std::string first_error;  // "500 <body>" of the first non-2xx response, for the reader

  void merge(const StepStats& other) {
    micros.insert(micros.end(), other.micros.begin(), other.micros.end());
    for (const auto& [code, count] : other.status) status[code] += count;
    if (first_error.empty()) first_error = other.first_error;
  }
};

constexpr std::size_t kErrorBodyChars = 300;

struct Stats {
  std::vector<StepStats> steps;
  std::uint64_t sequences = 0;
  std::uint64_t sequences_ok = 0;
  std::uint64_t connect_errors = 0;
  std::uint64_t io_errors = 0;
  std::uint64_t parse_errors = 0;
  std::uint64_t reconnects = 0;  // the server closed a connection after a response
  std::uint64_t unfinished = 0;
  double oldest_unfinished_us = 0;
  std::uint64_t stalled_connections = 0;
  Clock::time_point finished;

  void merge(const Stats& other) {
    steps.resize(std::max(steps.size(), other.steps.size()));
    for (std::size_t i = 0; i < other.steps.size(); ++i) steps[i].merge(other.steps[i]);
    sequences += other.sequences;
    sequences_ok += other.sequences_ok;
    connect_errors += other.connect_errors;
    io_errors += other.io_errors;
    parse_errors += other.parse_errors;
    reconnects += other.reconnects;
    unfinished += other.unfinished;
    oldest_unfinished_us = std::max(oldest_unfinished_us, other.oldest_unfinished_us);
    stalled_connections += other.stalled_connections;
    finished = std::max(finished, other.finished);
  }
};

// ---------------------------------------------------------------------------------------------
// One epoll loop driving some connections

struct Plan {
  sockaddr_in address{};
  std::vector<RequestSpec> requests;
  std::uint64_t iterations = 0;  // per connection; 0: until the deadline
  Clock::time_point measure_from;
  Clock::time_point deadline;
};

struct Connection {
  enum class State { kConnecting, kIdle, kSending, kReceiving, kDone };
  int fd = -1;
  State state = State::kConnecting;
  std::size_t step = 0;
  std::uint64_t iterations = 0;
  bool iteration_ok = true;
  std::size_t sent = 0;
  Clock::time_point started;
  std::string in;
  std::uint64_t completed_in_window = 0;
  std::uint64_t failures = 0;
};

constexpr std::uint64_t kMaxFailuresPerConnection = 100;

class Loop {
 public:
  Loop(const Plan& plan, int connections);
  ~Loop();
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;

  // Runs until the deadline or until every connection is done; then counts what is left.
  void run();
  const Stats& stats() const { return stats_; }

 private:
  enum class Progress { kDone, kBlocked, kFailed };

  std::size_t active() const;         // connections not done yet
  void open(Connection& connection);  // (re)connects; the request in flight is lost
  void finish_connect(Connection& connection);
  void close_socket(Connection& connection);
  void give_up(Connection& connection);

  // Sends, receives and completes requests until the socket would block.
  void drive(Connection& connection);
  Progress send_some(Connection& connection);
  // Reads what is there; kDone once a whole response was parsed into `response`.
  Progress receive_some(Connection& connection, ParsedResponse& response);
  void complete(Connection& connection, const ParsedResponse& response);
  // Moves to the next step; a finished sequence counts when its last step was in the window.
  void advance(Connection& connection, bool recorded);
  // The request in flight failed at the socket level: count it, then reconnect and go on
  // with the next step, unless this connection keeps failing.
  void fail(Connection& connection, bool parse_error);

  const Plan& plan_;
  std::vector<Connection> connections_;
  int epoll_ = -1;
  Stats stats_;
};

}  // namespace vllmd::bench
