#pragma once
// Where exchanges drop their responses for the event loop, from any thread: a locked queue
// and an eventfd that wakes the loop only when the queue turns non-empty.

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace vllmd::daemon::http {

struct Mailbox {
  // What follows a delivery's bytes on its connection.
  enum class Then : std::uint8_t {
    kMore,   // more of the same response
    kNext,   // the response is complete: serve the next request
    kClose,  // the response is complete: close once it is written
    kCut,    // drop the connection now, unwritten bytes and all
  };
  struct Delivery {
    std::uint64_t connection;
    std::string bytes;
    Then then;
  };

  int wake_fd = -1;
  std::atomic<std::thread::id> loop;
  std::atomic<bool> stopping{false};
  std::atomic<bool> pending{false};  // posted since the loop last drained: it skips the lock
  std::mutex mutex;
  std::vector<Delivery> deliveries;
  std::vector<std::function<void()>> tasks;
  bool open = true;

  void post(Delivery delivery) { put(deliveries, std::move(delivery)); }
  void post(std::function<void()> task) { put(tasks, std::move(task)); }

  void wake() const {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(wake_fd, &one, sizeof one);
  }

  // The loop drains the mailbox after every round of events: it needs no wake-up from
  // itself, and one wake-up covers everything posted until it drains. `pending` is set
  // before the wake-up: a loop that runs the moment it is woken must find it set, or it
  // goes back to sleep with the post unseen. Under the lock, so the descriptor cannot be
  // closed meanwhile.
  template <typename Item> void put(std::vector<Item>& queue, Item item) {
    std::lock_guard lock(mutex);
    if (!open) return;
    const bool idle = deliveries.empty() && tasks.empty();
    queue.push_back(std::move(item));
    pending = true;
    if (idle && std::this_thread::get_id() != loop.load()) wake();
  }
};

}  // namespace vllmd::daemon::http
