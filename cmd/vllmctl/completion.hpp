#pragma once
// Shell completion generated from vllmctl's CLI11 definition itself (bash, zsh, fish): every
// command and flag that --help lists completes, with the values its checks allow, and
// nothing else. `vllmctl completion SHELL` prints it; the package ships what it printed.

#include <string>
#include <string_view>

namespace CLI {
class App;
}

namespace vllmd::vllmctl {

inline constexpr std::string_view kShells[] = {"bash", "zsh", "fish"};

// The script for `shell` (one of kShells), ending with a newline.
std::string completion_script(const CLI::App& app, std::string_view shell);

}  // namespace vllmd::vllmctl
