#include "cmd/vllmctl/settings.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "common/api/errors.hpp"
#include "common/api/session.hpp"
#include "common/http/client.hpp"
#include "common/util/duration.hpp"
#include "common/util/errno_text.hpp"

namespace vllmd::vllmctl {

namespace {

tl::expected<std::string, std::string> read_token_file(const std::string& path,
                                                       const std::string& source) {
  auto failure = [&](int error) {
    return tl::unexpected(source + ": cannot read token file " + path + ": " +
                          util::errno_text(error));
  };
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return failure(errno);
  std::string token;
  char slice[4096];
  std::size_t got = 0;
  while ((got = std::fread(slice, 1, sizeof slice, file)) > 0) token.append(slice, got);
  const bool failed = std::ferror(file) != 0;
  const int read_errno = errno;
  std::fclose(file);
  if (failed) return failure(read_errno);
  // Surrounding whitespace (echo KEY > file) is not part of the key.
  const std::size_t first = token.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) {
    return tl::unexpected(source + ": token file " + path + " is empty");
  }
  return token.substr(first, token.find_last_not_of(" \t\r\n") - first + 1);
}

}  // namespace

tl::expected<Format, std::string> parse_format(const std::string& text) {
  if (text == "text") return Format::kText;
  if (text == "json") return Format::kJson;
  return tl::unexpected("-o: unknown output format '" + text + "'; expected text or json");
}

tl::expected<std::string, std::string> resolve_token(const GlobalFlags& flags) {
  if (!flags.token_file.empty()) return read_token_file(flags.token_file, "--token-file");
  const char* token = std::getenv("VLLMCTL_TOKEN");
  const char* token_file = std::getenv("VLLMCTL_TOKEN_FILE");
  const bool has_token = token != nullptr && *token != '\0';
  const bool has_file = token_file != nullptr && *token_file != '\0';
  // Which one wins would be a guess: say so instead.
  if (has_token && has_file) {
    return tl::unexpected(
        std::string("VLLMCTL_TOKEN and VLLMCTL_TOKEN_FILE are both set; keep one"));
  }
  if (has_file) return read_token_file(token_file, "VLLMCTL_TOKEN_FILE");
  return has_token ? std::string(token) : std::string();
}

tl::expected<Context, std::string> make_context(const GlobalFlags& flags, const Output& output) {
  return make_context(flags, output,
                      flags.servers.empty() ? std::string(kDefaultServer) : flags.servers.front());
}

tl::expected<std::vector<std::string>, ServerListError> server_list(
    const GlobalFlags& flags, const std::optional<std::string>& file) {
  std::vector<std::string> servers = flags.servers;
  if (file) {
    std::ifstream in(*file);
    if (!in)
      return tl::unexpected(ServerListError{api::exit_code::kNoInput, *file + ": cannot read"});
    std::string line;
    while (std::getline(in, line)) {
      const auto first = line.find_first_not_of(" \t\r");
      if (first == std::string::npos || line[first] == '#') continue;
      const auto last = line.find_last_not_of(" \t\r");
      servers.push_back(line.substr(first, last - first + 1));
    }
  }
  if (servers.empty() && file) {
    return tl::unexpected(ServerListError{api::exit_code::kUsage, *file + ": names no server"});
  }
  if (servers.empty()) servers.emplace_back(kDefaultServer);
  for (std::size_t i = 0; i < servers.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (servers[i] == servers[j]) {
        return tl::unexpected(
            ServerListError{api::exit_code::kUsage, "--server: " + servers[i] + " is named twice"});
      }
    }
  }
  return servers;
}

tl::expected<Context, std::string> make_context(const GlobalFlags& flags, const Output& output,
                                                const std::string& server) {
  auto endpoint = http::parse_endpoint(server);
  if (!endpoint) return tl::unexpected("--server: " + endpoint.error());
  auto token = resolve_token(flags);
  if (!token) return tl::unexpected(token.error());
  http::ClientOptions options;
  options.token = std::move(*token);
  options.timeout = util::milliseconds_of(flags.timeout);
  options.trace = [output](std::string_view line) { output.trace(line); };
  options.ca_file = flags.ca_file;
  if (!options.ca_file.empty() && endpoint->scheme != "https") {
    return tl::unexpected("--cacert: given, but --server " + endpoint->url() + " is not https");
  }
  if (!flags.session.empty() && !api::valid_session_id(flags.session)) {
    return tl::unexpected("--session: '" + flags.session +
                          "' is not 1 to 128 visible ASCII characters");
  }
  try {
    return Context(http::Client(std::move(*endpoint), std::move(options)), output)
        .with_session(flags.session);
  } catch (const std::runtime_error& error) {
    return tl::unexpected("--cacert: " + std::string(error.what()));
  }
}

}  // namespace vllmd::vllmctl
