#pragma once
// The HTTP front of vllmd: every request goes through the API table to the WeightSyncService;
// HttpListener carries the connections.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <vector>

#include "common/api/service.hpp"
#include "common/util/cidr.hpp"
#include "daemon/config.hpp"
#include "daemon/http_listener.hpp"
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
  const HttpListener* listener = nullptr;  // for the connection gauges
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

class HttpServer {
 public:
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
  std::unique_ptr<HttpListener> listener_;
};

}  // namespace vllmd::daemon
