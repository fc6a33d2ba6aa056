#pragma once
// vllmctl's commands. Each returns the process exit code (docs/product.md §4.5): 0 only on success.
// The routes' own commands come from the API table (route_commands.hpp); these are the ones
// that combine routes.

#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "cmd/vllmctl/context.hpp"
#include "cmd/vllmctl/inputs.hpp"

namespace vllmd::vllmctl {

struct SyncArgs {
  std::optional<std::string> init;  // none: the transfer engine is initialized already
  std::vector<std::string> updates;
  std::optional<std::string> version;
  bool no_pause = false;
  // The pause's mode: keep freezes in-flight rollouts across the sync, and they go on under
  // the new weights; none given: keep, or abort with --sleep (which drops their KV cache).
  std::optional<std::string> pause_mode;
  std::optional<int> sleep_level;           // --sleep: the colocated order
  std::optional<std::string> verify;        // --verify FILE: commit only if the checksums match
  std::optional<std::string> servers_file;  // --servers-file: more servers, one URL per line
};
// On every server in `servers` (one Context each, in order).
int weights_sync(const std::vector<Context>& servers, const SyncArgs& args);

// weights check: checksums, compare with --baseline FILE, or --reset (check.cpp).
// generate: token ids in, token ids out (generate.cpp). Unset values are left to the server.
struct GenerateArgs {
  std::string tokens;                // --tokens 1,2,3
  std::optional<std::string> input;  // --input FILE, or '-' for stdin
  std::optional<std::int64_t> max_tokens;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<std::int64_t> top_k;
  std::optional<std::int64_t> seed;
  std::optional<std::int64_t> logprobs;
  std::optional<std::int64_t> n;
  bool stream = false;
};
int generate(const Context& context, const GenerateArgs& args);

struct CheckArgs {
  std::optional<std::string> baseline;
  bool reset = false;
};
int weights_check(const Context& context, const CheckArgs& args);
// A baseline file (a JSON object of checksum key: sha256 hex, or `weights check -o json`'s
// document) as the JSON object to compare with; the exit code and message when unusable.
struct CheckFailure {
  int exit_code = 0;
  std::string message;
};
tl::expected<std::string, CheckFailure> read_baseline(const std::string& path);
// POST /weight_checker compare: 0 when every checksum matches, 65 naming the keys that do not.
int compare_with_baseline(const Context& context, std::string_view step,
                          const std::string& baseline);

int status(const Context& context);
int version(const Context& context);  // vllmctl's and the server's

// Shared by the commands: one route called, its result printed (or its failure reported
// under `step`). Returns the exit code.
int run_step(const Context& context, const std::string& step, const Call& call,
             const std::string& detail = "");
// One call per input file, in order, each checked before the first is sent; stops at the
// first failure.
int run_inputs(const Context& context, const std::string& step, const Call& call,
               std::vector<InfoInput>& inputs);

// {"<key>":"<value>"}: the body of a route that takes one string member.
std::string string_body(std::string_view key, std::string_view value);

}  // namespace vllmd::vllmctl
