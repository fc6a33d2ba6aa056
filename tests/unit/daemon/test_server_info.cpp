// GET /server_info's body (daemon/server_info.cpp): secret-like environment names are left
// out, the configuration is TOML text or a JSON object with secrets redacted, and each
// engine's registration is shown.

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "daemon/server_info.hpp"

using vllmd::daemon::Config;
using vllmd::daemon::secret_like;
using vllmd::daemon::server_info;

TEST_CASE("names that look secret, in any case") {
  for (const char* name : {"VLLM_API_KEY", "VLLM_AUTH_TOKEN", "VLLM_SECRET", "VLLM_PASSWORD",
                           "VLLM_CREDENTIAL_FILE", "vllm_token", "VLLM_Keyring"}) {
    CAPTURE(name);
    CHECK(secret_like(name));
  }
  CHECK_FALSE(secret_like("VLLM_SERVER_DEV_MODE"));
  CHECK_FALSE(secret_like("VLLM_LOGGING_LEVEL"));
}

TEST_CASE("the body: configuration, environment and engines") {
  ::setenv("VLLM_TEST_SETTING", "on", 1);      // NOLINT(concurrency-mt-unsafe): one thread
  ::setenv("VLLM_TEST_API_KEY", "hidden", 1);  // NOLINT(concurrency-mt-unsafe)
  Config config;
  config.api_keys = {"sk-1", "sk-2"};
  vllmd::engine::EngineStatus engine;
  engine.state = vllmd::engine::EngineState::kReady;
  engine.incarnation = 2;
  engine.registration.empty = false;
  engine.registration.world_size = 4;
  engine.registration.vllm_version = "0.31.0";

  const std::string text = server_info(config, {engine}, false);
  CHECK(text.find(R"("vllm_config":"[server]\n)") != std::string::npos);
  CHECK(text.find("sk-1") == std::string::npos);
  CHECK(text.find(R"("VLLM_TEST_SETTING":"on")") != std::string::npos);
  CHECK(text.find("VLLM_TEST_API_KEY") == std::string::npos);
  CHECK(text.find(R"("engines":[{"rank":0,"state":"ready","incarnation":2,)"
                  R"("registration":{"world_size":4,"vllm_version":"0.31.0"}}])") !=
        std::string::npos);

  const std::string json = server_info(config, {}, true);
  CHECK(json.find(R"("vllm_config":{"server":{"host":"127.0.0.1","port":8000,)") !=
        std::string::npos);
  CHECK(json.find(R"("api_keys":["<redacted>","<redacted>"])") != std::string::npos);
  CHECK(json.find(R"("engines":[])") != std::string::npos);
  ::unsetenv("VLLM_TEST_SETTING");  // NOLINT(concurrency-mt-unsafe)
  ::unsetenv("VLLM_TEST_API_KEY");  // NOLINT(concurrency-mt-unsafe)
}
