#pragma once
// Replies the reference engine sends later without blocking: at a time (the --inject-hold
// fault), or once no request runs any more, the way vLLM answers pause_scheduler(mode="wait")
// only when the pause completes while its busy loop goes on serving. Frames due at the same
// time, or when idle, go in the order they were held.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace vllmd::reference {

class HeldReplies {
 public:
  using Clock = std::chrono::steady_clock;

  void hold(Clock::time_point due, std::string frame) {
    frames_.emplace(Key{due, next_sequence_++}, std::move(frame));
  }

  std::optional<Clock::time_point> next_due() const {
    if (frames_.empty()) return std::nullopt;
    return frames_.begin()->first.first;
  }

  // The frames due by `now`, earliest first.
  std::vector<std::string> take_due(Clock::time_point now) {
    std::vector<std::string> due;
    while (!frames_.empty() && frames_.begin()->first.first <= now) {
      due.push_back(std::move(frames_.begin()->second));
      frames_.erase(frames_.begin());
    }
    return due;
  }

  void hold_until_idle(std::string frame) { when_idle_.push_back(std::move(frame)); }
  std::vector<std::string> take_when_idle() { return std::exchange(when_idle_, {}); }

  std::size_t size() const { return frames_.size() + when_idle_.size(); }

 private:
  using Key = std::pair<Clock::time_point, std::uint64_t>;  // due, then arrival order
  std::map<Key, std::string> frames_;
  std::vector<std::string> when_idle_;
  std::uint64_t next_sequence_ = 0;
};

}  // namespace vllmd::reference
