#pragma once
// Durations as settings give them (seconds, a double) and as messages say them ("1.5 s").

#include <chrono>
#include <string>

namespace vllmd::util {

// Seconds as milliseconds, what is below a millisecond dropped.
inline std::chrono::milliseconds milliseconds_of(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

inline std::string seconds_text(std::chrono::milliseconds duration) {
  const double seconds = static_cast<double>(duration.count()) / 1000.0;
  std::string text = std::to_string(seconds);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text + " s";
}

}  // namespace vllmd::util
