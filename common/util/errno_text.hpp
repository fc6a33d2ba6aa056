#pragma once
// An errno value as text ("Address already in use"), safe from any thread: strerror() may
// share one buffer between threads, strerror_r() writes into ours.

#include <cstring>
#include <string>

namespace vllmd::util {

inline std::string errno_text(int error) {
  char buffer[128];
  // GNU strerror_r: returns the text, in `buffer` or in static storage.
  return ::strerror_r(error, buffer, sizeof buffer);
}

}  // namespace vllmd::util
