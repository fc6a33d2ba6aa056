#include "daemon/server_info.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>

#include "common/version.hpp"
#include "common/wire/json_text.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX, not in a header

namespace vllmd::daemon {

namespace {

using wire::json_string;

std::string vllm_env() {
  std::map<std::string, std::string> variables;  // sorted by name
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::size_t equals = text.find('=');
    if (equals == std::string_view::npos) continue;
    const std::string_view name = text.substr(0, equals);
    if (name.substr(0, 4) != "VLLM" || secret_like(name)) continue;
    variables.emplace(name, text.substr(equals + 1));
  }
  std::string out = "{";
  for (const auto& [name, value] : variables) {
    if (out.size() > 1) out += ",";
    out += json_string(name) + ":" + json_string(value);
  }
  return out + "}";
}

std::string system_env() {
  utsname names{};
  std::string os = "unknown";
  std::string arch = "unknown";
  if (uname(&names) == 0) {
    os = names.sysname;
    arch = names.machine;
  }
  std::transform(os.begin(), os.end(), os.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return "{\"arch\":" + json_string(arch) + ",\"family\":\"unix\",\"os\":" + json_string(os) + "}";
}

template <typename T>
void member(std::string& out, std::string_view key, const std::optional<T>& value) {
  if (!value) return;
  if (out.size() > 1) out += ",";
  out += json_string(key) + ":";
  if constexpr (std::is_same_v<T, std::string>) {
    out += json_string(*value);
  } else if constexpr (std::is_same_v<T, bool>) {
    out += *value ? "true" : "false";
  } else {
    out += std::to_string(*value);
  }
}

std::string registration_json(const wire::Registration& registration) {
  if (registration.empty) return "null";
  std::string out = "{";
  member(out, "world_size", registration.world_size);
  member(out, "data_parallel_size", registration.data_parallel_size);
  member(out, "tensor_parallel_size", registration.tensor_parallel_size);
  member(out, "pipeline_parallel_size", registration.pipeline_parallel_size);
  member(out, "decode_context_parallel_size", registration.decode_context_parallel_size);
  member(out, "data_parallel_rank", registration.data_parallel_rank);
  member(out, "vllm_version", registration.vllm_version);
  member(out, "weight_transfer_backend", registration.weight_transfer_backend);
  member(out, "supports_draft_weight_updates", registration.supports_draft_weight_updates);
  return out + "}";
}

std::string engines_json(const std::vector<engine::EngineStatus>& engines) {
  std::string out = "[";
  for (const engine::EngineStatus& engine : engines) {
    if (out.size() > 1) out += ",";
    out += "{\"rank\":" + std::to_string(engine.rank) +
           ",\"state\":" + json_string(engine::state_name(engine.state)) +
           ",\"incarnation\":" + std::to_string(engine.incarnation) +
           ",\"registration\":" + registration_json(engine.registration) + "}";
  }
  return out + "]";
}

}  // namespace

bool secret_like(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  constexpr std::array<std::string_view, 6> kSecretWords = {"KEY",      "SECRET",     "TOKEN",
                                                            "PASSWORD", "CREDENTIAL", "AUTH"};
  return std::any_of(kSecretWords.begin(), kSecretWords.end(),
                     [&](std::string_view word) { return upper.find(word) != std::string::npos; });
}

std::string server_info(const Config& config, const std::vector<engine::EngineStatus>& engines,
                        bool json_config) {
  const std::string vllm_config = json_config ? to_json(config) : json_string(to_toml(config));
  return "{\"vllm_config\":" + vllm_config + ",\"vllm_env\":" + vllm_env() +
         ",\"system_env\":" + system_env() + ",\"vllmd_version\":" + json_string(kVersion) +
         ",\"engines\":" + engines_json(engines) + "}";
}

}  // namespace vllmd::daemon
