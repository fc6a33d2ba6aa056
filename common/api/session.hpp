#pragma once
// The weight-update session as vllmd knows it: whether one is open on the engines, which
// client owns it, and which engine incarnations it runs on.
//
// A client that sends `Vllmd-Session: <id>` with its start owns the session it opens: update
// and finish from another id, or from none, get 409 while it is open, so two trainers can no
// longer mix their calls into one session. Clients that never send the header keep vLLM's
// behaviour exactly: an anonymous session anyone may continue. An owned session left idle
// for `idle_limit` becomes anonymous (a crashed trainer's session can then be closed).
//
// All lifecycle calls run one at a time (SerialQueue), so only one caller changes the
// session at once; reads (the status route) may come from any thread.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/api/errors.hpp"

namespace vllmd::api {

struct SessionSnapshot {
  bool open = false;
  bool owned = false;
  bool draft = false;
  double age_seconds = 0;
  double idle_seconds = 0;
  std::uint64_t updates = 0;
  std::vector<std::uint64_t> incarnations;  // of the engines it runs on, by rank
  // False after weights changed (an update reached an engine) since a version was last
  // committed: the label does not describe the weights then.
  bool version_current = true;

  std::string json() const;
};

class Sessions {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Sessions(std::chrono::milliseconds idle_limit) : idle_limit_(idle_limit) {}

  // 409 when a session owned by another client is open (never naming that client's id).
  std::optional<ApiError> conflict(const std::optional<std::string>& client);
  bool is_open() const;
  // The incarnations the open session runs on (empty when none is open).
  std::vector<std::uint64_t> incarnations() const;

  void opened(const std::optional<std::string>& client, bool draft,
              std::vector<std::uint64_t> incarnations);
  // An update reached the engines (succeeded or not): the label no longer describes them.
  void updated(bool succeeded);
  void closed();     // finished, or closed by vllmd after a failure
  void committed();  // a version now labels the weights
  SessionSnapshot snapshot() const;

 private:
  void expire_idle_owner(Clock::time_point now);  // under mutex_

  std::chrono::milliseconds idle_limit_;
  mutable std::mutex mutex_;
  bool open_ = false;
  bool draft_ = false;
  std::optional<std::string> owner_;
  std::vector<std::uint64_t> incarnations_;
  Clock::time_point opened_at_{};
  Clock::time_point last_activity_{};
  std::uint64_t updates_ = 0;
  bool version_current_ = true;
};

// A client's session id from its Vllmd-Session header: 1-128 visible ASCII characters.
bool valid_session_id(std::string_view id);

}  // namespace vllmd::api
