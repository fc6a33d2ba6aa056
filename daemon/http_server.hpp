#pragma once
// The HTTP front of vllmd: the router decides every request from its head (allowlist,
// route, method, dev mode, API key, body limit) and hands accepted ones to the
// WeightSyncService; http::Server carries the connections.

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/api/service.hpp"
#include "common/util/cidr.hpp"
#include "common/util/executor.hpp"
#include "daemon/config.hpp"
#include "daemon/http/server.hpp"
#include "daemon/metrics.hpp"

namespace vllmd::daemon {

// Settings a reload may change while requests run: replaced as a whole, read as a snapshot.
struct Policy {
  std::int64_t max_body_bytes = 128LL << 20;
  std::vector<std::string> api_keys;  // empty: no authentication
  std::vector<util::Cidr> allowlist;  // peers allowed on every route but /health; empty: all
};

struct ServerContext {
  api::WeightSyncService* service = nullptr;
  engine::EngineClient* engines = nullptr;
  Metrics* metrics = nullptr;
  util::Executor* executor = nullptr;  // large bodies are validated there, and reloads run
  int max_queued = 64;                 // executor tasks waiting: 503 beyond
  // Reloads the configuration; the error line when the new one is invalid (nothing changed).
  std::function<std::optional<std::string>()> reload;
  bool dev_mode = false;

  std::shared_ptr<const Policy> policy() const {
    std::lock_guard lock(policy_mutex);
    return current_policy;
  }
  void set_policy(Policy policy) {
    auto replacement = std::make_shared<const Policy>(std::move(policy));
    std::lock_guard lock(policy_mutex);
    current_policy = std::move(replacement);
  }

 private:
  mutable std::mutex policy_mutex;
  std::shared_ptr<const Policy> current_policy = std::make_shared<const Policy>();
};

class Router;

class HttpServer {
 public:
  // Binds the listening socket (throws naming the address when it cannot); serves from
  // start(), when `context` is complete.
  HttpServer(const Config& config, ServerContext& context);
  ~HttpServer();
  void start();
  std::uint16_t port() const;
  bool secure() const;
  // Stops accepting; requests in flight go on, keep-alive connections end after theirs.
  void stop_accepting();
  // Waits up to `seconds` for every connection to finish; whether they all did.
  bool wait_idle(double seconds) const;
  void abort();  // closes whatever is left

 private:
  std::unique_ptr<Router> router_;
  std::unique_ptr<http::Server> server_;
};

}  // namespace vllmd::daemon
