#pragma once

namespace vllmd::vllmctl {
// vllmctl's whole life: parse the command line, run one command. Returns the exit status.
int run(int argc, const char* const* argv);
}  // namespace vllmd::vllmctl
