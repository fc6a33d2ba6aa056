#include "daemon/notify.hpp"

#include <systemd/sd-daemon.h>

#include <cstdlib>

#include "common/util/log.hpp"

namespace vllmd::daemon {

namespace {
void notify(const std::string& state) { sd_notify(0, state.c_str()); }
}  // namespace

Notifier::Notifier(engine::EngineClient& engines, std::function<bool()> probe)
    : engines_(engines), probe_(std::move(probe)) {
  active_ = std::getenv("NOTIFY_SOCKET") != nullptr;
  std::uint64_t usec = 0;
  if (active_ && sd_watchdog_enabled(0, &usec) > 0) watchdog_ = std::chrono::microseconds(usec);
}

Notifier::~Notifier() { stopping(); }

void Notifier::start() {
  if (!active_) return;
  if (watchdog_.count() > 0) {
    util::log::info("systemd watchdog every ", watchdog_.count() / 1000, " ms");
  }
  thread_ = std::thread([this] { watch(); });
}

void Notifier::stopping() {
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (active_) notify("STOPPING=1\nSTATUS=draining in-flight requests");
}

void Notifier::reloading() {
  if (active_) notify("RELOADING=1\nSTATUS=reloading the configuration");
}

void Notifier::reloaded() {
  if (active_) notify("READY=1\nSTATUS=" + engines_status());
}

std::string Notifier::engines_status() const {
  int ready = 0;
  std::string waiting;
  const auto engines = engines_.engines();
  for (const auto& engine : engines) {
    if (engine.state == engine::EngineState::kReady) {
      ++ready;
      continue;
    }
    // "waiting for rank 0", "rank 1 loading", "rank 2 disconnected", ...
    const std::string rank = "rank " + std::to_string(engine.rank);
    waiting += (waiting.empty() ? "" : ", ") +
               (engine.state == engine::EngineState::kWaiting
                    ? "waiting for " + rank
                    : rank + " " + std::string(engine::state_name(engine.state)));
  }
  std::string status =
      std::to_string(ready) + "/" + std::to_string(engines.size()) + " engine(s) attached";
  if (!waiting.empty()) status += "; " + waiting;
  return status;
}

void Notifier::watch() {
  // Half the watchdog period, as systemd recommends; a quarter second otherwise.
  const auto period =
      watchdog_.count() > 0
          ? std::min<std::chrono::microseconds>(watchdog_ / 2, std::chrono::seconds(1))
          : std::chrono::microseconds(std::chrono::milliseconds(250));
  bool ready_sent = false;
  std::string last_status;
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    std::string state;
    const std::string status = engines_status();
    if (!ready_sent && engines_.all_ready()) {
      state += "READY=1\n";
      ready_sent = true;
    }
    if (status != last_status) {
      state += "STATUS=" + status + "\n";
      last_status = status;
    }
    // The watchdog is fed only when the server answered a real request just now: a wedged
    // worker pool or acceptor stops it, and systemd restarts vllmd.
    if (watchdog_.count() > 0 && probe_()) state += "WATCHDOG=1\n";
    if (!state.empty()) notify(state);
    if (!ready_sent) {
      // Woken by the last engine's admission itself: READY=1 follows it at once.
      engines_.wait_all_ready(std::chrono::duration_cast<std::chrono::milliseconds>(period));
      lock.lock();
      continue;
    }
    lock.lock();
    wake_.wait_for(lock, period, [this] { return stop_; });
  }
}

}  // namespace vllmd::daemon
