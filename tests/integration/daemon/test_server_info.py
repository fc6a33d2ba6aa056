"""What vllmd says about itself to RL clients: GET /v1/models (not a dev route: TRL's client
lists the models when it is created) in the OpenAI list shape with the configured served
model name, and GET /server_info (dev mode) with the effective configuration as TOML text or
JSON, the VLLM* environment and the engines' registrations, and no secret anywhere."""

import json
import unittest

import harness


class ModelsTest(harness.DaemonTestCase):

    def test_v1_models_lists_the_served_model_without_dev_mode(self):
        daemon = self.start_daemon(["--served-model-name", "Qwen/Qwen3-8B"])
        harness.wait_until(lambda: daemon.health_status() == 200, 20, message="healthy")
        response = daemon.get("/v1/models")
        self.assertEqual(response.status_code, 200, response.text)
        body = response.json()
        self.assertEqual(body["object"], "list")
        self.assertEqual(len(body["data"]), 1)
        model = body["data"][0]
        self.assertEqual(model["id"], "Qwen/Qwen3-8B")
        self.assertEqual(model["root"], "Qwen/Qwen3-8B")
        self.assertEqual(model["object"], "model")
        self.assertEqual(model["owned_by"], "vllm")
        self.assertIsInstance(model["created"], int)
        self.assertEqual(model["max_model_len"], 4096)  # the embedded engine's registration

    def test_v1_models_reports_the_smallest_max_model_len_any_engine_registered(self):
        # TRL reads it as the token budget of every rollout: it must fit every engine.
        daemon, _, _ = self.start_external(dp=2, engine_extra={
            0: ["--max-model-len", "2048"], 1: ["--max-model-len", "1024"]})
        response = daemon.get("/v1/models")
        self.assertEqual(response.status_code, 200, response.text)
        self.assertEqual(response.json()["data"][0]["max_model_len"], 1024)

    def test_v1_models_needs_the_api_key_when_one_is_set(self):
        daemon = self.start_daemon(["--api-key", "sk-test"])
        self.assert_error(daemon.get("/v1/models"), 401, "unauthorized",
                          type_="authentication_error")
        response = daemon.get("/v1/models", headers={"Authorization": "Bearer sk-test"})
        self.assertEqual(response.status_code, 200, response.text)
        self.assertEqual(response.json()["data"][0]["id"], "default")


class ServerInfoTest(harness.DaemonTestCase):

    def start(self):
        env = harness.clean_env({"VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": "INFO",
                                 "VLLM_API_KEY": "sk-very-secret",
                                 "VLLM_HF_TOKEN_PATH": "/secret/token",
                                 "VLLM_my_auth_header": "also-secret"})
        daemon = self.start_daemon(["--served-model-name", "m"], env=env)
        harness.wait_until(lambda: daemon.health_status() == 200, 20, message="healthy")
        return daemon

    def get(self, daemon, path):
        headers = {"Authorization": "Bearer sk-very-secret"}
        response = daemon.get(path, headers=headers)
        self.assertEqual(response.status_code, 200, response.text)
        self.assertNotIn("very-secret", response.text)
        self.assertNotIn("also-secret", response.text)
        self.assertNotIn("/secret/token", response.text)
        return response.json()

    def test_text_config_environment_and_engines(self):
        daemon = self.start()
        body = self.get(daemon, "/server_info")
        self.assertEqual(set(body), {"vllm_config", "vllm_env", "system_env", "vllmd_version",
                                     "engines"})
        self.assertIn("[server]", body["vllm_config"])
        self.assertIn("api_keys = [ '<redacted>' ]", body["vllm_config"])
        self.assertIn("served_model_name = 'm'", body["vllm_config"])
        # The secret-like names are left out entirely, values and all.
        self.assertEqual(body["vllm_env"], {"VLLM_LOGGING_LEVEL": "INFO",
                                            "VLLM_SERVER_DEV_MODE": "1"})
        self.assertEqual(body["system_env"]["os"], "linux")
        self.assertEqual(body["system_env"]["family"], "unix")
        [engine] = body["engines"]
        self.assertEqual((engine["rank"], engine["state"], engine["incarnation"]),
                         (0, "ready", 1))
        self.assertEqual(engine["registration"]["world_size"], 1)

    def test_json_config_and_a_bad_format(self):
        daemon = self.start()
        body = self.get(daemon, "/server_info?config_format=json")
        config = body["vllm_config"]
        self.assertEqual(config["server"]["api_keys"], ["<redacted>"])
        self.assertEqual(config["server"]["dev_mode"], True)
        self.assertEqual(config["engine"]["served_model_name"], "m")
        self.assertEqual(config["engine"]["mode"], "embedded")
        json.dumps(config)  # a plain document
        response = daemon.get("/server_info?config_format=yaml",
                              headers={"Authorization": "Bearer sk-very-secret"})
        self.assert_error(response, 400, "invalid_request_error", param="query.config_format")


if __name__ == "__main__":
    unittest.main()
