#pragma once
// Durations as people read them in messages: "1.5 s", "300 s".

#include <chrono>
#include <string>

namespace vllmd {

inline std::string seconds_text(std::chrono::milliseconds duration) {
  const double seconds = static_cast<double>(duration.count()) / 1000.0;
  std::string text = std::to_string(seconds);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text + " s";
}

}  // namespace vllmd
