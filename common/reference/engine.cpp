#include "common/reference/engine.hpp"

#include <exception>
#include <utility>

#include "common/reference/connection.hpp"
#include "common/util/log.hpp"

namespace vllmd::reference {

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
