#pragma once

namespace vllmd::daemon {
// vllmd's whole life: configuration, engines, HTTP server, signals. Returns the exit status.
int run(int argc, const char* const* argv);
}  // namespace vllmd::daemon
