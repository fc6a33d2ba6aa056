#include "daemon/daemon.hpp"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>

#include "common/api/errors.hpp"
#include "common/api/table.hpp"
#include "common/util/cidr.hpp"
#include "common/util/executor.hpp"
#include "common/util/log.hpp"
#include "common/version.hpp"
#include "daemon/config.hpp"
#include "daemon/engines.hpp"
#include "daemon/http_server.hpp"
#include "daemon/notify.hpp"

#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/HTTPSClientSession.h>

namespace vllmd::daemon {

namespace {

constexpr int kExitConfig = 78;
constexpr int kExitUsage = 64;
constexpr int kExitUnavailable = 69;

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

// One GET /health against our own listener: proof that the event loop accepts, reads and
// answers. Any status counts (503 while engines are down is an answer too).
bool probe_server(const std::string& host, std::uint16_t port, bool secure) {
  const std::string target = host == "0.0.0.0" ? "127.0.0.1" : (host == "::" ? "::1" : host);
  try {
    // Our own certificate need not be trusted for this: it checks liveness, not identity.
    static const Poco::Net::Context::Ptr self_check_tls(new Poco::Net::Context(
        Poco::Net::Context::TLS_CLIENT_USE, "", Poco::Net::Context::VERIFY_NONE));
    std::unique_ptr<Poco::Net::HTTPClientSession> owned =
        secure ? std::make_unique<Poco::Net::HTTPSClientSession>(target, port, self_check_tls)
               : std::make_unique<Poco::Net::HTTPClientSession>(target, port);
    Poco::Net::HTTPClientSession& session = *owned;
    session.setTimeout(Poco::Timespan(2, 0));
    Poco::Net::HTTPRequest request(Poco::Net::HTTPRequest::HTTP_GET, "/health",
                                   Poco::Net::HTTPMessage::HTTP_1_1);
    session.sendRequest(request);
    Poco::Net::HTTPResponse response;
    session.receiveResponse(response).ignore(1 << 16);
    return response.getStatus() >= 200;
  } catch (const std::exception& error) {
    log::warning("watchdog self-check failed: ", error.what());
    return false;
  }
}

// Loads the configuration and the API key file it names.
tl::expected<Invocation, LoadError> load_all(int argc, const char* const* argv) {
  auto invocation = load(argc, argv);
  if (!invocation) return invocation;
  Config& config = invocation->config;
  if (!config.api_key_file.empty()) {
    auto keys = read_key_file(config.api_key_file);
    if (!keys) return tl::unexpected(LoadError{{"server.api_key_file", keys.error()}, false});
    config.api_keys.insert(config.api_keys.end(), keys->begin(), keys->end());
  }
  return invocation;
}

void apply_log_level(const Config& config) {
  log::Level level = log::Level::kInfo;
  log::parse_level(config.log_level, level);
  log::set_level(level);
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
    log::error("reload failed, keeping the running configuration: ", fresh.error().error.line());
    return fresh.error().error.line();
  }
  const Config& next = fresh->config;
  const bool restart_needed =
      next.host != running.host || next.port != running.port || next.dev_mode != running.dev_mode ||
      next.threads != running.threads || next.insecure_dev_mode != running.insecure_dev_mode ||
      next.handshake_address != running.handshake_address || next.mode != running.mode ||
      next.data_parallel_size != running.data_parallel_size || next.command != running.command;
  if (restart_needed) {
    log::warning(
        "reload: listener, dev-mode or engine settings changed; they apply at the next "
        "restart");
  }
  // Said before the new level applies, so the line survives a move to a quieter level.
  log::notice("configuration reloaded: log level ", next.log_level, ", ", next.api_keys.size(),
              " API key(s), ", next.allowlist.size(), " allowlist block(s), body limit ",
              next.max_body_bytes, " bytes");
  context.set_policy(policy_of(next));
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
                             const util::Executor& executor) {
  const http::ServerStats stats = server.stats();
  const ConnectionGauges connections{stats.connections, stats.handling,
                                     static_cast<int>(executor.queued()), stats.refused,
                                     stats.total};
  api::Response response;
  response.content_type = "text/plain; version=0.0.4; charset=utf-8";
  response.body =
      metrics.render(engines.client().engines(), engines.client().pending_calls(), connections);
  return response;
}

}  // namespace

int run(int argc, const char* const* argv) {
  const sigset_t signals = block_signals();
  log::set_component("vllmd");

  auto invocation = load_all(argc, argv);
  if (!invocation) {
    std::fprintf(stderr, "vllmd: %s\n", invocation.error().error.line().c_str());
    return invocation.error().usage ? kExitUsage : kExitConfig;
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
  apply_log_level(config);

  log::info("vllmd ", kVersion, " starting: engine mode ", mode_name(config.mode),
            config.config_file.empty() ? "" : ", config " + config.config_file);
  if (config.dev_mode) {
    log::warning("dev mode is on: the weight-sync routes can overwrite the model's weights");
  }
  if (config.dev_mode && !util::is_loopback_host(config.host) && config.api_keys.empty() &&
      config.allowlist.empty()) {
    log::warning("insecure dev mode: listening on non-loopback address ", config.host,
                 " with neither API keys nor an allowlist; anyone who can reach it can "
                 "overwrite the weights (server.insecure_dev_mode)");
  }

  // The port first: a second vllmd on a port in use stops here, before it starts engines.
  ServerContext context;
  std::unique_ptr<HttpServer> server;
  try {
    server = std::make_unique<HttpServer>(config, context);
  } catch (const Poco::Exception& error) {
    log::error("server.tls_cert_file/server.tls_key_file: cannot use them: ", error.displayText());
    return kExitConfig;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "vllmd: %s\n", error.what());
    return kExitUnavailable;
  }

  auto engines = Engines::start(config);
  if (!engines) {
    log::error("cannot start the engine link: ", engines.error());
    return kExitUnavailable;
  }
  // Validation of large bodies and reloads; nothing here waits for engines or clients.
  util::Executor executor(config.threads, "vllmd-exec");
  api::ServiceOptions service_options;
  service_options.lifecycle_timeout =
      std::chrono::milliseconds(static_cast<long long>(config.call_timeout * 1000));
  service_options.query_timeout =
      std::chrono::milliseconds(static_cast<long long>(config.query_timeout * 1000));
  service_options.world_size_fallback = config.world_size;
  service_options.session_idle_timeout =
      std::chrono::milliseconds(static_cast<long long>(config.session_idle_timeout * 1000));
  api::WeightSyncService service((*engines)->client(), service_options, &executor);
  // The engines go before the service (below): they never call it after it is gone.
  (*engines)->client().set_state_listener(
      [&service](const engine::EngineStatus& engine) { service.on_engine_state(engine); });

  Metrics metrics;
  service.set_operation_observer([&metrics](std::string_view operation, double seconds) {
    metrics.observe_operation(operation, seconds);
  });
  context.service = &service;
  context.metrics = &metrics;
  context.executor = &executor;
  context.max_queued = config.max_queued;
  context.dev_mode = config.dev_mode;
  context.set_policy(policy_of(config));
  server->start();
  log::notice("listening on ", server->secure() ? "https://" : "http://", config.host, ":",
              server->port());
  if (!config.port_file.empty()) {
    std::ofstream(config.port_file) << server->port() << "\n";
  }
  // The watchdog is fed while a request over the socket is answered (whatever its status:
  // API keys and allowlists do not matter) and the executor runs tasks.
  Notifier notifier((*engines)->client(), [&executor, host = config.host, port = server->port(),
                                           secure = server->secure()] {
    return probe_server(host, port, secure) && executor.responsive(std::chrono::seconds(2));
  });
  notifier.start();

  // SIGHUP and POST /reload (vllmctl reload, for ExecReload=) take the same path, one at a time.
  std::mutex reload_mutex;
  const auto reload_all = [&]() -> std::optional<std::string> {
    std::lock_guard lock(reload_mutex);
    notifier.reloading();
    auto error = reload(argc, argv, config, context);
    notifier.reloaded();
    return error;
  };
  service.set_daemon_hooks(
      {.metrics = [&] { return render_metrics(metrics, **engines, *server, executor); },
       .reload = reload_all});

  for (;;) {
    int number = 0;
    if (sigwait(&signals, &number) != 0) continue;
    if (number == SIGHUP) {
      reload_all();
      continue;
    }
    log::notice("signal ", number, ": shutting down");
    break;
  }
  notifier.stopping();
  // Drain: no new connections; calls in flight may finish until the deadline, then the engine
  // link closes so they fail with 503 rather than being cut off without an answer.
  server->stop_accepting();
  if (!server->wait_idle(config.drain_timeout)) {
    log::warning("requests still in flight after ", config.drain_timeout,
                 " s; failing them with 503");
    (*engines)->client().close();
    server->wait_idle(2);
  }
  server->abort();
  executor.stop();
  server.reset();
  engines->reset();
  log::notice("stopped");
  return 0;
}

}  // namespace vllmd::daemon
