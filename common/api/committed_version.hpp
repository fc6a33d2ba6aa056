#pragma once
// The weight version last committed on the engines, for the weight versions each generated
// token is labelled with (docs/http-api.md §9.7). The weight-sync service writes it when a
// commit succeeds; every rollout reads it once per engine step that brought tokens: one
// atomic load, and the version's text (under a lock) only when a commit happened since.
// Before any commit it is "default", the version a freshly started engine holds.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace vllmd::api {

class CommittedVersion {
 public:
  void commit(const std::string& version) {
    auto text = std::make_shared<const std::string>(version);
    std::lock_guard lock(mutex_);
    version_ = std::move(text);
    epoch_.fetch_add(1, std::memory_order_release);
  }
  // Grows by one with every commit.
  std::uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }
  std::shared_ptr<const std::string> version() const {
    std::lock_guard lock(mutex_);
    return version_;
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const std::string> version_ = std::make_shared<const std::string>("default");
  std::atomic<std::uint64_t> epoch_{1};
};

}  // namespace vllmd::api
