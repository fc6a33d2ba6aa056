#pragma once
// A child process for integration tests: started with posix_spawn, killed and reaped by its
// destructor so nothing outlives the test that started it.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace vllmd::testing {

class ChildProcess {
 public:
  ChildProcess() = default;
  explicit ChildProcess(std::vector<std::string> argv) { start(std::move(argv)); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_) { other.pid_ = -1; }
  ChildProcess& operator=(ChildProcess&& other) noexcept {
    if (this != &other) {
      kill_and_reap();
      pid_ = other.pid_;
      other.pid_ = -1;
    }
    return *this;
  }
  ~ChildProcess() { kill_and_reap(); }

  void start(std::vector<std::string> argv) {
    kill_and_reap();
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (std::string& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], nullptr, nullptr, args.data(), environ) != 0) {
      pid_ = -1;
      throw std::runtime_error("cannot spawn " + argv[0]);
    }
  }

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  void signal(int number) const {
    if (pid_ > 0) ::kill(pid_, number);
  }

  // Waits for the child to exit; its exit status (or 128+signal), nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      const pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::nullopt;
  }

  void kill_and_reap() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace vllmd::testing
