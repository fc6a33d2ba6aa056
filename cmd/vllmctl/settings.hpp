#pragma once
// vllmctl's global flags and what they configure: the server URL, the API key (flag or
// environment) and the timeout, turned into a ready Context or one clear error (exit 78).

#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

#include "cmd/vllmctl/context.hpp"
#include "cmd/vllmctl/output.hpp"

namespace vllmd::vllmctl {

inline constexpr std::string_view kDefaultServer = "http://127.0.0.1:8000";

struct GlobalFlags {
  std::vector<std::string> servers;  // --server (repeatable), else VLLMCTL_SERVER; none: default
  std::string token_file;
  std::string ca_file;   // --cacert, else VLLMCTL_CACERT
  double timeout = 300;  // vLLM's weight-sync client default
  std::string output = "text";
  bool quiet = false;
  bool verbose = false;
  std::string session;  // --session, else VLLMCTL_SESSION: Vllmd-Session on every call
};

// The output format -o names, or an error message.
tl::expected<Format, std::string> parse_format(const std::string& text);

// The API key: --token-file, else VLLMCTL_TOKEN or VLLMCTL_TOKEN_FILE (not both), else none.
tl::expected<std::string, std::string> resolve_token(const GlobalFlags& flags);

// The Context for `server` (a URL), or for the one --server (kDefaultServer when none).
tl::expected<Context, std::string> make_context(const GlobalFlags& flags, const Output& output,
                                                const std::string& server);
tl::expected<Context, std::string> make_context(const GlobalFlags& flags, const Output& output);

// The servers of a command that runs on several: every --server, then the URLs in `file` (one
// per line; blank lines and # comments skipped) when given. Exit 66 for an unreadable file,
// 64 for a server named twice or none at all.
struct ServerListError {
  int exit_code = 0;
  std::string message;
};
tl::expected<std::vector<std::string>, ServerListError> server_list(
    const GlobalFlags& flags, const std::optional<std::string>& file);

}  // namespace vllmd::vllmctl
