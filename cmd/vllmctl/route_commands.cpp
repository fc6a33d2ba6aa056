#include "cmd/vllmctl/route_commands.hpp"

#include <CLI/CLI.hpp>
#include <deque>
#include <memory>
#include <string>

#include "cmd/vllmctl/commands.hpp"
#include "cmd/vllmctl/inputs.hpp"
#include "common/wire/json_text.hpp"

namespace vllmd::vllmctl {

namespace {

using api::ArgKind;
using api::CliArg;
using api::Route;

// Commands that hold route commands, and how help describes them.
struct Group {
  std::string_view name;
  std::string_view description;
};
constexpr Group kGroups[] = {
    {"weights", "the weight-update lifecycle"},
    {"cache", "the engines' caches"},
};

// One argument's values, as CLI11 writes them while parsing.
struct ArgValue {
  const CliArg* arg = nullptr;
  std::string one;
  std::vector<std::string> many;  // a repeatable argument
  bool flag = false;
  CLI::Option* option = nullptr;
};

// A flag that switches a command to another route ("weights start --draft").
struct Variant {
  const Route* route = nullptr;
  bool chosen = false;
  CLI::Option* flag = nullptr;
};

struct RouteCommand {
  const Route* route = nullptr;
  std::vector<ArgValue> values;  // as many as route->cli.args: CLI11 binds their addresses
  std::deque<Variant> variants;  // a deque: CLI11 binds `chosen`, which must not move

  const Route& chosen() const {
    for (const Variant& variant : variants) {
      if (variant.chosen) return *variant.route;
    }
    return *route;
  }
};

// The command a route's Cli::command names (words before any "--flag"), under `app`:
// groups are found or made on the way.
CLI::App& command_for(CLI::App& app, std::string_view words, const Route& route) {
  const std::size_t space = words.find(' ');
  const std::string head(words.substr(0, space));
  if (space == std::string_view::npos) {
    return *app.add_subcommand(head, std::string(route.summary) + " [" + route_text(route) + "]");
  }
  CLI::App* group = nullptr;
  for (CLI::App* existing : app.get_subcommands({})) {
    if (existing->get_name() == head) group = existing;
  }
  if (group == nullptr) {
    std::string description;
    for (const Group& known : kGroups) {
      if (known.name == head) description = known.description;
    }
    group = app.add_subcommand(head, description);
    group->require_subcommand(1);
  }
  return command_for(*group, words.substr(space + 1), route);
}

void bind(CLI::App& command, ArgValue& value) {
  const CliArg& arg = *value.arg;
  const std::string name(arg.name);
  const std::string help(arg.help);
  if (arg.kind == ArgKind::kQueryFlag) {
    value.option = command.add_flag(name, value.flag, help);
    return;
  }
  value.option = arg.repeatable
                     ? command.add_option(name, value.many, help)->allow_extra_args(false)
                     : command.add_option(name, value.one, help);
  if (!arg.value_name.empty()) value.option->type_name(std::string(arg.value_name));
  if (arg.required) value.option->required();
  if (arg.kind == ArgKind::kQuery && !arg.value.empty()) {
    std::vector<std::string> allowed;
    for (std::string_view rest = arg.value; !rest.empty();) {
      const std::size_t bar = rest.find('|');
      allowed.emplace_back(rest.substr(0, bar));
      rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
    }
    value.option->check(CLI::IsMember(allowed));
  }
}

// The call a parsed route command makes, its body members gathered in `body`.
int run(const Context& context, const RouteCommand& command) {
  const Route& route = command.chosen();
  const std::string step(route.cli.command);
  Call call{route.operation};
  std::string members;
  std::string detail;
  std::vector<InfoInput> inputs;
  for (const ArgValue& value : command.values) {
    const CliArg& arg = *value.arg;
    const std::string key(arg.key);
    const bool given = value.option->count() > 0;
    switch (arg.kind) {
      case ArgKind::kBodyFile:
        if (!given) break;
        for (const std::string& path : arg.repeatable ? value.many : std::vector{value.one}) {
          inputs.emplace_back(path, route);
        }
        break;
      case ArgKind::kBodyString: {
        if (!given) break;
        const std::string member = string_body(key, value.one);
        members += (members.empty() ? "" : ",") + member.substr(1, member.size() - 2);
        if (const std::size_t at = arg.detail.find("{}"); at != std::string_view::npos) {
          detail = std::string(arg.detail.substr(0, at)) + value.one +
                   std::string(arg.detail.substr(at + 2));
        }
        break;
      }
      case ArgKind::kBodyJson:
        if (given)
          members += (members.empty() ? "" : ",") + wire::json_string(key) + ":" + value.one;
        break;
      case ArgKind::kQuery:
        if (!given) break;
        for (const std::string& one : arg.repeatable ? value.many : std::vector{value.one}) {
          if (!one.empty()) call.query.emplace_back(key, one);
        }
        break;
      case ArgKind::kQueryFlag:
        if (value.flag) call.query.emplace_back(key, std::string(arg.value));
        break;
    }
  }
  if (!inputs.empty()) return run_inputs(context, step, call, inputs);
  // No member: no body at all (vLLM's trainers send none to start, and the route ignores one).
  const std::string body = "{" + members + "}";
  if (!members.empty()) call.body = body;
  return run_step(context, step, call, detail);
}

}  // namespace

std::string route_text(const Route& route) {
  return std::string(route.method) + " " + std::string(route.path);
}

std::vector<std::pair<CLI::App*, Command>> add_route_commands(CLI::App& app) {
  std::vector<std::pair<CLI::App*, Command>> commands;
  std::vector<std::pair<std::string_view, std::shared_ptr<RouteCommand>>> made;
  for (const Route& route : api::routes()) {
    const std::string_view words = route.cli.command;
    if (words.empty()) continue;
    if (const std::size_t flag = words.find(" --"); flag != std::string_view::npos) {
      // A variant: a flag of the command an earlier row made.
      for (std::size_t i = 0; i < made.size(); ++i) {
        if (made[i].first != words.substr(0, flag)) continue;
        RouteCommand& command = *made[i].second;
        Variant& variant = command.variants.emplace_back();
        variant.route = &route;
        variant.flag = commands[i].first->add_flag(
            std::string(words.substr(flag + 1)), variant.chosen,
            std::string(route.summary) + " [" + route_text(route) + "]");
        // The command's own arguments and the other variants belong to other routes.
        for (const ArgValue& value : command.values) variant.flag->excludes(value.option);
        for (const Variant& other : command.variants) {
          if (&other != &variant) variant.flag->excludes(other.flag);
        }
      }
      continue;
    }
    auto command = std::make_shared<RouteCommand>();
    command->route = &route;
    command->values.resize(route.cli.args.size());
    CLI::App& cli = command_for(app, words, route);
    for (std::size_t i = 0; i < route.cli.args.size(); ++i) {
      command->values[i].arg = &route.cli.args[i];
      bind(cli, command->values[i]);
    }
    made.emplace_back(words, command);
    commands.emplace_back(&cli,
                          [command](const Context& context) { return run(context, *command); });
  }
  return commands;
}

}  // namespace vllmd::vllmctl
