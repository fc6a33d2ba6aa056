#pragma once
// Weight-sync lifecycle calls run one at a time, in arrival order, without a thread waiting
// for its turn: a job starts when the previous one says it finished (from whatever thread
// its last engine reply completed on). A job that waits longer than its limit is dropped
// from the queue and told so instead.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "common/util/executor.hpp"

namespace vllmd::api {

class SerialQueue {
 public:
  // Call exactly once, when the job's last step is done.
  using Finished = std::function<void()>;
  using Job = std::function<void(Finished)>;

  // `executor` starts queued jobs (so a job never starts on the thread that finished the
  // previous one, e.g. an engine's IO thread) and runs the wait limits; without one, queued
  // jobs start on the finishing thread and wait forever.
  explicit SerialQueue(util::Executor* executor) : executor_(executor) {}

  // Runs `job` now when nothing runs, else once everything queued before it finished; or
  // `expired` when that takes longer than `limit`.
  void run(Job job, std::chrono::milliseconds limit, std::function<void()> expired);
  std::size_t waiting() const;

 private:
  struct Waiting {
    std::uint64_t id;
    Job job;
    util::Executor::TimerId timer;
  };
  void finished();
  void expire(std::uint64_t id, const std::function<void()>& expired);
  Finished finisher();

  util::Executor* executor_;
  mutable std::mutex mutex_;
  bool busy_ = false;
  std::deque<Waiting> waiting_;
  std::uint64_t next_id_ = 1;
};

}  // namespace vllmd::api
