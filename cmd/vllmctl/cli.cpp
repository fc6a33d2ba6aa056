// vllmctl's command line (product.md): the CLI11 definition and dispatch. Command names,
// methods and paths come from the API table, so help and routes cannot drift apart.

#include "cmd/vllmctl/cli.hpp"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cmd/vllmctl/commands.hpp"
#include "cmd/vllmctl/completion_script.hpp"
#include "cmd/vllmctl/settings.hpp"
#include "common/api/errors.hpp"
#include "common/api/table.hpp"

namespace vllmd::vllmctl {

namespace {

namespace exit_code = api::exit_code;
using api::Operation;

std::string exit_code_help() {
  std::ostringstream text;
  text << "Exit codes:\n"
       << "  " << exit_code::kOk << "   success\n"
       << "  " << exit_code::kUsage << "  usage error (unknown flag, missing argument)\n"
       << "  " << exit_code::kRejected
       << "  payload rejected: invalid JSON input, HTTP 400 or 413\n"
       << "  " << exit_code::kNoInput << "  input file missing or unreadable\n"
       << "  " << exit_code::kUnavailable
       << "  daemon or engine unavailable: connect failure, HTTP 503 (or 404)\n"
       << "  " << exit_code::kEngineFailed << "  engine call failed: HTTP 500\n"
       << "  " << exit_code::kTimeout
       << "  try again later: HTTP 504, no reply within --timeout, or HTTP 409 (another\n"
       << "      client's weight-update session is open)\n"
       << "  " << exit_code::kUnauthorized << "  unauthorized: HTTP 401 or 403\n"
       << "  " << exit_code::kConfig << "  bad configuration: --server, token file, -o, --cacert,\n"
       << "      --session; an https server whose certificate is not trusted\n"
       << "\nEnvironment:\n"
       << "  VLLMCTL_SERVER      server URL (default " << kDefaultServer << ")\n"
       << "  VLLMCTL_TOKEN       API key, sent as \"Authorization: Bearer\"\n"
       << "  VLLMCTL_TOKEN_FILE  file holding the API key\n"
       << "  VLLMCTL_CACERT      --cacert\n"
       << "  VLLMCTL_SESSION     --session\n";
  return text.str();
}

std::string route_text(Operation operation) {
  const api::Route& route = api::route_for(operation);
  return std::string(route.method) + " " + std::string(route.path);
}

// A subcommand for one route: named by the last word of the table's CLI verb, described by
// the table's summary, method and path.
CLI::App* add_route_command(CLI::App& parent, Operation operation) {
  const api::Route& route = api::route_for(operation);
  const std::string_view cli = route.cli;
  return parent.add_subcommand(std::string(cli.substr(cli.rfind(' ') + 1)),
                               std::string(route.summary) + " [" + route_text(operation) + "]");
}

// Every value the command line can set; the commands' closures read them after parsing.
struct Args {
  GlobalFlags flags;
  std::string init_info;
  bool draft = false;
  std::vector<std::string> update_infos;
  std::string finish_version;
  CLI::Option* finish_version_option = nullptr;
  std::string new_version;
  SyncArgs sync;
  std::string sync_version;
  CLI::Option* sync_version_option = nullptr;
  bool no_dp = false;
  std::string pause_mode;
  bool keep_cache = false;
  std::string shell;
};

using Command = std::function<int(const Context&)>;

struct Commands {
  std::vector<std::pair<CLI::App*, Command>> server;  // those that talk to vllmd
  CLI::App* completion = nullptr;
};

void define_global_flags(CLI::App& app, GlobalFlags& flags) {
  app.add_option("--server", flags.server, "vllmd URL")
      ->envname("VLLMCTL_SERVER")
      ->type_name("URL")
      ->capture_default_str();
  app.add_option("--token-file", flags.token_file, "file holding the API key")->type_name("FILE");
  app.add_option("--cacert", flags.ca_file,
                 "https: PEM CA file the server's certificate must chain to (default: system CAs)")
      ->envname("VLLMCTL_CACERT")
      ->type_name("FILE");
  app.add_option("--timeout", flags.timeout, "seconds to wait for the daemon (per read/write)")
      ->type_name("S")
      ->check(CLI::Range(0.001, 1e6))
      ->capture_default_str();
  app.add_option("-o,--output", flags.output, "text|json (json: the server's JSON bodies)")
      ->type_name("FORMAT")
      ->capture_default_str();
  app.add_option("--session", flags.session,
                 "weight-update session id sent as Vllmd-Session: a session spread over several "
                 "commands that no other client may continue")
      ->envname("VLLMCTL_SESSION")
      ->type_name("ID");
  app.add_flag("-q,--quiet", flags.quiet, "print nothing on success");
  app.add_flag("-v,--verbose", flags.verbose, "trace requests on stderr");
}

void define_weights(CLI::App& app, Args& args, Commands& commands) {
  auto add = [&](CLI::App* command, Command run) { commands.server.emplace_back(command, run); };
  CLI::App* weights = app.add_subcommand("weights", "the weight-update lifecycle");
  weights->require_subcommand(1);

  CLI::App* init = add_route_command(*weights, Operation::kInitWeightTransfer);
  init->add_option("--info", args.init_info, "JSON file holding init_info ('-': stdin)")
      ->required()
      ->type_name("FILE");
  add(init, [&args](const Context& c) { return weights_init(c, args.init_info); });

  CLI::App* start = add_route_command(*weights, Operation::kStartWeightUpdate);
  start->add_flag(
      "--draft", args.draft,
      "start a draft-model session [" + route_text(Operation::kStartDraftWeightUpdate) + "]");
  add(start, [&args](const Context& c) { return weights_start(c, args.draft); });

  CLI::App* update = add_route_command(*weights, Operation::kUpdateWeights);
  update
      ->add_option("--info", args.update_infos,
                   "JSON file holding update_info, one call each (repeatable; '-': stdin)")
      ->required()
      ->allow_extra_args(false)
      ->type_name("FILE");
  add(update, [&args](const Context& c) { return weights_update(c, args.update_infos); });

  CLI::App* finish = add_route_command(*weights, Operation::kFinishWeightUpdate);
  args.finish_version_option =
      finish->add_option("--version", args.finish_version, "weight version to commit on success")
          ->type_name("V");
  add(finish, [&args](const Context& c) {
    return weights_finish(c, args.finish_version_option->count() > 0
                                 ? std::optional<std::string>(args.finish_version)
                                 : std::nullopt);
  });

  add(add_route_command(*weights, Operation::kWeightInfo), weights_info);

  CLI::App* set_version = add_route_command(*weights, Operation::kUpdateWeightVersion);
  set_version->add_option("V", args.new_version, "the new weight version")->required();
  add(set_version, [&args](const Context& c) { return weights_set_version(c, args.new_version); });

  CLI::App* sync = weights->add_subcommand(
      "sync",
      "init, then pause, start, update..., finish(version), resume; generation is resumed even "
      "when a step fails, and the version is committed only by a successful finish");
  sync->add_option("--init", args.sync.init, "JSON file holding init_info")
      ->required()
      ->type_name("FILE");
  sync->add_option("--update", args.sync.updates, "JSON file holding update_info (repeatable)")
      ->required()
      ->allow_extra_args(false)
      ->type_name("FILE");
  args.sync_version_option =
      sync->add_option("--version", args.sync_version, "weight version to commit")->type_name("V");
  sync->add_flag("--no-pause", args.sync.no_pause, "leave generation running during the sync");
  add(sync, [&args](const Context& c) {
    if (args.sync_version_option->count() > 0) args.sync.version = args.sync_version;
    return weights_sync(c, args.sync);
  });
}

void define_others(CLI::App& app, Args& args, Commands& commands) {
  auto add = [&](CLI::App* command, Command run) { commands.server.emplace_back(command, run); };
  CLI::App* world = add_route_command(app, Operation::kWorldSize);
  world->add_flag("--no-dp", args.no_dp, "exclude data parallelism (include_dp=false)");
  add(world, [&args](const Context& c) { return world_size(c, !args.no_dp); });

  CLI::App* pause_command = add_route_command(app, Operation::kPause);
  pause_command->add_option("--mode", args.pause_mode, "abort|wait|keep (server default: abort)")
      ->type_name("MODE")
      ->check(CLI::IsMember({"abort", "wait", "keep"}));
  pause_command->add_flag("--keep-cache", args.keep_cache,
                          "keep the prefix cache (clear_cache=false)");
  add(pause_command,
      [&args](const Context& c) { return pause(c, args.pause_mode, args.keep_cache); });

  add(add_route_command(app, Operation::kResume), resume);
  const std::string status_routes =
      route_text(Operation::kHealth) + ", " + route_text(Operation::kWorldSize) + ", " +
      route_text(Operation::kIsPaused) + ", " + route_text(Operation::kWeightInfo) + ", " +
      route_text(Operation::kSessionStatus);
  add(app.add_subcommand(
          "status",
          "health, engines, world size, paused, weight version and session in one view [" +
              status_routes + "]"),
      status);
  add(add_route_command(app, Operation::kHealth), health);
  add(add_route_command(app, Operation::kReload), reload);

  commands.completion = app.add_subcommand("completion", "print a shell completion script");
  commands.completion->add_option("shell", args.shell, "bash")
      ->required()
      ->check(CLI::IsMember({"bash"}));
}

int dispatch(const Args& args, const Commands& commands) {
  auto format = parse_format(args.flags.output);
  if (!format) {
    Output(Format::kText, false, false).error("", format.error());
    return exit_code::kConfig;
  }
  const Output output(*format, args.flags.quiet, args.flags.verbose);
  if (commands.completion->parsed()) {
    // The script whatever -o says (it is no server reply); the file ends with its newline.
    const std::string_view script = kBashCompletion.substr(0, kBashCompletion.size() - 1);
    output.result(script, script);
    return exit_code::kOk;
  }
  auto context = make_context(args.flags, output);
  if (!context) {
    output.error("", context.error());
    return exit_code::kConfig;
  }
  for (const auto& [command, run_command] : commands.server) {
    if (command->parsed()) return run_command(*context);
  }
  output.error("", "no command given");  // unreachable: CLI11 requires one
  return exit_code::kUsage;
}

}  // namespace

int run(int argc, const char* const* argv) {
  // A daemon that closes early must fail a write, not kill us with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);

  CLI::App app{"vllmctl: drive vLLM's weight-sync lifecycle through vllmd", "vllmctl"};
  app.footer(exit_code_help());
  app.require_subcommand(1);
  app.fallthrough();  // global flags are accepted after the command too
  Args args;
  Commands commands;
  define_global_flags(app, args.flags);
  define_weights(app, args, commands);
  define_others(app, args, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // CLI11 exits 100+ by default (127 reads as "command not found" to shells).
    app.exit(error);
    return error.get_exit_code() == 0 ? exit_code::kOk : exit_code::kUsage;
  }
  try {
    return dispatch(args, commands);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "vllmctl: internal error: %s\n", error.what());
    return exit_code::kEngineFailed;  // never 0 on an error
  }
}

}  // namespace vllmd::vllmctl
