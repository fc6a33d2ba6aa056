// The test main for the unit suites: doctest's, with two changes that keep a failure readable
// in CI's log, where only the head and tail of a failing suite's output are shown.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>

#include "common/util/log.hpp"

int main(int argc, char** argv) {
  // The engines' routine chatter (connecting, ready, expected call failures) drowns the
  // report; warnings and errors stay. VLLMD_TEST_LOG=info brings it back.
  vllmd::util::log::Level level = vllmd::util::log::Level::kWarning;
  if (const char* wanted = std::getenv("VLLMD_TEST_LOG")) {
    vllmd::util::log::parse_level(wanted, level);
  }
  vllmd::util::log::set_level(level);
  // Each failure printed as it happens, beside the log lines it belongs with, not in one
  // block when the buffer is flushed at exit.
  std::cout << std::unitbuf;
  doctest::Context context(argc, argv);
  return context.run();
}
