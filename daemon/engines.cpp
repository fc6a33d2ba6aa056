#include "daemon/engines.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/engine/endpoints.hpp"
#include "common/reference/model_loader.hpp"
#include "common/util/duration.hpp"
#include "common/util/errno_text.hpp"
#include "common/util/log.hpp"

namespace vllmd::daemon {

namespace {
void replace_all(std::string& text, std::string_view from, std::string_view to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}
// The embedded engine's model: --model's directory under --load-format. "auto" with no
// weights in the directory (one kept for its metadata) leaves the token formula, and says so.
tl::expected<void, std::string> load_embedded_model(const Config& config,
                                                    reference::ReferenceEngineOptions& embedded) {
  if (config.model.empty()) return {};
  reference::LoadFormat format = reference::LoadFormat::kAuto;
  reference::parse_load_format(config.load_format, format);
  if (format == reference::LoadFormat::kAuto && !reference::has_safetensors(config.model)) {
    util::log::warning("embedded engine: ", config.model,
                       " has no safetensors weights; tokens follow the reference formula "
                       "(engine.load_format = dummy runs the model on random weights)");
    return {};
  }
  auto model = reference::load_model(config.model, format);
  if (!model) return tl::unexpected("embedded engine: cannot load the model: " + model.error());
  const reference::LlamaConfig& llama = (*model)->config();
  embedded.vocab_size = llama.vocab_size;
  embedded.max_model_len = llama.max_position_embeddings;
  embedded.model = std::move(*model);
  embedded.model_source = {config.model, format};
  util::log::info("embedded engine: Llama from ", config.model, " (", llama.num_hidden_layers,
                  " layers, hidden size ", llama.hidden_size, ", vocabulary ", llama.vocab_size,
                  "), weights ", format == reference::LoadFormat::kDummy ? "dummy" : "safetensors");
  return {};
}

}  // namespace

std::vector<std::string> fill_command(const std::vector<std::string>& command,
                                      const std::string& handshake_endpoint) {
  const auto endpoint = engine::parse_endpoint(handshake_endpoint);
  std::vector<std::string> argv = command;
  for (std::string& arg : argv) {
    replace_all(arg, "{handshake_address}", handshake_endpoint);
    if (endpoint) {
      replace_all(arg, "{handshake_host}", endpoint->host);
      replace_all(arg, "{handshake_port}", endpoint->port);
    }
  }
  return argv;
}

tl::expected<std::unique_ptr<Engines>, std::string> Engines::start(const Config& config) {
  std::unique_ptr<Engines> engines(new Engines);
  engine::ClientOptions options;
  options.handshake_address = config.handshake_address;
  options.advertised_host = config.advertised_host;
  options.data_parallel_size = config.data_parallel_size;
  options.startup_timeout = util::milliseconds_of(config.startup_timeout);
  if (const auto master = parse_data_parallel_master(config.data_parallel_master)) {
    // vLLM's port list: five ports, the last popped as the master; here the operator's port
    // and the four after it, so a firewall needs PORT to PORT+4 open on the master's host.
    std::vector<std::int64_t> ports;
    for (int i = 1; i <= 4; ++i) ports.push_back(master->port + i);
    ports.push_back(master->port);
    options.data_parallel_master =
        wire::split_master_ports(master->host, std::move(ports), config.data_parallel_size);
    util::log::info("coordinated data parallelism: DP master ", master->host, ":", master->port,
                    " (ports ", master->port, "-", master->port + 4, ")");
  }
  options.probe_interval = util::milliseconds_of(config.probe_interval);
  options.session_imbalance = config.session_imbalance;
  options.probe_timeout = util::milliseconds_of(config.query_timeout);
  auto client = engine::EngineClient::create(options);
  if (!client) return tl::unexpected(client.error());
  engines->client_ = std::move(*client);

  if (config.mode == EngineMode::kEmbedded) {
    reference::ReferenceEngineOptions embedded;
    embedded.handshake_address = engines->client_->handshake_endpoint();
    embedded.tensor_parallel_size = config.tensor_parallel_size;
    reference::parse_backend(config.backend, embedded.backend);
    if (auto loaded = load_embedded_model(config, embedded); !loaded) {
      return tl::unexpected(loaded.error());
    }
    if (!embedded.model) {
      util::log::warning(
          "embedded mode: serving the in-process reference engine; no model is loaded and "
          "no weights go anywhere");
    }
    engines->embedded_ = std::make_unique<reference::ReferenceEngine>(std::move(embedded));
    engines->embedded_->start();
  } else if (config.mode == EngineMode::kManaged) {
    if (auto spawned = engines->spawn_managed(config); !spawned) {
      return tl::unexpected(spawned.error());
    }
  } else {
    util::log::info(
        "external mode: start engines with `vllm serve MODEL --headless "
        "--data-parallel-address HOST --data-parallel-rpc-port PORT` at ",
        engines->client_->handshake_endpoint());
  }
  return engines;
}

tl::expected<void, std::string> Engines::spawn_managed(const Config& config) {
  std::vector<std::string> argv = fill_command(config.command, client_->handshake_endpoint());
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (std::string& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);
  const int error = posix_spawnp(&managed_pid_, args[0], nullptr, nullptr, args.data(), environ);
  if (error != 0) {
    managed_pid_ = -1;
    return tl::unexpected("cannot start the engine command '" + argv[0] +
                          "': " + util::errno_text(error));
  }
  util::log::info("managed mode: started engine process ", managed_pid_, ": ", argv[0]);
  supervisor_ = std::thread([this, pid = managed_pid_] {
    int status = 0;
    const pid_t reaped = ::waitpid(pid, &status, 0);
    managed_exited_.store(true);
    if (reaped != pid) return;
    if (stopping_.load()) return;
    std::string how;
    if (WIFEXITED(status)) {
      how = "exited with status " + std::to_string(WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
      how = "was killed by signal " + std::to_string(WTERMSIG(status));
    }
    if (how.empty()) return;
    util::log::error("managed engine process ", pid, " ", how,
                     "; weight-sync routes answer 503 until an engine attaches again");
    // Its connections may linger a moment, or the process had loaded no engine yet: dead now.
    for (int rank = 0; rank < client_->data_parallel_size(); ++rank) {
      client_->mark_dead(rank, "managed engine process " + how);
    }
  });
  return {};
}

Engines::~Engines() {
  stopping_.store(true);
  // The link closes first: engines we stop ourselves are not reported as dropped or dead.
  client_->close();
  if (managed_pid_ > 0) {
    // SIGTERM lets the engine shut down cleanly; one that ignores it is killed after 10 s.
    ::kill(managed_pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!managed_exited_.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!managed_exited_.load()) ::kill(managed_pid_, SIGKILL);
  }
  if (supervisor_.joinable()) supervisor_.join();
  if (embedded_) embedded_->stop();
  client_.reset();
}

}  // namespace vllmd::daemon
