#include "daemon/daemon.hpp"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>

#include "common/api/errors.hpp"
#include "common/api/generation.hpp"
#include "common/api/model_info.hpp"
#include "common/api/table.hpp"
#include "common/http/client.hpp"
#include "common/util/cidr.hpp"
#include "common/util/duration.hpp"
#include "common/util/executor.hpp"
#include "common/util/log.hpp"
#include "common/version.hpp"
#include "daemon/config.hpp"
#include "daemon/engines.hpp"
#include "daemon/http_server.hpp"
#include "daemon/notify.hpp"
#include "daemon/server_info.hpp"

namespace vllmd::daemon {

namespace {

// Exit status (docs/product.md §3.4): the codes vllmctl uses too.
namespace exit_code = api::exit_code;

// Signals are handled by sigwait in the main thread; every other thread inherits the mask.
sigset_t block_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (const int number : {SIGTERM, SIGINT, SIGQUIT, SIGHUP}) sigaddset(&set, number);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

tl::expected<std::vector<std::string>, std::string> read_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return tl::unexpected("cannot read " + path);
  std::vector<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty() && line.front() != '#') keys.push_back(line);
  }
  if (keys.empty()) return tl::unexpected(path + " holds no key");
  return keys;
}

// A client for GET /health against our own listener: proof that the event loop accepts,
// reads and answers. Our own certificate need not be trusted: this checks liveness, not
// identity. One attempt of at most 2 s, so a hung loop stops the watchdog soon.
vllmd::http::Client self_check_client(const std::string& host, std::uint16_t port, bool secure) {
  vllmd::http::Endpoint endpoint;
  endpoint.scheme = secure ? "https" : "http";
  endpoint.host = host == "0.0.0.0" ? "127.0.0.1" : (host == "::" ? "::1" : host);
  endpoint.port = port;
  vllmd::http::ClientOptions options;
  options.timeout = std::chrono::seconds(2);
  options.retry.retries = 0;
  options.verify_peer = false;
  return vllmd::http::Client(std::move(endpoint), std::move(options));
}

// Any status counts (503 while engines are down is an answer too).
bool answers_health(const vllmd::http::Client& client) {
  vllmd::http::Request request;
  request.method = "GET";
  request.path = "/health";
  request.retry = false;
  auto reply = client.request(request);
  if (!reply) util::log::warning("watchdog self-check failed: ", reply.error().message);
  return reply.has_value();
}

// What --model's directory says of the model; without one, only its served name.
tl::expected<api::ModelInfo, std::string> model_of(const Config& config) {
  if (config.model.empty()) {
    api::ModelInfo none;
    none.name = config.served_model_name;
    return none;
  }
  return api::load_model_info(config.model, config.served_model_name);
}

// Loads the configuration, the API key file and the model directory it names.
tl::expected<Invocation, LoadError> load_all(int argc, const char* const* argv) {
  auto invocation = load(argc, argv);
  if (!invocation) return invocation;
  Config& config = invocation->config;
  if (!config.api_key_file.empty()) {
    auto keys = read_key_file(config.api_key_file);
    if (!keys) return tl::unexpected(LoadError{{"server.api_key_file", keys.error()}, false});
    config.api_keys.insert(config.api_keys.end(), keys->begin(), keys->end());
  }
  if (auto model = model_of(config); !model) {
    return tl::unexpected(LoadError{{"engine.model", model.error()}, false});
  }
  return invocation;
}

void apply_log_level(const Config& config) {
  util::log::Level level = util::log::Level::kInfo;
  util::log::parse_level(config.log_level, level);
  util::log::set_level(level);
}

Policy policy_of(const Config& config) {
  Policy policy{config.max_body_bytes, config.api_keys, {}};
  for (const std::string& block : config.allowlist) {
    if (auto parsed = util::Cidr::parse(block))
      policy.allowlist.push_back(*parsed);  // checked at load
  }
  return policy;
}

// SIGHUP: read everything again; apply what can change while running, all at once, or
// nothing when the new configuration is invalid.
std::optional<std::string> reload(int argc, const char* const* argv, const Config& running,
                                  ServerContext& context) {
  auto fresh = load_all(argc, argv);
  if (!fresh) {
    util::log::error("reload failed, keeping the running configuration: ",
                     fresh.error().error.line());
    return fresh.error().error.line();
  }
  const Config& next = fresh->config;
  const bool restart_needed =
      next.host != running.host || next.port != running.port || next.dev_mode != running.dev_mode ||
      next.threads != running.threads || next.insecure_dev_mode != running.insecure_dev_mode ||
      next.handshake_address != running.handshake_address || next.mode != running.mode ||
      next.data_parallel_size != running.data_parallel_size || next.command != running.command ||
      next.model != running.model || next.load_format != running.load_format;
  if (restart_needed) {
    util::log::warning(
        "reload: listener, dev-mode or engine settings changed; they apply at the next "
        "restart");
  }
  // Said once the new policy serves (a client that saw the line must meet it), and before
  // the new level applies, so the line survives a move to a quieter level.
  context.set_policy(policy_of(next));
  util::log::notice("configuration reloaded: log level ", next.log_level, ", ",
                    next.api_keys.size(), " API key(s), ", next.allowlist.size(),
                    " allowlist block(s), body limit ", next.max_body_bytes, " bytes");
  apply_log_level(next);
  return std::nullopt;
}

// One line per route of the API table: method, path, "dev" (dev mode only) or "always",
// and its summary, tab-separated.
void print_routes() {
  for (const api::Route& route : api::routes()) {
    std::cout << route.method << "\t" << route.path << "\t" << (route.dev_only ? "dev" : "always")
              << "\t" << route.summary << "\n";
  }
}

api::Response render_metrics(const Metrics& metrics, Engines& engines, const HttpServer& server,
                             const util::Executor& executor, const api::WeightSyncService& service,
                             const api::GenerationService& generation,
                             std::string_view model_name) {
  const http::ServerStats stats = server.stats();
  const ConnectionGauges connections{stats.connections, stats.handling,
                                     static_cast<int>(executor.queued()), stats.refused,
                                     stats.total};
  api::Response response;
  response.content_type = "text/plain; version=0.0.4; charset=utf-8";
  response.body = metrics.render(engines.client().engines(), engines.client().pending_calls(),
                                 connections, service.sleep_states(), generation.in_flight(),
                                 engines.client().loads(), model_name);
  return response;
}

api::ServiceOptions service_options(const Config& config) {
  api::ServiceOptions options;
  options.lifecycle_timeout = util::milliseconds_of(config.call_timeout);
  options.query_timeout = util::milliseconds_of(config.query_timeout);
  options.world_size_fallback = config.world_size;
  options.session_idle_timeout = util::milliseconds_of(config.session_idle_timeout);
  options.served_model_name = config.served_model_name;
  return options;
}

// Bad invocations, and those that only print (--help, --version, --print-config,
// --check-config): the exit status when vllmd stops here; nothing when it goes on to serve.
std::optional<int> answer_without_serving(const tl::expected<Invocation, LoadError>& invocation) {
  if (!invocation) {
    std::fprintf(stderr, "vllmd: %s\n", invocation.error().error.line().c_str());
    return invocation.error().usage ? exit_code::kUsage : exit_code::kConfig;
  }
  if (invocation->help) {
    std::cout << invocation->help_text;
    return 0;
  }
  if (invocation->print_routes) {
    print_routes();
    return 0;
  }
  if (invocation->version) {
    std::cout << "vllmd " << kVersion << "\n";
    return 0;
  }
  const Config& config = invocation->config;
  if (invocation->print_config) {
    std::cout << to_toml(config);
    return 0;
  }
  if (invocation->check_config) {
    std::cout << "configuration OK"
              << (config.config_file.empty() ? "" : " (" + config.config_file + ")") << "\n";
    return 0;
  }
  return std::nullopt;
}

void log_model(const Config& config, const api::ModelInfo& model) {
  if (config.model.empty()) {
    util::log::notice(
        "no model directory (engine.model, --model): generation stops only at "
        "max_tokens, max_model_len or the stop_token_ids a request names, and "
        "prompts are not checked against the vocabulary");
    return;
  }
  std::string eos = model.eos_token_id ? std::to_string(*model.eos_token_id) : "none";
  for (const std::int64_t id : model.extra_eos_token_ids) eos += "," + std::to_string(id);
  util::log::info("model ", config.model, ": vocabulary ",
                  model.vocab_size ? std::to_string(*model.vocab_size) : "unknown", ", EOS ids ",
                  eos,
                  model.max_new_tokens ? ", max_new_tokens " + std::to_string(*model.max_new_tokens)
                                       : std::string());
}

void log_starting(const Config& config) {
  util::log::info("vllmd ", kVersion, " starting: engine mode ", mode_name(config.mode),
                  config.config_file.empty() ? "" : ", config " + config.config_file);
  if (config.dev_mode) {
    util::log::warning("dev mode is on: the weight-sync routes can overwrite the model's weights");
  }
  if (config.dev_mode && !util::is_loopback_host(config.host) && config.api_keys.empty() &&
      config.allowlist.empty()) {
    util::log::warning("insecure dev mode: listening on non-loopback address ", config.host,
                       " with neither API keys nor an allowlist; anyone who can reach it can "
                       "overwrite the weights (server.insecure_dev_mode)");
  }
}

// vllmd once its configuration is loaded. The parts are declared in the order they start; after
// drain() has destroyed the server and the engines, the rest go in reverse.
class Daemon {
 public:
  Daemon(int argc, const char* const* argv, const Config& config)
      : argc_(argc), argv_(argv), config_(config) {}

  // The port first: a second vllmd on a port in use stops here, before it starts engines.
  // The exit status when something cannot start.
  std::optional<int> start() {
    if (auto status = open_listener()) return status;
    if (auto status = start_engines_and_service()) return status;
    start_serving();
    return std::nullopt;
  }

  // SIGHUP reloads; any other signal returns.
  void serve_signals(const sigset_t& signals) {
    for (;;) {
      int number = 0;
      if (sigwait(&signals, &number) != 0) continue;
      if (number == SIGHUP) {
        reload_all();
        continue;
      }
      util::log::notice("signal ", number, ": shutting down");
      return;
    }
  }

  // No new connections; calls in flight may finish until the deadline, then the engine link
  // closes so they fail with 503 rather than being cut off without an answer.
  void drain() {
    notifier_->stopping();
    server_->stop_accepting();
    // Generations would run up to max_tokens: each ends now with its tokens and "abort".
    generation_->abort_all();
    if (!server_->wait_idle(config_.drain_timeout)) {
      util::log::warning("requests still in flight after ", config_.drain_timeout,
                         " s; failing them with 503");
      engines_->client().close();
      server_->wait_idle(2);
    }
    server_->abort();
    executor_->stop();
    server_.reset();
    engines_.reset();
    util::log::notice("stopped");
  }

 private:
  std::optional<int> open_listener() {
    try {
      server_ = std::make_unique<HttpServer>(config_, context_);
    } catch (const Poco::Exception& error) {
      util::log::error("server.tls_cert_file/server.tls_key_file: cannot use them: ",
                       error.displayText());
      return exit_code::kConfig;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "vllmd: %s\n", error.what());
      return exit_code::kUnavailable;
    }
    return std::nullopt;
  }

  std::optional<int> start_engines_and_service() {
    auto engines = Engines::start(config_);
    if (!engines) {
      util::log::error("cannot start the engine link: ", engines.error());
      return exit_code::kUnavailable;
    }
    engines_ = std::move(*engines);
    // Validation of large bodies and reloads; nothing here waits for engines or clients.
    executor_.emplace(config_.threads, "vllmd-exec");
    service_.emplace(engines_->client(), service_options(config_), &*executor_);
    auto model = model_of(config_);
    if (!model) {  // checked at load; the directory changed since
      util::log::error("engine.model: ", model.error());
      return exit_code::kConfig;
    }
    log_model(config_, *model);
    generation_.emplace(engines_->client(), engines_->client(), std::move(*model));
    service_->label_commits(&committed_version_);
    generation_->label_tokens(&committed_version_);
    // The engines go before the service (drain()): they never call it after it is gone.
    engines_->client().set_state_listener(
        [this](const engine::EngineStatus& engine) { service_->on_engine_state(engine); });
    service_->set_operation_observer([this](const api::OperationEvent& event) {
      if (!event.finished) return metrics_.operation_started(event.operation);
      metrics_.operation_finished(event.operation, event.seconds, event.succeeded,
                                  event.reached_engine);
    });
    return std::nullopt;
  }

  // Requests are served from here on; the watchdog and the daemon's routes are wired up.
  void start_serving() {
    context_.service = &*service_;
    context_.generation = &*generation_;
    context_.metrics = &metrics_;
    context_.executor = &*executor_;
    context_.max_queued = config_.max_queued;
    context_.dev_mode = config_.dev_mode;
    context_.set_policy(policy_of(config_));
    server_->start();
    util::log::notice("listening on ", server_->secure() ? "https://" : "http://", config_.host,
                      ":", server_->port());
    if (!config_.port_file.empty()) {
      std::ofstream(config_.port_file) << server_->port() << "\n";
    }
    // The watchdog is fed while a request over the socket is answered (whatever its status:
    // API keys and allowlists do not matter) and the executor runs tasks.
    notifier_.emplace(
        engines_->client(),
        [this, self_check = self_check_client(config_.host, server_->port(), server_->secure())] {
          return answers_health(self_check) && executor_->responsive(std::chrono::seconds(2));
        });
    notifier_->start();
    service_->set_daemon_hooks(
        {.metrics =
             [this] {
               return render_metrics(metrics_, *engines_, *server_, *executor_, *service_,
                                     *generation_, config_.served_model_name);
             },
         .reload = [this] { return reload_all(); },
         .server_info =
             [this](bool json_config) {
               return server_info(config_, engines_->client().engines(), json_config);
             }});
  }

  // SIGHUP and POST /reload (vllmctl reload, for ExecReload=) take this path, one at a time.
  std::optional<std::string> reload_all() {
    std::lock_guard lock(reload_mutex_);
    notifier_->reloading();
    auto error = reload(argc_, argv_, config_, context_);
    notifier_->reloaded();
    return error;
  }

  const int argc_;
  const char* const* const argv_;
  const Config& config_;
  ServerContext context_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<Engines> engines_;
  std::optional<util::Executor> executor_;
  api::CommittedVersion committed_version_;  // before both services, which hold it
  std::optional<api::WeightSyncService> service_;
  std::optional<api::GenerationService> generation_;
  Metrics metrics_;
  std::optional<Notifier> notifier_;
  std::mutex reload_mutex_;
};

}  // namespace

int run(int argc, const char* const* argv) {
  const sigset_t signals = block_signals();
  util::log::set_component("vllmd");
  const auto invocation = load_all(argc, argv);
  if (const auto status = answer_without_serving(invocation)) return *status;
  const Config& config = invocation->config;
  apply_log_level(config);
  log_starting(config);

  Daemon daemon(argc, argv, config);
  if (const auto status = daemon.start()) return *status;
  daemon.serve_signals(signals);
  daemon.drain();
  return 0;
}

}  // namespace vllmd::daemon
