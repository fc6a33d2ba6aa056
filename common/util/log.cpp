#include "common/util/log.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace vllmd::util::log {

namespace {
std::atomic<Level> current_level{Level::kInfo};
std::mutex write_mutex;
// A fixed buffer, not a std::string: a static initializer must not be able to throw.
char component[32] = "vllmd";
const bool kUnderJournald = std::getenv("JOURNAL_STREAM") != nullptr;

constexpr const char* kNames[] = {"trace",   "debug", "info",    "notice",
                                  "warning", "error", "critical"};
// syslog priorities: debug=7 info=6 notice=5 warning=4 err=3 crit=2
constexpr int kPriorities[] = {7, 7, 6, 5, 4, 3, 2};
}  // namespace

void set_level(Level level) { current_level.store(level); }
Level level() { return current_level.load(); }
bool enabled(Level level) { return level >= current_level.load(std::memory_order_relaxed); }

bool parse_level(std::string_view text, Level& level) {
  for (int i = 0; i < 7; ++i) {
    if (text == kNames[i]) {
      level = static_cast<Level>(i);
      return true;
    }
  }
  if (text == "warn")
    level = Level::kWarning;
  else if (text == "fatal")
    level = Level::kCritical;
  else
    return false;
  return true;
}

void set_component(std::string_view name) {
  std::lock_guard lock(write_mutex);
  const std::size_t size = std::min(name.size(), sizeof component - 1);
  name.copy(component, size);
  component[size] = '\0';
}

void write(Level level, std::string_view message) {
  const int index = static_cast<int>(level);
  std::lock_guard lock(write_mutex);
  if (kUnderJournald) {
    std::fprintf(stderr, "<%d>%.*s\n", kPriorities[index], static_cast<int>(message.size()),
                 message.data());
  } else {
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    const auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
        1000;
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
    std::fprintf(stderr, "%s.%03dZ %s %s: %.*s\n", stamp, static_cast<int>(millis), component,
                 kNames[index], static_cast<int>(message.size()), message.data());
  }
  std::fflush(stderr);
}

std::string escaped(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte > 0x20 && byte < 0x7f && byte != '\\' && byte != '"') {
      out.push_back(c);
    } else {
      out.append({'\\', 'x', kHex[byte >> 4], kHex[byte & 0xf]});
    }
  }
  return out;
}

}  // namespace vllmd::util::log
