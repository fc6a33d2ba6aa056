#pragma once
// systemd's service notifications (Type=notify): READY=1 once vllmd listens and every engine
// is attached, STATUS= lines while it waits or when an engine drops, STOPPING=1 on shutdown,
// WATCHDOG=1 while a self-check over HTTP proves the server still answers. Without
// NOTIFY_SOCKET (not started by systemd) nothing is sent and no thread runs.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/engine/client.hpp"

namespace vllmd::daemon {

class Notifier {
 public:
  // `probe` performs one request against the running server and says whether it answered.
  Notifier(engine::EngineClient& engines, std::function<bool()> probe);
  ~Notifier();

  void start();      // after the server listens
  void stopping();   // STOPPING=1; stops the watch thread
  void reloading();  // RELOADING=1
  void reloaded();   // READY=1 again
  bool active() const { return active_; }

 private:
  void watch();
  std::string engines_status() const;

  engine::EngineClient& engines_;
  std::function<bool()> probe_;
  bool active_ = false;
  std::chrono::microseconds watchdog_{0};
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
};

}  // namespace vllmd::daemon
