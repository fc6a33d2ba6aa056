#include "common/api/serial_queue.hpp"

#include <atomic>
#include <memory>

namespace vllmd::api {

SerialQueue::Finished SerialQueue::finisher() {
  // Once only, whatever the job does: a second call must not start two jobs at once.
  auto called = std::make_shared<std::atomic<bool>>(false);
  return [this, called] {
    if (!called->exchange(true)) finished();
  };
}

void SerialQueue::run(Job job, std::chrono::milliseconds limit, std::function<void()> expired) {
  std::unique_lock lock(mutex_);
  if (!busy_) {
    busy_ = true;
    lock.unlock();
    job(finisher());
    return;
  }
  const std::uint64_t id = next_id_++;
  util::Executor::TimerId timer = 0;
  if (executor_ != nullptr) {
    timer = executor_->post_at(util::Executor::Clock::now() + limit,
                               [this, id, expired = std::move(expired)] { expire(id, expired); });
  }
  waiting_.push_back({id, std::move(job), timer});
}

void SerialQueue::expire(std::uint64_t id, const std::function<void()>& expired) {
  {
    std::lock_guard lock(mutex_);
    auto it = waiting_.begin();
    while (it != waiting_.end() && it->id != id) ++it;
    if (it == waiting_.end()) return;  // it started meanwhile
    waiting_.erase(it);
  }
  expired();
}

void SerialQueue::finished() {
  Waiting next;
  {
    std::lock_guard lock(mutex_);
    if (waiting_.empty()) {
      busy_ = false;
      return;
    }
    next = std::move(waiting_.front());
    waiting_.pop_front();
  }
  if (executor_ == nullptr) {
    next.job(finisher());
    return;
  }
  executor_->cancel(next.timer);
  executor_->post([this, job = std::move(next.job)] { job(finisher()); });
}

std::size_t SerialQueue::waiting() const {
  std::lock_guard lock(mutex_);
  return waiting_.size();
}

}  // namespace vllmd::api
