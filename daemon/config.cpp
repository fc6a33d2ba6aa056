#include "daemon/config.hpp"

#include <toml++/toml.h>
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <variant>

#include "common/reference/core.hpp"
#include "common/util/cidr.hpp"
#include "common/util/log.hpp"

namespace vllmd::daemon {

std::string_view mode_name(EngineMode mode) {
  switch (mode) {
    case EngineMode::kEmbedded: return "embedded";
    case EngineMode::kExternal: return "external";
    case EngineMode::kManaged: return "managed";
  }
  return "embedded";
}

std::optional<HostPort> parse_data_parallel_master(std::string_view text) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size())
    return std::nullopt;
  std::string_view host = text.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return std::nullopt;
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return std::nullopt;  // an IPv6 address needs brackets
  }
  int port = 0;
  for (const char c : text.substr(colon + 1)) {
    if (c < '0' || c > '9' || port > 65535) return std::nullopt;
    port = port * 10 + (c - '0');
  }
  if (port < 1 || port > 65531) return std::nullopt;
  return HostPort{std::string(host), port};
}

namespace {

using Strings = std::vector<std::string>;
using Value = std::variant<bool, std::int64_t, double, std::string, Strings>;
enum class Kind { kBool, kInt, kDouble, kString, kStrings };

struct Setting {
  std::string_view key;   // TOML key, "section.name"
  std::string_view flag;  // command-line flag, or empty
  std::string_view env;   // environment variable, or empty
  Kind kind;
  std::string_view help;
  // Stores a value, or says what is wrong with it.
  std::function<std::optional<std::string>(Config&, const Value&)> set;
  std::function<Value(const Config&)> get;
};

template <typename T> const T& as(const Value& value) { return std::get<T>(value); }

std::optional<std::string> in_range(std::int64_t value, std::int64_t low, std::int64_t high) {
  if (value < low || value > high) {
    return "must be between " + std::to_string(low) + " and " + std::to_string(high);
  }
  return std::nullopt;
}

// "host:port" with room for the four ports after it (vLLM's port list).
std::optional<std::string> data_parallel_master_error(const std::string& text) {
  const auto endpoint = parse_data_parallel_master(text);
  if (!endpoint) return "expected HOST:PORT (PORT 1 to 65531), got '" + text + "'";
  return std::nullopt;
}

std::optional<std::string> positive(double value) {
  if (!(value > 0)) return std::string("must be a positive number of seconds");
  return std::nullopt;
}

std::optional<std::string> non_negative(double value) {
  if (!(value >= 0)) return std::string("must be 0 (none) or a positive number of seconds");
  return std::nullopt;
}

// The settings table. Flags and variables are part of the interface (docs/product.md §3.3).
const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = {
      {"server.host", "--host", "VLLMD_HOST", Kind::kString, "address to listen on",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.host = as<std::string>(v);
         if (c.host.empty()) return "must not be empty";
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.host; }},
      {"server.port", "--port", "VLLMD_PORT", Kind::kInt, "TCP port (0 picks a free one)",
       [](Config& c, const Value& v) {
         c.port = static_cast<int>(as<std::int64_t>(v));
         return in_range(as<std::int64_t>(v), 0, 65535);
       },
       [](const Config& c) -> Value { return std::int64_t{c.port}; }},
      {"server.dev_mode", "--dev-mode", "VLLM_SERVER_DEV_MODE", Kind::kBool,
       "serve the weight-sync routes (off: they answer 404)",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.dev_mode = as<bool>(v);
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.dev_mode; }},
      {"server.threads", "", "VLLMD_THREADS", Kind::kInt,
       "threads that validate large request bodies and run reloads (never waiting for engines)",
       [](Config& c, const Value& v) {
         c.threads = static_cast<int>(as<std::int64_t>(v));
         return in_range(as<std::int64_t>(v), 1, 1024);
       },
       [](const Config& c) -> Value { return std::int64_t{c.threads}; }},
      {"server.max_queued", "", "VLLMD_MAX_QUEUED", Kind::kInt,
       "large requests waiting for one of server.threads (503 beyond)",
       [](Config& c, const Value& v) {
         c.max_queued = static_cast<int>(as<std::int64_t>(v));
         return in_range(as<std::int64_t>(v), 1, 100000);
       },
       [](const Config& c) -> Value { return std::int64_t{c.max_queued}; }},
      {"server.max_connections", "", "VLLMD_MAX_CONNECTIONS", Kind::kInt,
       "open connections, idle ones included (closed with 503 beyond)",
       [](Config& c, const Value& v) {
         c.max_connections = static_cast<int>(as<std::int64_t>(v));
         return in_range(as<std::int64_t>(v), 1, 1000000);
       },
       [](const Config& c) -> Value { return std::int64_t{c.max_connections}; }},
      {"server.max_header_bytes", "", "VLLMD_MAX_HEADER_BYTES", Kind::kInt,
       "largest request line plus headers (431 beyond)",
       [](Config& c, const Value& v) {
         c.max_header_bytes = static_cast<int>(as<std::int64_t>(v));
         return in_range(as<std::int64_t>(v), 1024, 1 << 20);
       },
       [](const Config& c) -> Value { return std::int64_t{c.max_header_bytes}; }},
      {"server.tls_cert_file", "--tls-cert-file", "VLLMD_TLS_CERT_FILE", Kind::kString,
       "PEM certificate (chain) for HTTPS; with server.tls_key_file",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.tls_cert_file = as<std::string>(v);
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.tls_cert_file; }},
      {"server.tls_key_file", "--tls-key-file", "VLLMD_TLS_KEY_FILE", Kind::kString,
       "PEM private key for HTTPS; with server.tls_cert_file",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.tls_key_file = as<std::string>(v);
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.tls_key_file; }},
      {"server.timeout", "", "VLLMD_TIMEOUT", Kind::kDouble,
       "seconds a client may stall mid-request",
       [](Config& c, const Value& v) {
         c.timeout = as<double>(v);
         return positive(c.timeout);
       },
       [](const Config& c) -> Value { return c.timeout; }},
      {"server.keep_alive_timeout", "", "VLLMD_KEEP_ALIVE_TIMEOUT", Kind::kDouble,
       "seconds an idle keep-alive connection is kept",
       [](Config& c, const Value& v) {
         c.keep_alive_timeout = as<double>(v);
         return positive(c.keep_alive_timeout);
       },
       [](const Config& c) -> Value { return c.keep_alive_timeout; }},
      {"server.drain_timeout", "", "VLLMD_DRAIN_TIMEOUT", Kind::kDouble,
       "seconds requests in flight at shutdown may take before they fail with 503",
       [](Config& c, const Value& v) {
         c.drain_timeout = as<double>(v);
         return positive(c.drain_timeout);
       },
       [](const Config& c) -> Value { return c.drain_timeout; }},
      {"server.session_idle_timeout", "", "VLLMD_SESSION_IDLE_TIMEOUT", Kind::kDouble,
       "seconds an owned weight-update session may sit idle before any client may continue it",
       [](Config& c, const Value& v) {
         c.session_idle_timeout = as<double>(v);
         return positive(c.session_idle_timeout);
       },
       [](const Config& c) -> Value { return c.session_idle_timeout; }},
      {"server.max_body_bytes", "--max-body-bytes", "VLLMD_MAX_BODY_BYTES", Kind::kInt,
       "largest request body accepted (413 beyond)",
       [](Config& c, const Value& v) {
         c.max_body_bytes = as<std::int64_t>(v);
         return in_range(c.max_body_bytes, 1, std::int64_t{1} << 40);
       },
       [](const Config& c) -> Value { return c.max_body_bytes; }},
      {"server.api_keys", "--api-key", "VLLM_API_KEY", Kind::kStrings,
       "bearer tokens accepted (several allow rotation)",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.api_keys = as<Strings>(v);
         for (const std::string& key : c.api_keys) {
           if (key.empty()) return "keys must not be empty";
         }
         return std::nullopt;
       },
       [](const Config& c) -> Value { return Strings(c.api_keys.size(), "<redacted>"); }},
      {"server.api_key_file", "--api-key-file", "VLLMD_API_KEY_FILE", Kind::kString,
       "file with one bearer token per line",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.api_key_file = as<std::string>(v);
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.api_key_file; }},
      {"server.port_file", "--port-file", "VLLMD_PORT_FILE", Kind::kString,
       "write the bound port here once listening",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.port_file = as<std::string>(v);
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.port_file; }},
      {"server.allowlist", "--allow", "VLLMD_ALLOWLIST", Kind::kStrings,
       "CIDR block of peers allowed on every route but /health (repeatable or comma-separated)",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.allowlist = as<Strings>(v);
         for (const std::string& block : c.allowlist) {
           if (auto parsed = util::Cidr::parse(block); !parsed) {
             return "invalid server.allowlist entry: " + parsed.error();
           }
         }
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.allowlist; }},
      {"server.insecure_dev_mode", "--insecure-dev-mode", "VLLMD_INSECURE_DEV_MODE", Kind::kBool,
       "allow dev mode on a non-loopback address without API keys or an allowlist",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.insecure_dev_mode = as<bool>(v);
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.insecure_dev_mode; }},
      {"engine.mode", "--engine", "VLLMD_ENGINE", Kind::kString, "embedded|external|managed",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         const std::string& mode = as<std::string>(v);
         c.mode_set = true;
         if (mode == "embedded")
           c.mode = EngineMode::kEmbedded;
         else if (mode == "external")
           c.mode = EngineMode::kExternal;
         else if (mode == "managed")
           c.mode = EngineMode::kManaged;
         else
           return "must be embedded, external or managed, got '" + mode + "'";
         return std::nullopt;
       },
       [](const Config& c) -> Value { return std::string(mode_name(c.mode)); }},
      {"engine.handshake_address", "--handshake-address", "VLLMD_HANDSHAKE_ADDRESS", Kind::kString,
       "where engines connect: tcp://host:port or ipc:///path",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.handshake_address = as<std::string>(v);
         if (!c.handshake_address.starts_with("tcp://") &&
             !c.handshake_address.starts_with("ipc://")) {
           return "must start with tcp:// or ipc://";
         }
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.handshake_address; }},
      {"engine.advertised_host", "", "VLLMD_ADVERTISED_HOST", Kind::kString,
       "host engines use to reach this machine (when binding all interfaces)",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.advertised_host = as<std::string>(v);
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.advertised_host; }},
      {"engine.data_parallel_size", "--data-parallel-size", "VLLMD_DATA_PARALLEL_SIZE", Kind::kInt,
       "number of engines (DP ranks)",
       [](Config& c, const Value& v) {
         c.data_parallel_size = static_cast<int>(as<std::int64_t>(v));
         return in_range(as<std::int64_t>(v), 1, 65536);
       },
       [](const Config& c) -> Value { return std::int64_t{c.data_parallel_size}; }},
      {"engine.data_parallel_master", "--data-parallel-master", "VLLMD_DATA_PARALLEL_MASTER",
       Kind::kString, "coordinated (MoE) DP: HOST:PORT where the ranks form their DP group",
       [](Config& c, const Value& v) {
         c.data_parallel_master = as<std::string>(v);
         return c.data_parallel_master.empty() ? std::nullopt
                                               : data_parallel_master_error(c.data_parallel_master);
       },
       [](const Config& c) -> Value { return c.data_parallel_master; }},
      {"engine.command", "--engine-command", "VLLMD_ENGINE_COMMAND", Kind::kStrings,
       "managed mode: engine argv; {handshake_address}, {handshake_host}, {handshake_port} filled "
       "in",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.command = as<Strings>(v);
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.command; }},
      {"engine.call_timeout", "--call-timeout", "VLLMD_CALL_TIMEOUT", Kind::kDouble,
       "seconds a weight-sync call may take in the engines",
       [](Config& c, const Value& v) {
         c.call_timeout = as<double>(v);
         return positive(c.call_timeout);
       },
       [](const Config& c) -> Value { return c.call_timeout; }},
      {"engine.query_timeout", "", "VLLMD_QUERY_TIMEOUT", Kind::kDouble,
       "seconds a version or pause query may take",
       [](Config& c, const Value& v) {
         c.query_timeout = as<double>(v);
         return positive(c.query_timeout);
       },
       [](const Config& c) -> Value { return c.query_timeout; }},
      {"engine.startup_timeout", "--engine-startup-timeout", "VLLMD_ENGINE_STARTUP_TIMEOUT",
       Kind::kDouble,
       "seconds from HELLO to READY (the model load) before an engine reads as dead "
       "(a later READY is still admitted); 0: no limit",
       [](Config& c, const Value& v) {
         c.startup_timeout = as<double>(v);
         return non_negative(c.startup_timeout);
       },
       [](const Config& c) -> Value { return c.startup_timeout; }},
      {"engine.probe_interval", "", "VLLMD_ENGINE_PROBE_INTERVAL", Kind::kDouble,
       "seconds between liveness probes of an idle engine; 0: none",
       [](Config& c, const Value& v) {
         c.probe_interval = as<double>(v);
         return non_negative(c.probe_interval);
       },
       [](const Config& c) -> Value { return c.probe_interval; }},
      {"engine.world_size", "", "VLLMD_WORLD_SIZE", Kind::kInt,
       "world size per engine when its registration is empty",
       [](Config& c, const Value& v) {
         c.world_size = as<std::int64_t>(v);
         return in_range(c.world_size, 1, 1 << 20);
       },
       [](const Config& c) -> Value { return c.world_size; }},
      {"engine.backend", "", "VLLMD_BACKEND", Kind::kString,
       "embedded engine's weight transfer backend: nccl|ipc|none",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.backend = as<std::string>(v);
         reference::Backend parsed;
         if (!reference::parse_backend(c.backend, parsed)) return "must be nccl, ipc or none";
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.backend; }},
      {"engine.tensor_parallel_size", "", "VLLMD_TENSOR_PARALLEL_SIZE", Kind::kInt,
       "embedded engine's TP workers",
       [](Config& c, const Value& v) {
         c.tensor_parallel_size = static_cast<int>(as<std::int64_t>(v));
         return in_range(as<std::int64_t>(v), 1, 1024);
       },
       [](const Config& c) -> Value { return std::int64_t{c.tensor_parallel_size}; }},
      {"log.level", "--log-level", "VLLMD_LOG_LEVEL", Kind::kString,
       "trace|debug|info|notice|warning|error",
       [](Config& c, const Value& v) -> std::optional<std::string> {
         c.log_level = as<std::string>(v);
         log::Level level;
         if (!log::parse_level(c.log_level, level)) {
           return "must be trace, debug, info, notice, warning or error";
         }
         return std::nullopt;
       },
       [](const Config& c) -> Value { return c.log_level; }},
  };
  return table;
}

Strings split_words(std::string_view text) {
  Strings words;
  std::string word;
  char quote = 0;
  bool in_word = false;
  for (const char c : text) {
    if (quote != 0) {
      if (c == quote)
        quote = 0;
      else
        word.push_back(c);
    } else if (c == '"' || c == '\'') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      word.push_back(c);
      in_word = true;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

// A flag's or variable's text as a value of the setting's kind.
tl::expected<Value, std::string> parse_text(const Setting& setting, std::string_view text) {
  switch (setting.kind) {
    case Kind::kBool: {
      if (setting.env == "VLLM_SERVER_DEV_MODE" && !text.empty() &&
          text.find_first_not_of("-0123456789") == std::string_view::npos) {
        return Value(std::strtoll(std::string(text).c_str(), nullptr, 10) != 0);  // as vLLM
      }
      if (text == "true" || text == "1" || text == "yes" || text == "on") return Value(true);
      if (text == "false" || text == "0" || text == "no" || text == "off") return Value(false);
      return tl::unexpected("expected a boolean, got '" + std::string(text) + "'");
    }
    case Kind::kInt: {
      std::int64_t value = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error != std::errc() || end != text.data() + text.size()) {
        return tl::unexpected("expected an integer, got '" + std::string(text) + "'");
      }
      return Value(value);
    }
    case Kind::kDouble: {
      double value = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error != std::errc() || end != text.data() + text.size()) {
        return tl::unexpected("expected a number, got '" + std::string(text) + "'");
      }
      return Value(value);
    }
    case Kind::kString: return Value(std::string(text));
    case Kind::kStrings:
      if (setting.key == "server.api_keys") return Value(Strings{std::string(text)});
      if (setting.key == "server.allowlist") {
        Strings blocks;
        std::size_t start = 0;
        while (start <= text.size()) {
          std::size_t end = text.find(',', start);
          if (end == std::string_view::npos) end = text.size();
          std::string_view item = text.substr(start, end - start);
          while (!item.empty() && (item.front() == ' ' || item.front() == '\t'))
            item.remove_prefix(1);
          while (!item.empty() && (item.back() == ' ' || item.back() == '\t'))
            item.remove_suffix(1);
          if (!item.empty()) blocks.emplace_back(item);
          start = end + 1;
        }
        return Value(blocks);
      }
      return Value(split_words(text));
  }
  return tl::unexpected(std::string("unsupported setting"));
}

tl::expected<Value, std::string> parse_toml(const Setting& setting, const toml::node& node) {
  switch (setting.kind) {
    case Kind::kBool:
      if (auto v = node.value<bool>(); v && node.is_boolean()) return Value(*v);
      return tl::unexpected(std::string("expected a boolean"));
    case Kind::kInt:
      if (node.is_integer()) return Value(*node.value<std::int64_t>());
      return tl::unexpected(std::string("expected an integer"));
    case Kind::kDouble:
      if (node.is_number()) return Value(*node.value<double>());
      return tl::unexpected(std::string("expected a number"));
    case Kind::kString:
      if (node.is_string()) return Value(*node.value<std::string>());
      return tl::unexpected(std::string("expected a string"));
    case Kind::kStrings: {
      const toml::array* array = node.as_array();
      if (array == nullptr) return tl::unexpected(std::string("expected an array of strings"));
      Strings items;
      for (const toml::node& item : *array) {
        if (!item.is_string()) return tl::unexpected(std::string("expected an array of strings"));
        items.push_back(*item.value<std::string>());
      }
      return Value(items);
    }
  }
  return tl::unexpected(std::string("unsupported setting"));
}

std::optional<ConfigError> apply(Config& config, const Setting& setting,
                                 tl::expected<Value, std::string> value, std::string_view source) {
  if (!value) return ConfigError{std::string(source), value.error()};
  if (auto problem = setting.set(config, *value)) return ConfigError{std::string(source), *problem};
  return std::nullopt;
}

// Applies a parsed TOML document's settings to `config`.
std::optional<ConfigError> apply_table(Config& config, const toml::table& table) {
  // Unknown keys are mistakes (a typo would silently keep a default): refuse them.
  for (const auto& [section, node] : table) {
    const toml::table* inner = node.as_table();
    if (inner == nullptr) {
      return ConfigError{std::string(section.str()), "unknown setting (expected a [section])"};
    }
    for (const auto& [name, value] : *inner) {
      const std::string key = std::string(section.str()) + "." + std::string(name.str());
      bool known = false;
      for (const Setting& setting : settings()) known = known || setting.key == key;
      if (!known) return ConfigError{key, "unknown setting"};
    }
  }
  for (const Setting& setting : settings()) {
    const toml::node_view node = table.at_path(setting.key);
    if (!node) continue;
    if (auto error = apply(config, setting, parse_toml(setting, *node.node()), setting.key)) {
      return error;
    }
  }
  return std::nullopt;
}

std::optional<ConfigError> apply_file(Config& config, const std::string& path) {
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& error) {
    std::ostringstream where;
    where << path << ":" << error.source().begin.line;
    return ConfigError{where.str(), std::string(error.description())};
  }
  if (auto error = apply_table(config, table)) return error;
  config.config_file = path;
  return std::nullopt;
}

std::optional<ConfigError> finish(Config& config) {
  if (!config.mode_set) {
    if (!config.command.empty())
      config.mode = EngineMode::kManaged;
    else if (!config.handshake_address.empty())
      config.mode = EngineMode::kExternal;
  }
  switch (config.mode) {
    case EngineMode::kEmbedded:
      if (config.handshake_address.empty()) config.handshake_address = "tcp://127.0.0.1:0";
      break;
    case EngineMode::kExternal:
      if (config.handshake_address.empty()) {
        return ConfigError{"engine.handshake_address", "required in external mode"};
      }
      break;
    case EngineMode::kManaged:
      if (config.command.empty()) return ConfigError{"engine.command", "required in managed mode"};
      if (config.handshake_address.empty()) config.handshake_address = "tcp://127.0.0.1:0";
      break;
  }
  if (config.mode == EngineMode::kEmbedded && config.data_parallel_size != 1) {
    return ConfigError{"engine.data_parallel_size", "the embedded engine runs one DP rank"};
  }
  if (!config.data_parallel_master.empty() && config.data_parallel_size < 2) {
    return ConfigError{"engine.data_parallel_master",
                       "coordinated data parallelism needs engine.data_parallel_size of 2 or more"};
  }
  if (config.tls_cert_file.empty() && !config.tls_key_file.empty()) {
    return ConfigError{"server.tls_cert_file", "required with server.tls_key_file"};
  }
  for (const auto& [key, path] : {std::pair{"server.tls_cert_file", &config.tls_cert_file},
                                  std::pair{"server.tls_key_file", &config.tls_key_file}}) {
    if (!path->empty() && !std::ifstream(*path)) {
      return ConfigError{key, "cannot read '" + *path + "'"};
    }
  }
  if (config.dev_mode && !util::is_loopback_host(config.host) && config.api_keys.empty() &&
      config.api_key_file.empty() && config.allowlist.empty() && !config.insecure_dev_mode) {
    return ConfigError{"server.host",
                       "dev mode on non-loopback address '" + config.host +
                           "' with neither API keys nor an allowlist lets anyone overwrite the "
                           "weights: set server.api_keys or server.allowlist, listen on "
                           "127.0.0.1, or pass --insecure-dev-mode"};
  }
  return std::nullopt;
}

}  // namespace

tl::expected<Config, ConfigError> load_toml_text(std::string_view text) {
  Config config;
  toml::table table;
  try {
    table = toml::parse(text);
  } catch (const toml::parse_error& error) {
    std::ostringstream where;
    where << "line " << error.source().begin.line;
    return tl::unexpected(ConfigError{where.str(), std::string(error.description())});
  }
  if (auto error = apply_table(config, table)) return tl::unexpected(*error);
  if (auto error = finish(config)) return tl::unexpected(*error);
  return config;
}

tl::expected<Invocation, LoadError> load(int argc, const char* const* argv) {
  Invocation invocation;
  CLI::App app{"vllmd: the vLLM weight-synchronization control plane"};
  app.set_version_flag("", "");
  std::string config_path;
  app.add_option("--config", config_path,
                 "TOML configuration file (default /etc/vllmd/vllmd.toml when present)");
  app.add_flag("--print-config", invocation.print_config,
               "print the effective configuration and exit");
  app.add_flag("--check-config", invocation.check_config,
               "validate the configuration and exit (78 when bad)");
  app.add_flag("--print-routes", invocation.print_routes,
               "print the routes vllmd serves (method, path, when, summary) and exit");
  app.add_flag("--version", invocation.version, "print the version and exit");

  // One slot per setting flag: boolean flags switch their setting on; --allow repeats.
  struct FlagValue {
    const Setting* setting = nullptr;
    std::string text;
    Strings texts;
    bool on = false;
  };
  std::vector<FlagValue> flag_values;
  flag_values.reserve(settings().size());
  for (const Setting& setting : settings()) {
    if (setting.flag.empty()) continue;
    FlagValue& slot = flag_values.emplace_back();
    slot.setting = &setting;
    const std::string flag(setting.flag);
    const std::string help(setting.help);
    if (setting.kind == Kind::kBool)
      app.add_flag(flag, slot.on, help);
    else if (setting.key == "server.allowlist")
      app.add_option(flag, slot.texts, help);
    else
      app.add_option(flag, slot.text, help);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    invocation.help = true;
    invocation.help_text = app.help();
    return invocation;
  } catch (const CLI::ParseError& error) {
    return tl::unexpected(LoadError{{"", error.what()}, true});
  }

  Config& config = invocation.config;
  if (config_path.empty()) {
    if (const char* env = std::getenv("VLLMD_CONFIG"))
      config_path = env;
    else if (std::filesystem::exists("/etc/vllmd/vllmd.toml"))
      config_path = "/etc/vllmd/vllmd.toml";
  }
  if (!config_path.empty()) {
    if (!std::filesystem::exists(config_path)) {
      return tl::unexpected(LoadError{{config_path, "configuration file not found"}, false});
    }
    if (auto error = apply_file(config, config_path))
      return tl::unexpected(LoadError{*error, false});
  }
  for (const Setting& setting : settings()) {
    if (setting.env.empty()) continue;
    const char* text = std::getenv(std::string(setting.env).c_str());
    if (text == nullptr || (*text == '\0' && setting.kind != Kind::kString)) continue;
    if (auto error = apply(config, setting, parse_text(setting, text), setting.env)) {
      return tl::unexpected(LoadError{*error, false});
    }
  }
  for (const FlagValue& slot : flag_values) {
    const Setting& setting = *slot.setting;
    if (app.count(std::string(setting.flag)) == 0) continue;
    tl::expected<Value, std::string> value;
    if (setting.kind == Kind::kBool) {
      if (!slot.on) continue;
      value = Value(true);
    } else if (setting.key == "server.allowlist") {
      std::string joined;
      for (const std::string& text : slot.texts) joined += (joined.empty() ? "" : ",") + text;
      value = parse_text(setting, joined);
    } else {
      value = parse_text(setting, slot.text);
    }
    if (auto error = apply(config, setting, std::move(value), setting.flag)) {
      return tl::unexpected(LoadError{*error, false});
    }
  }
  if (auto error = finish(config)) return tl::unexpected(LoadError{*error, false});
  return invocation;
}

std::string to_toml(const Config& config) {
  std::ostringstream out;
  std::string section;
  for (const Setting& setting : settings()) {
    const std::string_view key = setting.key;
    const std::string_view this_section = key.substr(0, key.find('.'));
    if (this_section != section) {
      out << (section.empty() ? "" : "\n") << "[" << this_section << "]\n";
      section = std::string(this_section);
    }
    out << key.substr(key.find('.') + 1) << " = ";
    const Value value = setting.get(config);
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, bool>)
            out << (v ? "true" : "false");
          else if constexpr (std::is_same_v<T, std::string>)
            out << toml::value<std::string>(v);
          else if constexpr (std::is_same_v<T, Strings>) {
            toml::array array;
            for (const std::string& item : v) array.push_back(item);
            out << array;
          } else
            out << v;
        },
        value);
    out << "\n";
  }
  return out.str();
}

}  // namespace vllmd::daemon
