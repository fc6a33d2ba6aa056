#pragma once
// Minimal leveled logging to stderr, one line per call, safe from any thread.
// Under journald (JOURNAL_STREAM set) lines carry "<N>" syslog priority prefixes and no
// timestamps, since journald adds its own; elsewhere they carry a UTC timestamp.

#include <sstream>
#include <string>
#include <string_view>

namespace vllmd::util::log {

enum class Level { kTrace = 0, kDebug, kInfo, kNotice, kWarning, kError, kCritical };

void set_level(Level level);
Level level();
bool enabled(Level level);
// Parses trace|debug|info|notice|warning|error|critical (also warn, fatal).
bool parse_level(std::string_view text, Level& level);
void set_component(std::string_view name);  // e.g. "vllmd", shown when not under journald

void write(Level level, std::string_view message);

// Client-controlled text made safe for one log line: every byte outside visible ASCII, and
// `\` and `"`, becomes \xHH, so a request cannot forge lines or smuggle terminal escapes.
std::string escaped(std::string_view text);

template <typename... Parts> void emit(Level at, const Parts&... parts) {
  if (!enabled(at)) return;
  std::ostringstream line;
  (line << ... << parts);
  write(at, line.str());
}

template <typename... Parts> void trace(const Parts&... p) { emit(Level::kTrace, p...); }
template <typename... Parts> void debug(const Parts&... p) { emit(Level::kDebug, p...); }
template <typename... Parts> void info(const Parts&... p) { emit(Level::kInfo, p...); }
template <typename... Parts> void notice(const Parts&... p) { emit(Level::kNotice, p...); }
template <typename... Parts> void warning(const Parts&... p) { emit(Level::kWarning, p...); }
template <typename... Parts> void error(const Parts&... p) { emit(Level::kError, p...); }

}  // namespace vllmd::util::log
