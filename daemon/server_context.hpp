#pragma once
// What the request path shares with the rest of vllmd: the service, the executor, the
// metrics, and the settings a reload may change while requests run.

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/api/generation.hpp"
#include "common/api/service.hpp"
#include "common/util/cidr.hpp"
#include "common/util/executor.hpp"
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
  api::GenerationService* generation = nullptr;  // Handling::kGenerate routes
  Metrics* metrics = nullptr;
  util::Executor* executor = nullptr;  // large bodies are validated there, and reloads run
  int max_queued = 64;                 // executor tasks waiting: 503 beyond
  bool dev_mode = false;

  std::shared_ptr<const Policy> policy() const {
    std::lock_guard lock(policy_mutex_);
    return current_policy_;
  }
  void set_policy(Policy policy) {
    auto replacement = std::make_shared<const Policy>(std::move(policy));
    std::lock_guard lock(policy_mutex_);
    current_policy_ = std::move(replacement);
  }

 private:
  mutable std::mutex policy_mutex_;
  std::shared_ptr<const Policy> current_policy_ = std::make_shared<const Policy>();
};

}  // namespace vllmd::daemon
