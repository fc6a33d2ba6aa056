// vllmctl's command line (docs/product.md §4): the CLI11 definition and dispatch. Command names,
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
#include "cmd/vllmctl/completion.hpp"
#include "cmd/vllmctl/route_commands.hpp"
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
       << "  " << exit_code::kUsage
       << "  usage error (unknown flag, missing argument; several --server\n"
       << "      for a command other than weights sync)\n"
       << "  " << exit_code::kRejected
       << "  payload rejected: invalid JSON input, HTTP 400 or 413; weight checksums that\n"
       << "      differ from the baseline (weights check --baseline, weights sync --verify)\n"
       << "  " << exit_code::kNoInput << "  input file missing or unreadable\n"
       << "  " << exit_code::kUnavailable
       << "  daemon or engine unavailable: connect failure, HTTP 503 (or 404)\n"
       << "  " << exit_code::kEngineFailed
       << "  engine call failed: HTTP 500, or a stream cut short\n"
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

// Every value the command line can set that the table's routes do not; the commands'
// closures read them after parsing.
struct Args {
  GlobalFlags flags;
  SyncArgs sync;
  std::string sync_version;
  CLI::Option* sync_version_option = nullptr;
  std::string sync_init;
  CLI::Option* sync_init_option = nullptr;
  int sync_sleep = 1;
  std::string sync_pause_mode;
  CLI::Option* sync_pause_mode_option = nullptr;
  CLI::Option* sync_sleep_option = nullptr;
  std::string sync_verify;
  CLI::Option* sync_verify_option = nullptr;
  std::string sync_servers_file;
  CLI::Option* sync_servers_file_option = nullptr;
  std::string check_baseline;
  CLI::Option* check_baseline_option = nullptr;
  CheckArgs check;
  GenerateArgs generate;
  std::string generate_input;
  std::int64_t generate_max_tokens = 0, generate_top_k = 0, generate_seed = 0;
  std::int64_t generate_logprobs = 0, generate_n = 1;
  double generate_temperature = 0, generate_top_p = 0;
  std::string shell;
};

struct Commands {
  std::vector<std::pair<CLI::App*, Command>> server;  // those that talk to vllmd
  CLI::App* fleet = nullptr;  // the one that runs on several servers (weights sync)
  CLI::App* completion = nullptr;
};

void define_global_flags(CLI::App& app, GlobalFlags& flags) {
  app.add_option("--server", flags.servers,
                 "vllmd URL (repeatable for weights sync: the sync runs on every server)")
      ->envname("VLLMCTL_SERVER")
      ->type_name("URL")
      ->allow_extra_args(false)
      ->default_str(std::string(kDefaultServer));
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
      // Checked after parsing (a bad format is bad configuration: 78), so the values are
      // named here, as a check would name them, for help and completion.
      ->type_name("FORMAT:{text,json}")
      ->capture_default_str();
  app.add_option("--session", flags.session,
                 "weight-update session id sent as Vllmd-Session: a session spread over several "
                 "commands that no other client may continue")
      ->envname("VLLMCTL_SESSION")
      ->type_name("ID");
  app.add_flag("-q,--quiet", flags.quiet, "print nothing on success");
  app.add_flag("-v,--verbose", flags.verbose, "trace requests on stderr");
}

void define_sync(CLI::App& weights, Args& args, Commands& commands) {
  CLI::App* sync = weights.add_subcommand(
      "sync",
      "[init,] pause, start, update..., finish(version), resume (with --sleep: pause, sleep, "
      "wake weights, start, update..., finish, wake kv_cache, reset prefix cache, resume); "
      "after a failure the session is closed, what slept is woken and generation resumed, and "
      "the version is committed only by a successful finish");
  args.sync_init_option =
      sync->add_option("--init", args.sync_init,
                       "JSON file holding init_info (once per job; without it the transfer "
                       "engine must be initialized already)")
          ->type_name("FILE");
  sync->add_option("--update", args.sync.updates, "JSON file holding update_info (repeatable)")
      ->required()
      ->allow_extra_args(false)
      ->type_name("FILE");
  args.sync_version_option =
      sync->add_option("--version", args.sync_version, "weight version to commit")->type_name("V");
  CLI::Option* no_pause =
      sync->add_flag("--no-pause", args.sync.no_pause, "leave generation running during the sync");
  args.sync_pause_mode_option =
      sync->add_option("--pause-mode", args.sync_pause_mode,
                       "abort|wait|keep: what the pause does to in-flight requests (default "
                       "keep: they freeze and go on under the new weights; with --sleep: "
                       "abort, and keep is refused)")
          ->type_name("MODE")
          ->check(CLI::IsMember({"abort", "wait", "keep"}))
          ->excludes(no_pause);
  args.sync_sleep_option =
      sync->add_option("--sleep", args.sync_sleep,
                       "colocated: sleep at this level (1|2) around the update, waking the "
                       "weights first and the KV cache after")
          ->type_name("LEVEL")
          ->check(CLI::IsMember({1, 2}))
          ->excludes(no_pause);
  args.sync_verify_option =
      sync->add_option("--verify", args.sync_verify,
                       "JSON file of checksums the trainer computed (key: sha256 hex): finish "
                       "without a version, compare, and set the version only if all match")
          ->type_name("FILE");
  args.sync_servers_file_option =
      sync->add_option("--servers-file", args.sync_servers_file,
                       "file of vllmd URLs, one per line (# comments): the sync runs on each "
                       "of them and on every --server, and commits only if all finish")
          ->type_name("FILE");
  commands.fleet = sync;
  commands.server.emplace_back(sync, [&args](const Context& c) {
    if (args.sync_verify_option->count() > 0) args.sync.verify = args.sync_verify;
    if (args.sync_version_option->count() > 0) args.sync.version = args.sync_version;
    if (args.sync_init_option->count() > 0) args.sync.init = args.sync_init;
    if (args.sync_sleep_option->count() > 0) args.sync.sleep_level = args.sync_sleep;
    if (args.sync_pause_mode_option->count() > 0) args.sync.pause_mode = args.sync_pause_mode;
    if (args.sync_servers_file_option->count() > 0) args.sync.servers_file = args.sync_servers_file;
    auto servers = server_list(args.flags, args.sync.servers_file);
    if (!servers) return c.out().fail("", servers.error());
    std::vector<Context> contexts;
    for (const std::string& server : *servers) {
      auto context = make_context(args.flags, c.out(), server);
      if (!context) {
        c.out().error("", context.error());
        return exit_code::kConfig;
      }
      contexts.push_back(std::move(*context));
    }
    return weights_sync(contexts, args.sync);
  });
}

void define_check(CLI::App& weights, Args& args, Commands& commands) {
  CLI::App* check = weights.add_subcommand(
      "check",
      "the workers' weight checksums; with --baseline FILE whether they match it (exit 65 "
      "naming the keys that differ); with --reset the weights overwritten [" +
          route_text(api::route_for(api::Operation::kWeightChecker)) + "]");
  args.check_baseline_option =
      check
          ->add_option("--baseline", args.check_baseline,
                       "JSON file of checksums to compare with (key: sha256 hex)")
          ->type_name("FILE");
  check->add_flag("--reset", args.check.reset, "overwrite the weights (vLLM's reset_weights)")
      ->excludes(args.check_baseline_option);
  commands.server.emplace_back(check, [&args](const Context& c) {
    if (args.check_baseline_option->count() > 0) args.check.baseline = args.check_baseline;
    return weights_check(c, args.check);
  });
}

void define_generate(CLI::App& app, Args& args, Commands& commands) {
  CLI::App* command = app.add_subcommand(
      "generate",
      "token ids in, token ids out: prints the generated ids (with --logprobs one "
      "\"id logprob\" line per token; with --stream one line per event) [" +
          route_text(api::route_for(Operation::kGenerate)) + "]");
  CLI::Option* tokens =
      command->add_option("--tokens", args.generate.tokens, "the prompt's token ids, e.g. 1,2,3")
          ->type_name("IDS");
  CLI::Option* input =
      command
          ->add_option("--input", args.generate_input,
                       "file of the prompt's token ids (comma- or space-separated, or a JSON "
                       "list); '-' reads stdin")
          ->type_name("FILE")
          ->excludes(tokens);
  tokens->excludes(input);
  // Each only when given: the server applies its defaults (and generation_config.json's).
  std::vector<std::pair<CLI::Option*, std::function<void()>>> given;
  const auto integer = [&](const char* flag, std::int64_t& value, std::optional<std::int64_t>& into,
                           const char* help) {
    given.emplace_back(command->add_option(flag, value, help)->type_name("N"),
                       [&value, &into] { into = value; });
  };
  const auto real = [&](const char* flag, double& value, std::optional<double>& into,
                        const char* help) {
    given.emplace_back(command->add_option(flag, value, help)->type_name("X"),
                       [&value, &into] { into = value; });
  };
  integer("--max-tokens", args.generate_max_tokens, args.generate.max_tokens,
          "tokens to generate at most");
  real("--temperature", args.generate_temperature, args.generate.temperature,
       "sampling temperature (0: greedy)");
  real("--top-p", args.generate_top_p, args.generate.top_p, "nucleus sampling mass");
  integer("--top-k", args.generate_top_k, args.generate.top_k, "top-k sampling (-1: none)");
  integer("--seed", args.generate_seed, args.generate.seed, "sampling seed");
  integer("--logprobs", args.generate_logprobs, args.generate.logprobs,
          "logprobs of the sampled token and the N most likely");
  integer("--n", args.generate_n, args.generate.n, "completions per prompt");
  command->add_flag("--stream", args.generate.stream, "print the ids as the engine sends them");
  commands.server.emplace_back(command, [&args, tokens, input, given](const Context& c) {
    if (tokens->count() == 0 && input->count() == 0) {
      c.out().error("generate", "give the prompt: --tokens IDS or --input FILE");
      return exit_code::kUsage;
    }
    if (input->count() > 0) args.generate.input = args.generate_input;
    for (const auto& [option, take] : given) {
      if (option->count() > 0) take();
    }
    return vllmctl::generate(c, args.generate);
  });
}

void define_commands(CLI::App& app, Args& args, Commands& commands) {
  commands.server = add_route_commands(app);
  define_sync(*app.get_subcommand("weights"), args, commands);
  define_check(*app.get_subcommand("weights"), args, commands);
  define_generate(app, args, commands);
  std::string status_routes;
  for (const Operation operation : {Operation::kHealth, Operation::kWorldSize, Operation::kIsPaused,
                                    Operation::kWeightInfo, Operation::kSessionStatus}) {
    status_routes += (status_routes.empty() ? "" : ", ") + route_text(api::route_for(operation));
  }
  commands.server.emplace_back(
      app.add_subcommand(
          "status",
          "health, engines, world size, paused, weight version and session in one view [" +
              status_routes + "]"),
      status);

  commands.server.emplace_back(
      app.add_subcommand("version", "vllmctl's version and the server's [" +
                                        route_text(api::route_for(Operation::kVersion)) + "]"),
      version);

  commands.completion = app.add_subcommand("completion", "print a shell completion script");
  commands.completion->add_option("shell", args.shell, "bash, zsh or fish")
      ->required()
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kShells), std::end(kShells))));
}

int dispatch(const CLI::App& app, const Args& args, const Commands& commands) {
  auto format = parse_format(args.flags.output);
  if (!format) {
    Output(Format::kText, false, false).error("", format.error());
    return exit_code::kConfig;
  }
  const Output output(*format, args.flags.quiet, args.flags.verbose);
  if (commands.completion->parsed()) {
    // The script whatever -o says (it is no server reply); result() adds the last newline.
    std::string script = completion_script(app, args.shell);
    script.pop_back();
    output.result(script, script);
    return exit_code::kOk;
  }
  if (args.flags.servers.size() > 1 && !commands.fleet->parsed()) {
    output.error("", "--server: given " + std::to_string(args.flags.servers.size()) +
                         " times; only weights sync runs on several servers");
    return exit_code::kUsage;
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
  define_commands(app, args, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // CLI11 exits 100+ by default (127 reads as "command not found" to shells).
    app.exit(error);
    return error.get_exit_code() == 0 ? exit_code::kOk : exit_code::kUsage;
  }
  try {
    return dispatch(app, args, commands);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "vllmctl: internal error: %s\n", error.what());
    return exit_code::kEngineFailed;  // never 0 on an error
  }
}

}  // namespace vllmd::vllmctl
