#include "daemon/config.hpp"

#include <toml++/toml.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <variant>

#include "common/reference/core.hpp"
#include "common/reference/model_loader.hpp"
#include "common/util/cidr.hpp"
#include "common/util/log.hpp"
#include "common/util/text.hpp"
#include "common/wire/json_text.hpp"

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

// One visitor of several lambdas.
template <typename... Fs> struct Overloaded : Fs... { using Fs::operator()...; };
template <typename... Fs> Overloaded(Fs...) -> Overloaded<Fs...>;

// The Config member a setting stores. Its type gives the setting's kind; the engine mode is
// stored by name.
using Member = std::variant<bool Config::*, int Config::*, std::int64_t Config::*, double Config::*,
                            std::string Config::*, Strings Config::*, EngineMode Config::*>;

// What a setting's value must be. Each check is one problem() below, with its message.
struct Anything {};
struct IntRange {
  std::int64_t min;
  std::int64_t max;
};
struct NonEmpty {};
struct PositiveSeconds {};
struct NonNegativeSeconds {};
struct Accepted {  // a string `accepts` takes; otherwise `message`
  bool (*accepts)(std::string_view);
  std::string_view message;
};
struct NoEmptyItem {  // a list without an empty string; otherwise `message`
  std::string_view message;
};
struct CidrBlocks {};       // a list of CIDR blocks
struct HostPortOrEmpty {};  // parse_data_parallel_master's HOST:PORT, or empty for none
using Check = std::variant<Anything, IntRange, NonEmpty, PositiveSeconds, NonNegativeSeconds,
                           Accepted, NoEmptyItem, CidrBlocks, HostPortOrEmpty>;

// How a flag's or variable's text reads (a TOML value has its type already).
enum class Text {
  kPlain,      // a scalar as it is; a list as shell-like words
  kOneItem,    // a list of one item, the whole text
  kCommaList,  // a list separated by commas, blanks around items dropped; its flag repeats
  kVllmBool,   // a boolean word, or an integer that is on when nonzero (as vLLM reads it)
};

struct Setting {
  std::string_view key;        // TOML key, "section.name"
  std::string_view flag = {};  // command-line flag, or empty
  std::string_view env = {};   // environment variable, or empty
  std::string_view help;
  Member member;
  Check check = Anything{};
  Text text = Text::kPlain;
  bool secret = false;  // --print-config shows "<redacted>" for each item
};

bool is_zmq_address(std::string_view text) {
  return text.starts_with("tcp://") || text.starts_with("ipc://");
}

bool is_backend(std::string_view text) {
  reference::Backend parsed;
  return reference::parse_backend(text, parsed);
}

bool is_load_format(std::string_view text) {
  reference::LoadFormat parsed;
  return reference::parse_load_format(text, parsed);
}

bool is_log_level(std::string_view text) {
  util::log::Level level;
  return util::log::parse_level(text, level);
}

// The settings table. Flags and variables are part of the interface (docs/product.md §3.3).
constexpr Setting kSettings[] = {
    {.key = "server.host",
     .flag = "--host",
     .env = "VLLMD_HOST",
     .help = "address to listen on",
     .member = &Config::host,
     .check = NonEmpty{}},
    {.key = "server.port",
     .flag = "--port",
     .env = "VLLMD_PORT",
     .help = "TCP port (0 picks a free one)",
     .member = &Config::port,
     .check = IntRange{0, 65535}},
    {.key = "server.dev_mode",
     .flag = "--dev-mode",
     .env = "VLLM_SERVER_DEV_MODE",
     .help = "serve the weight-sync routes (off: they answer 404)",
     .member = &Config::dev_mode,
     .text = Text::kVllmBool},
    {.key = "server.threads",
     .env = "VLLMD_THREADS",
     .help = "threads that validate large request bodies and run reloads (never waiting for "
             "engines)",
     .member = &Config::threads,
     .check = IntRange{1, 1024}},
    {.key = "server.max_queued",
     .env = "VLLMD_MAX_QUEUED",
     .help = "large requests waiting for one of server.threads (503 beyond)",
     .member = &Config::max_queued,
     .check = IntRange{1, 100000}},
    {.key = "server.max_connections",
     .env = "VLLMD_MAX_CONNECTIONS",
     .help = "open connections, idle ones included (closed with 503 beyond)",
     .member = &Config::max_connections,
     .check = IntRange{1, 1000000}},
    {.key = "server.max_header_bytes",
     .env = "VLLMD_MAX_HEADER_BYTES",
     .help = "largest request line plus headers (431 beyond)",
     .member = &Config::max_header_bytes,
     .check = IntRange{1024, 1 << 20}},
    {.key = "server.tls_cert_file",
     .flag = "--tls-cert-file",
     .env = "VLLMD_TLS_CERT_FILE",
     .help = "PEM certificate (chain) for HTTPS; with server.tls_key_file",
     .member = &Config::tls_cert_file},
    {.key = "server.tls_key_file",
     .flag = "--tls-key-file",
     .env = "VLLMD_TLS_KEY_FILE",
     .help = "PEM private key for HTTPS; with server.tls_cert_file",
     .member = &Config::tls_key_file},
    {.key = "server.timeout",
     .env = "VLLMD_TIMEOUT",
     .help = "seconds a client may stall mid-request",
     .member = &Config::timeout,
     .check = PositiveSeconds{}},
    {.key = "server.keep_alive_timeout",
     .env = "VLLMD_KEEP_ALIVE_TIMEOUT",
     .help = "seconds an idle keep-alive connection is kept",
     .member = &Config::keep_alive_timeout,
     .check = PositiveSeconds{}},
    {.key = "server.drain_timeout",
     .env = "VLLMD_DRAIN_TIMEOUT",
     .help = "seconds requests in flight at shutdown may take before they fail with 503",
     .member = &Config::drain_timeout,
     .check = PositiveSeconds{}},
    {.key = "server.session_idle_timeout",
     .env = "VLLMD_SESSION_IDLE_TIMEOUT",
     .help = "seconds an owned weight-update session may sit idle before any client may continue "
             "it",
     .member = &Config::session_idle_timeout,
     .check = PositiveSeconds{}},
    {.key = "server.max_body_bytes",
     .flag = "--max-body-bytes",
     .env = "VLLMD_MAX_BODY_BYTES",
     .help = "largest request body accepted (413 beyond)",
     .member = &Config::max_body_bytes,
     .check = IntRange{1, std::int64_t{1} << 40}},
    {.key = "server.api_keys",
     .flag = "--api-key",
     .env = "VLLM_API_KEY",
     .help = "bearer tokens accepted (several allow rotation)",
     .member = &Config::api_keys,
     .check = NoEmptyItem{"keys must not be empty"},
     .text = Text::kOneItem,
     .secret = true},
    {.key = "server.api_key_file",
     .flag = "--api-key-file",
     .env = "VLLMD_API_KEY_FILE",
     .help = "file with one bearer token per line",
     .member = &Config::api_key_file},
    {.key = "server.port_file",
     .flag = "--port-file",
     .env = "VLLMD_PORT_FILE",
     .help = "write the bound port here once listening",
     .member = &Config::port_file},
    {.key = "server.allowlist",
     .flag = "--allow",
     .env = "VLLMD_ALLOWLIST",
     .help = "CIDR block of peers allowed on every route but /health (repeatable or "
             "comma-separated)",
     .member = &Config::allowlist,
     .check = CidrBlocks{},
     .text = Text::kCommaList},
    {.key = "server.insecure_dev_mode",
     .flag = "--insecure-dev-mode",
     .env = "VLLMD_INSECURE_DEV_MODE",
     .help = "allow dev mode on a non-loopback address without API keys or an allowlist",
     .member = &Config::insecure_dev_mode},
    {.key = "engine.mode",
     .flag = "--engine",
     .env = "VLLMD_ENGINE",
     .help = "embedded|external|managed",
     .member = &Config::mode},
    {.key = "engine.handshake_address",
     .flag = "--handshake-address",
     .env = "VLLMD_HANDSHAKE_ADDRESS",
     .help = "where engines connect: tcp://host:port or ipc:///path",
     .member = &Config::handshake_address,
     .check = Accepted{is_zmq_address, "must start with tcp:// or ipc://"}},
    {.key = "engine.advertised_host",
     .env = "VLLMD_ADVERTISED_HOST",
     .help = "host engines use to reach this machine (when binding all interfaces)",
     .member = &Config::advertised_host},
    {.key = "engine.data_parallel_size",
     .flag = "--data-parallel-size",
     .env = "VLLMD_DATA_PARALLEL_SIZE",
     .help = "number of engines (DP ranks)",
     .member = &Config::data_parallel_size,
     .check = IntRange{1, 65536}},
    {.key = "engine.data_parallel_master",
     .flag = "--data-parallel-master",
     .env = "VLLMD_DATA_PARALLEL_MASTER",
     .help = "coordinated (MoE) DP: HOST:PORT where the ranks form their DP group",
     .member = &Config::data_parallel_master,
     .check = HostPortOrEmpty{}},
    {.key = "engine.command",
     .flag = "--engine-command",
     .env = "VLLMD_ENGINE_COMMAND",
     .help = "managed mode: engine argv; {handshake_address}, {handshake_host}, {handshake_port} "
             "filled in",
     .member = &Config::command},
    {.key = "engine.call_timeout",
     .flag = "--call-timeout",
     .env = "VLLMD_CALL_TIMEOUT",
     .help = "seconds a weight-sync call may take in the engines",
     .member = &Config::call_timeout,
     .check = PositiveSeconds{}},
    {.key = "engine.query_timeout",
     .env = "VLLMD_QUERY_TIMEOUT",
     .help = "seconds a version or pause query may take",
     .member = &Config::query_timeout,
     .check = PositiveSeconds{}},
    {.key = "engine.startup_timeout",
     .flag = "--engine-startup-timeout",
     .env = "VLLMD_ENGINE_STARTUP_TIMEOUT",
     .help = "seconds from HELLO to READY (the model load) before an engine reads as dead "
             "(a later READY is still admitted); 0: no limit",
     .member = &Config::startup_timeout,
     .check = NonNegativeSeconds{}},
    {.key = "engine.probe_interval",
     .env = "VLLMD_ENGINE_PROBE_INTERVAL",
     .help = "seconds between liveness probes of an idle engine; 0: none",
     .member = &Config::probe_interval,
     .check = NonNegativeSeconds{}},
    {.key = "engine.session_imbalance",
     .env = "VLLMD_ENGINE_SESSION_IMBALANCE",
     .help = "requests with the same X-Session-ID stay on one data-parallel engine until it "
             "is not ready or loaded this much above the least loaded (in-flight requests, "
             "waiting ones counted 4 times); then the session moves",
     .member = &Config::session_imbalance,
     .check = IntRange{0, 1 << 20}},
    {.key = "engine.world_size",
     .env = "VLLMD_WORLD_SIZE",
     .help = "world size per engine when its registration is empty",
     .member = &Config::world_size,
     .check = IntRange{1, 1 << 20}},
    {.key = "engine.served_model_name",
     .flag = "--served-model-name",
     .env = "VLLMD_SERVED_MODEL_NAME",
     .help = "the model name GET /v1/models lists (what vllm serve --served-model-name says)",
     .member = &Config::served_model_name,
     .check = NonEmpty{}},
    {.key = "engine.model",
     .flag = "--model",
     .env = "VLLMD_MODEL",
     .help = "local model directory (Hugging Face layout): vocabulary, EOS ids and sampling "
             "defaults for generation; empty: none",
     .member = &Config::model},
    {.key = "engine.backend",
     .env = "VLLMD_BACKEND",
     .help = "embedded engine's weight transfer backend: nccl|ipc|tcp|none",
     .member = &Config::backend,
     .check = Accepted{is_backend, "must be nccl, ipc, tcp or none"}},
    {.key = "engine.load_format",
     .flag = "--load-format",
     .env = "VLLMD_LOAD_FORMAT",
     .help = "embedded engine with a model directory: auto (its safetensors weights when it "
             "has them, else the token formula), safetensors, or dummy (seeded random weights)",
     .member = &Config::load_format,
     .check = Accepted{is_load_format, "must be auto, safetensors or dummy"}},
    {.key = "engine.tensor_parallel_size",
     .env = "VLLMD_TENSOR_PARALLEL_SIZE",
     .help = "embedded engine's TP workers",
     .member = &Config::tensor_parallel_size,
     .check = IntRange{1, 1024}},
    {.key = "log.level",
     .flag = "--log-level",
     .env = "VLLMD_LOG_LEVEL",
     .help = "trace|debug|info|notice|warning|error",
     .member = &Config::log_level,
     .check = Accepted{is_log_level, "must be trace, debug, info, notice, warning or error"}},
};

constexpr Kind kind_of(const Setting& setting) {
  return std::visit(Overloaded{[](bool Config::*) { return Kind::kBool; },
                               [](int Config::*) { return Kind::kInt; },
                               [](std::int64_t Config::*) { return Kind::kInt; },
                               [](double Config::*) { return Kind::kDouble; },
                               [](std::string Config::*) { return Kind::kString; },
                               [](Strings Config::*) { return Kind::kStrings; },
                               [](EngineMode Config::*) { return Kind::kString; }},
                    setting.member);
}

// Each check reads the value as the kind it is for, and each text form is for one kind: a row
// that mixes them up does not compile.
constexpr bool consistent(const Setting& setting) {
  const Kind kind = kind_of(setting);
  const auto needs = [kind](Kind wanted) { return kind == wanted; };
  const bool check_fits = std::visit(
      Overloaded{[](Anything) { return true; }, [&](IntRange) { return needs(Kind::kInt); },
                 [&](PositiveSeconds) { return needs(Kind::kDouble); },
                 [&](NonNegativeSeconds) { return needs(Kind::kDouble); },
                 [&](NonEmpty) { return needs(Kind::kString); },
                 [&](Accepted) { return needs(Kind::kString); },
                 [&](HostPortOrEmpty) { return needs(Kind::kString); },
                 [&](NoEmptyItem) { return needs(Kind::kStrings); },
                 [&](CidrBlocks) { return needs(Kind::kStrings); }},
      setting.check);
  const bool text_fits =
      setting.text == Text::kPlain ||
      (setting.text == Text::kVllmBool ? needs(Kind::kBool) : needs(Kind::kStrings));
  return check_fits && text_fits && (!setting.secret || needs(Kind::kStrings));
}
static_assert(std::all_of(std::begin(kSettings), std::end(kSettings), consistent));

// The checks: what is wrong with a value, if anything.
std::optional<std::string> problem(Anything, const Value&, std::string_view) {
  return std::nullopt;
}

std::optional<std::string> problem(IntRange range, const Value& value, std::string_view) {
  const std::int64_t number = std::get<std::int64_t>(value);
  if (number < range.min || number > range.max) {
    return "must be between " + std::to_string(range.min) + " and " + std::to_string(range.max);
  }
  return std::nullopt;
}

std::optional<std::string> problem(NonEmpty, const Value& value, std::string_view) {
  if (std::get<std::string>(value).empty()) return "must not be empty";
  return std::nullopt;
}

std::optional<std::string> problem(PositiveSeconds, const Value& value, std::string_view) {
  if (!(std::get<double>(value) > 0)) return std::string("must be a positive number of seconds");
  return std::nullopt;
}

std::optional<std::string> problem(NonNegativeSeconds, const Value& value, std::string_view) {
  if (!(std::get<double>(value) >= 0)) {
    return std::string("must be 0 (none) or a positive number of seconds");
  }
  return std::nullopt;
}

std::optional<std::string> problem(Accepted accepted, const Value& value, std::string_view) {
  if (!accepted.accepts(std::get<std::string>(value))) return std::string(accepted.message);
  return std::nullopt;
}

std::optional<std::string> problem(NoEmptyItem check, const Value& value, std::string_view) {
  for (const std::string& item : std::get<Strings>(value)) {
    if (item.empty()) return std::string(check.message);
  }
  return std::nullopt;
}

std::optional<std::string> problem(CidrBlocks, const Value& value, std::string_view key) {
  for (const std::string& block : std::get<Strings>(value)) {
    if (auto parsed = util::Cidr::parse(block); !parsed) {
      return "invalid " + std::string(key) + " entry: " + parsed.error();
    }
  }
  return std::nullopt;
}

// "host:port" with room for the four ports after it (vLLM's port list).
std::optional<std::string> problem(HostPortOrEmpty, const Value& value, std::string_view) {
  const std::string& text = std::get<std::string>(value);
  if (text.empty() || parse_data_parallel_master(text)) return std::nullopt;
  return "expected HOST:PORT (PORT 1 to 65531), got '" + text + "'";
}

// The engine mode, by name. Naming one (even a wrong one) keeps finish() from inferring it.
std::optional<std::string> store_mode(Config& config, EngineMode Config::*member,
                                      const std::string& name) {
  config.mode_set = true;
  for (const EngineMode mode :
       {EngineMode::kEmbedded, EngineMode::kExternal, EngineMode::kManaged}) {
    if (name == mode_name(mode)) {
      config.*member = mode;
      return std::nullopt;
    }
  }
  return "must be embedded, external or managed, got '" + name + "'";
}

// Stores a value of the setting's kind in its member, or says what is wrong with it.
std::optional<std::string> store(Config& config, const Setting& setting, const Value& value) {
  auto stored =
      std::visit(Overloaded{[&](int Config::*member) -> std::optional<std::string> {
                              config.*member = static_cast<int>(std::get<std::int64_t>(value));
                              return std::nullopt;
                            },
                            [&](EngineMode Config::*member) {
                              return store_mode(config, member, std::get<std::string>(value));
                            },
                            [&](auto member) -> std::optional<std::string> {
                              using T = std::remove_reference_t<decltype(config.*member)>;
                              config.*member = std::get<T>(value);
                              return std::nullopt;
                            }},
                 setting.member);
  if (stored) return stored;
  return std::visit([&](const auto& check) { return problem(check, value, setting.key); },
                    setting.check);
}

// A setting's value as --print-config shows it.
Value shown(const Config& config, const Setting& setting) {
  return std::visit(
      Overloaded{[&](int Config::*member) -> Value { return std::int64_t{config.*member}; },
                 [&](EngineMode Config::*member) -> Value {
                   return std::string(mode_name(config.*member));
                 },
                 [&](Strings Config::*member) -> Value {
                   const Strings& items = config.*member;
                   if (setting.secret) return Strings(items.size(), "<redacted>");
                   return items;
                 },
                 [&](auto member) -> Value { return config.*member; }},
      setting.member);
}

const Setting* find_setting(std::string_view key) {
  for (const Setting& setting : kSettings) {
    if (setting.key == key) return &setting;
  }
  return nullptr;
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

tl::expected<Value, std::string> parse_bool(std::string_view text, Text form) {
  if (form == Text::kVllmBool && !text.empty() &&
      text.find_first_not_of("-0123456789") == std::string_view::npos) {
    return Value(std::strtoll(std::string(text).c_str(), nullptr, 10) != 0);  // as vLLM
  }
  if (text == "true" || text == "1" || text == "yes" || text == "on") return Value(true);
  if (text == "false" || text == "0" || text == "no" || text == "off") return Value(false);
  return tl::unexpected("expected a boolean, got '" + std::string(text) + "'");
}

// The whole text as an integer or a double; `what` names the kind in the error.
template <typename T>
tl::expected<Value, std::string> parse_number(std::string_view text, std::string_view what) {
  T value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    return tl::unexpected("expected " + std::string(what) + ", got '" + std::string(text) + "'");
  }
  return Value(value);
}

Strings parse_list(std::string_view text, Text form) {
  switch (form) {
    case Text::kOneItem: return Strings{std::string(text)};
    case Text::kCommaList: {
      const std::vector<std::string_view> items = util::split_list(text);
      return Strings(items.begin(), items.end());
    }
    case Text::kPlain:
    case Text::kVllmBool: break;
  }
  return split_words(text);
}

// A flag's or variable's text as a value of the setting's kind.
tl::expected<Value, std::string> parse_text(const Setting& setting, std::string_view text) {
  switch (kind_of(setting)) {
    case Kind::kBool: return parse_bool(text, setting.text);
    case Kind::kInt: return parse_number<std::int64_t>(text, "an integer");
    case Kind::kDouble: return parse_number<double>(text, "a number");
    case Kind::kString: return Value(std::string(text));
    case Kind::kStrings: return Value(parse_list(text, setting.text));
  }
  return tl::unexpected(std::string("unsupported setting"));
}

tl::expected<Value, std::string> parse_toml(const Setting& setting, const toml::node& node) {
  switch (kind_of(setting)) {
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
  if (auto problem = store(config, setting, *value)) {
    return ConfigError{std::string(source), *problem};
  }
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
      if (find_setting(key) == nullptr) return ConfigError{key, "unknown setting"};
    }
  }
  for (const Setting& setting : kSettings) {
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

namespace {

// One slot per setting flag: boolean flags switch their setting on; a comma list repeats.
struct FlagValue {
  const Setting* setting = nullptr;
  std::string text;
  Strings texts;
  bool on = false;
};

// The command line: vllmd's own flags and one per setting that has a flag.
struct CommandLine {
  CLI::App app{"vllmd: the vLLM weight-synchronization control plane"};
  std::string config_path;
  std::vector<FlagValue> setting_flags;  // reserved up front: the app holds their addresses
};

void add_invocation_flags(CommandLine& line, Invocation& invocation) {
  CLI::App& app = line.app;
  app.set_version_flag("", "");
  app.add_option("--config", line.config_path,
                 "TOML configuration file (default /etc/vllmd/vllmd.toml when present)");
  app.add_flag("--print-config", invocation.print_config,
               "print the effective configuration and exit");
  app.add_flag("--check-config", invocation.check_config,
               "validate the configuration and exit (78 when bad)");
  app.add_flag("--print-routes", invocation.print_routes,
               "print the routes vllmd serves (method, path, when, summary) and exit");
  app.add_flag("--version", invocation.version, "print the version and exit");
}

void add_setting_flags(CommandLine& line) {
  line.setting_flags.reserve(std::size(kSettings));
  for (const Setting& setting : kSettings) {
    if (setting.flag.empty()) continue;
    FlagValue& slot = line.setting_flags.emplace_back();
    slot.setting = &setting;
    const std::string flag(setting.flag);
    const std::string help(setting.help);
    if (kind_of(setting) == Kind::kBool)
      line.app.add_flag(flag, slot.on, help);
    else if (setting.text == Text::kCommaList)
      line.app.add_option(flag, slot.texts, help);
    else
      line.app.add_option(flag, slot.text, help);
  }
}

// --config, else VLLMD_CONFIG, else the system file when there is one; empty: none.
std::string config_file_path(std::string path) {
  if (!path.empty()) return path;
  if (const char* env = std::getenv("VLLMD_CONFIG")) return env;
  if (std::filesystem::exists("/etc/vllmd/vllmd.toml")) return "/etc/vllmd/vllmd.toml";
  return {};
}

std::optional<ConfigError> apply_config_file(Config& config, const std::string& path) {
  if (path.empty()) return std::nullopt;
  if (!std::filesystem::exists(path)) return ConfigError{path, "configuration file not found"};
  return apply_file(config, path);
}

// The settings' variables that are set (an empty one counts for strings only).
std::optional<ConfigError> apply_environment(Config& config) {
  for (const Setting& setting : kSettings) {
    if (setting.env.empty()) continue;
    const char* text = std::getenv(std::string(setting.env).c_str());
    if (text == nullptr || (*text == '\0' && kind_of(setting) != Kind::kString)) continue;
    if (auto error = apply(config, setting, parse_text(setting, text), setting.env)) return error;
  }
  return std::nullopt;
}

// The setting flags given on the command line, over everything else.
std::optional<ConfigError> apply_flags(Config& config, const CommandLine& line) {
  for (const FlagValue& slot : line.setting_flags) {
    const Setting& setting = *slot.setting;
    if (line.app.count(std::string(setting.flag)) == 0) continue;
    tl::expected<Value, std::string> value;
    if (kind_of(setting) == Kind::kBool) {
      if (!slot.on) continue;
      value = Value(true);
    } else if (setting.text == Text::kCommaList) {
      std::string joined;
      for (const std::string& text : slot.texts) joined += (joined.empty() ? "" : ",") + text;
      value = parse_text(setting, joined);
    } else {
      value = parse_text(setting, slot.text);
    }
    if (auto error = apply(config, setting, std::move(value), setting.flag)) return error;
  }
  return std::nullopt;
}

// Defaults < file < environment < flags, then the checks across settings.
std::optional<ConfigError> apply_sources(Config& config, const CommandLine& line) {
  if (auto error = apply_config_file(config, config_file_path(line.config_path))) return error;
  if (auto error = apply_environment(config)) return error;
  if (auto error = apply_flags(config, line)) return error;
  return finish(config);
}

void write_toml_value(std::ostream& out, const Value& value) {
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
}

void write_json_value(std::string& out, const Value& value) {
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          out += v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          wire::append_json_string(out, v);
        } else if constexpr (std::is_same_v<T, Strings>) {
          out += "[";
          for (std::size_t i = 0; i < v.size(); ++i) {
            if (i > 0) out += ",";
            wire::append_json_string(out, v[i]);
          }
          out += "]";
        } else if constexpr (std::is_same_v<T, double>) {
          std::ostringstream number;
          number << v;  // settings are finite (their checks say so)
          out += number.str();
        } else {
          out += std::to_string(v);
        }
      },
      value);
}

}  // namespace

tl::expected<Invocation, LoadError> load(int argc, const char* const* argv) {
  Invocation invocation;
  CommandLine line;
  add_invocation_flags(line, invocation);
  add_setting_flags(line);
  try {
    line.app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    invocation.help = true;
    invocation.help_text = line.app.help();
    return invocation;
  } catch (const CLI::ParseError& error) {
    return tl::unexpected(LoadError{{"", error.what()}, true});
  }
  if (auto error = apply_sources(invocation.config, line)) {
    return tl::unexpected(LoadError{*error, false});
  }
  return invocation;
}

std::string to_toml(const Config& config) {
  std::ostringstream out;
  std::string section;
  for (const Setting& setting : kSettings) {
    const std::string_view key = setting.key;
    const std::string_view this_section = key.substr(0, key.find('.'));
    if (this_section != section) {
      out << (section.empty() ? "" : "\n") << "[" << this_section << "]\n";
      section = std::string(this_section);
    }
    out << key.substr(key.find('.') + 1) << " = ";
    write_toml_value(out, shown(config, setting));
    out << "\n";
  }
  return out.str();
}

std::string to_json(const Config& config) {
  std::string out = "{";
  std::string section;
  for (const Setting& setting : kSettings) {
    const std::string_view key = setting.key;
    const std::string_view this_section = key.substr(0, key.find('.'));
    if (this_section != section) {
      out += (section.empty() ? "" : "},") + wire::json_string(this_section) + ":{";
      section = std::string(this_section);
    } else {
      out += ",";
    }
    out += wire::json_string(key.substr(key.find('.') + 1)) + ":";
    write_json_value(out, shown(config, setting));
  }
  return out + (section.empty() ? "}" : "}}");
}

}  // namespace vllmd::daemon
