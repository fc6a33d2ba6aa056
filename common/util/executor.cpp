#include "common/util/executor.hpp"

#include <pthread.h>

#include <future>
#include <memory>

namespace vllmd::util {

Executor::Executor(int threads, const std::string& name) {
  for (int i = 0; i < std::max(threads, 1); ++i) {
    threads_.emplace_back([this, name] {
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      work();
    });
  }
}

Executor::~Executor() { stop(); }

void Executor::post(Task task) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
}

Executor::TimerId Executor::post_at(Clock::time_point when, Task task) {
  TimerId id = 0;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return 0;
    id = next_timer_++;
    timers_.emplace(when, std::pair{id, std::move(task)});
  }
  // Every thread may be waiting for a later timer: one of them must look again.
  ready_.notify_one();
  return id;
}

bool Executor::cancel(TimerId id) {
  std::lock_guard lock(mutex_);
  for (auto it = timers_.begin(); it != timers_.end(); ++it) {
    if (it->second.first == id) {
      timers_.erase(it);
      return true;
    }
  }
  return false;
}

std::size_t Executor::queued() const {
  std::lock_guard lock(mutex_);
  return tasks_.size();
}

bool Executor::responsive(std::chrono::milliseconds timeout) {
  auto ran = std::make_shared<std::promise<void>>();
  std::future<void> done = ran->get_future();
  post([ran] { ran->set_value(); });
  return done.wait_for(timeout) == std::future_status::ready;
}

void Executor::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    tasks_.clear();
    timers_.clear();
  }
  ready_.notify_all();
  for (std::thread& thread : threads_) {
    if (thread.joinable() && thread.get_id() != std::this_thread::get_id()) thread.join();
  }
  threads_.clear();
}

void Executor::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stopping_) return;
    const Clock::time_point now = Clock::now();
    if (!timers_.empty() && timers_.begin()->first <= now) {
      Task task = std::move(timers_.begin()->second.second);
      timers_.erase(timers_.begin());
      lock.unlock();
      task();
      lock.lock();
      continue;
    }
    if (!tasks_.empty()) {
      Task task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      continue;
    }
    if (timers_.empty()) {
      ready_.wait(lock);
    } else {
      // A copy: wait_until reads it again after waking, when the timer may be gone.
      const Clock::time_point next = timers_.begin()->first;
      ready_.wait_until(lock, next);
    }
  }
}

}  // namespace vllmd::util
