#pragma once
// A few threads for short tasks that must not run on an event loop (transcoding a large
// request body, building frames) and for timers. Tasks never wait for engines or clients:
// whatever waits is a continuation that some completion posts here.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace vllmd::util {

class Executor {
 public:
  using Clock = std::chrono::steady_clock;
  using Task = std::function<void()>;
  using TimerId = std::uint64_t;

  // `name` becomes the threads' name (15 characters at most, for /proc/PID/task/*/comm).
  Executor(int threads, const std::string& name);
  ~Executor();  // stop()
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void post(Task task);
  // Runs `task` at `when` (or soon after) unless cancelled first.
  TimerId post_at(Clock::time_point when, Task task);
  // Whether the timer was still pending (and now never runs).
  bool cancel(TimerId id);
  // Tasks waiting for a thread (timers not counted).
  std::size_t queued() const;
  // Whether a task posted now runs within `timeout`: the threads are not all stuck.
  bool responsive(std::chrono::milliseconds timeout);
  // Runs nothing more (queued tasks and timers are dropped) and joins the threads.
  void stop();

 private:
  void work();

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Task> tasks_;
  std::multimap<Clock::time_point, std::pair<TimerId, Task>> timers_;
  TimerId next_timer_ = 1;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace vllmd::util
