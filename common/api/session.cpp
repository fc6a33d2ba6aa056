#include "common/api/session.hpp"

#include <algorithm>
#include <cstdio>

#include "common/util/duration.hpp"
#include "common/util/log.hpp"

namespace vllmd::api {

namespace {

double seconds_between(Sessions::Clock::time_point from, Sessions::Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", value);
  return text;
}

}  // namespace

std::string SessionSnapshot::json() const {
  std::string out = std::string("{\"open\":") + (open ? "true" : "false");
  if (open) {
    out += std::string(",\"owned\":") + (owned ? "true" : "false");
    out += std::string(",\"draft\":") + (draft ? "true" : "false");
    out += ",\"age_seconds\":" + number(age_seconds);
    out += ",\"idle_seconds\":" + number(idle_seconds);
    out += ",\"updates\":" + std::to_string(updates);
    out += ",\"engine_incarnations\":[";
    for (std::size_t i = 0; i < incarnations.size(); ++i) {
      out += (i > 0 ? "," : "") + std::to_string(incarnations[i]);
    }
    out += "]";
  }
  out += std::string(",\"version_current\":") + (version_current ? "true" : "false") + "}";
  return out;
}

bool valid_session_id(std::string_view id) {
  return !id.empty() && id.size() <= 128 &&
         std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 0x7f; });
}

void Sessions::expire_idle_owner(Clock::time_point now) {
  if (!open_ || !owner_ || now - last_activity_ < idle_limit_) return;
  util::log::notice("the weight-update session owned by a client idle for ",
                    util::seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(
                        now - last_activity_)),
                    " is now anonymous (server.session_idle_timeout): any client may continue or "
                    "finish it");
  owner_.reset();
}

std::optional<ApiError> Sessions::conflict(const std::optional<std::string>& client) {
  std::lock_guard lock(mutex_);
  expire_idle_owner(Clock::now());
  if (!open_ || !owner_ || owner_ == client) return std::nullopt;
  return api::conflict(
      "a weight-update session owned by another client is open (it sent another "
      "Vllmd-Session id); wait for it to finish, or for it to go idle for "
      "server.session_idle_timeout");
}

bool Sessions::is_open() const {
  std::lock_guard lock(mutex_);
  return open_;
}

std::vector<std::uint64_t> Sessions::incarnations() const {
  std::lock_guard lock(mutex_);
  return open_ ? incarnations_ : std::vector<std::uint64_t>{};
}

void Sessions::opened(const std::optional<std::string>& client, bool draft,
                      std::vector<std::uint64_t> incarnations) {
  std::lock_guard lock(mutex_);
  open_ = true;
  draft_ = draft;
  owner_ = client;
  incarnations_ = std::move(incarnations);
  opened_at_ = last_activity_ = Clock::now();
  updates_ = 0;
}

void Sessions::updated(bool succeeded) {
  std::lock_guard lock(mutex_);
  if (succeeded) ++updates_;
  last_activity_ = Clock::now();
  version_current_ = false;
}

void Sessions::closed() {
  std::lock_guard lock(mutex_);
  open_ = false;
  owner_.reset();
  incarnations_.clear();
}

void Sessions::committed() {
  std::lock_guard lock(mutex_);
  version_current_ = true;
}

SessionSnapshot Sessions::snapshot() const {
  std::lock_guard lock(mutex_);
  const auto now = Clock::now();
  SessionSnapshot snapshot;
  snapshot.open = open_;
  snapshot.owned = open_ && owner_ && now - last_activity_ < idle_limit_;
  snapshot.draft = draft_;
  snapshot.age_seconds = open_ ? seconds_between(opened_at_, now) : 0;
  snapshot.idle_seconds = open_ ? seconds_between(last_activity_, now) : 0;
  snapshot.updates = updates_;
  snapshot.incarnations = open_ ? incarnations_ : std::vector<std::uint64_t>{};
  snapshot.version_current = version_current_;
  return snapshot;
}

}  // namespace vllmd::api
