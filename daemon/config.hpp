#pragma once
// vllmd's configuration: defaults < TOML file < environment < flags (docs/product.md §3.2).
// Every setting is one row of a table that gives its TOML key, flag and environment variable,
// so the three sources, --print-config and the man page cannot drift apart.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tl/expected.hpp>
#include <vector>

namespace vllmd::daemon {

enum class EngineMode { kEmbedded, kExternal, kManaged };
std::string_view mode_name(EngineMode mode);

struct Config {
  // [server]
  std::string host = "127.0.0.1";
  int port = 8000;
  bool dev_mode = false;
  int threads = 4;      // executor: large-body validation, reloads
  int max_queued = 64;  // complete requests waiting for a worker
  int max_connections = 4096;
  int max_header_bytes = 16384;
  std::string tls_cert_file;          // set: HTTPS only
  std::string tls_key_file;           // empty: in the certificate file
  double timeout = 10;                // seconds a connection may sit idle mid-request
  double keep_alive_timeout = 5;      // seconds an idle keep-alive connection is kept
  double drain_timeout = 30;          // seconds in-flight requests get at shutdown
  double session_idle_timeout = 600;  // an owned weight-update session idle this long: anonymous
  std::int64_t max_body_bytes = 128LL << 20;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::string port_file;               // written with the bound port once listening
  std::vector<std::string> allowlist;  // CIDR blocks of allowed peers; empty: all
  bool insecure_dev_mode = false;      // allow dev mode on a non-loopback address unprotected
  // [engine]
  EngineMode mode = EngineMode::kEmbedded;
  bool mode_set = false;
  std::string handshake_address;  // default per mode
  std::string advertised_host;
  int data_parallel_size = 1;
  std::string data_parallel_master;  // "host:port": coordinated (MoE) DP; INIT carries it
  std::vector<std::string> command;  // managed: argv, {handshake_address} etc. filled in
  double call_timeout = 1800;        // lifecycle calls (NCCL init/update block for minutes)
  double query_timeout = 10;
  double startup_timeout = 0;                 // HELLO -> READY (model load); 0: none
  double probe_interval = 10;                 // liveness probe of an idle engine; 0: off
  std::int64_t session_imbalance = 32;        // X-Session-ID: load above the least loaded to move
  std::int64_t world_size = 1;                // for engines that send an empty registration
  std::string served_model_name = "default";  // GET /v1/models
  std::string model;             // --model DIR: config.json and generation_config.json; empty: none
  std::string backend = "nccl";  // embedded reference engine
  // Embedded engine with --model: auto|safetensors|dummy (model_loader.hpp).
  std::string load_format = "auto";
  int tensor_parallel_size = 1;  // embedded reference engine
  // [log]
  std::string log_level = "info";

  std::string config_file;  // the file read, if any
};

struct ConfigError {
  std::string key;  // the setting at fault: TOML key, flag or variable as the user wrote it
  std::string message;
  std::string line() const { return key.empty() ? message : key + ": " + message; }
};

// What the command line asked for besides settings.
struct Invocation {
  Config config;
  bool print_config = false;
  bool check_config = false;
  bool print_routes = false;
  bool version = false;
  bool help = false;
  std::string help_text;
};

// Parses argv, the environment and the config file. Usage errors and bad settings are
// ConfigErrors; `usage` tells which (exit 64 vs 78).
struct LoadError {
  ConfigError error;
  bool usage = false;
};
tl::expected<Invocation, LoadError> load(int argc, const char* const* argv);

// A TOML configuration document applied to the defaults, as a --config file would be (same
// checks, same errors; syntax errors are keyed "line <n>"), without the environment or flags.
tl::expected<Config, ConfigError> load_toml_text(std::string_view text);

// engine.data_parallel_master: "host:port" ("[v6]:port" too), the port with the four after
// it free for vLLM's port list (1 to 65531).
struct HostPort {
  std::string host;
  int port = 0;
};
std::optional<HostPort> parse_data_parallel_master(std::string_view text);

// The effective configuration as TOML, and as JSON ({"section": {"name": value}}); secrets
// are "<redacted>" in both.
std::string to_toml(const Config& config);
std::string to_json(const Config& config);

}  // namespace vllmd::daemon
