#pragma once
// vllmctl's commands for the API table's routes: every row with a Cli command becomes a
// subcommand whose arguments, help and success line come from the row (common/api/table).

#include <functional>
#include <utility>
#include <vector>

#include "cmd/vllmctl/context.hpp"

namespace CLI {
class App;
}

namespace vllmd::vllmctl {

using Command = std::function<int(const Context&)>;

// "POST /pause": how a route's help names it.
std::string route_text(const api::Route& route);

// Adds a command under `app` for each route (creating groups such as "weights" on the way)
// and returns each with what runs it once the command line is parsed.
std::vector<std::pair<CLI::App*, Command>> add_route_commands(CLI::App& app);

}  // namespace vllmd::vllmctl
