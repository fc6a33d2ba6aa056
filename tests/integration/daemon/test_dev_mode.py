"""Dev-mode gating (docs/http-api.md §1.1): without dev mode every weight-sync route answers
404 exactly like an unknown path and never reaches the engine; /health and /version always
answer. VLLM_SERVER_DEV_MODE turns it on when set to a non-zero integer, as vLLM reads it."""

import unittest

import harness

# Every route of common/api/table.hpp except /health, /version and /metrics, with its method
# and a body that would be valid in dev mode.
DEV_ROUTES = [
    ("POST", "/init_weight_transfer_engine", {"init_info": harness.NCCL_INIT_INFO}),
    ("POST", "/start_weight_update", None),
    ("POST", "/start_draft_weight_update", None),
    ("POST", "/update_weights", {"update_info": harness.update_info()}),
    ("POST", "/finish_weight_update", {"weight_version": "step-1"}),
    ("POST", "/update_weight_version", {"new_version": "step-1"}),
    ("GET", "/weight_info", None),
    ("GET", "/get_world_size", None),
    ("POST", "/pause", None),
    ("POST", "/resume", None),
    ("GET", "/is_paused", None),
    ("POST", "/reset_prefix_cache", None),
    ("POST", "/reset_mm_cache", None),
    ("POST", "/reset_encoder_cache", None),
    ("POST", "/sleep", None),
    ("POST", "/wake_up", None),
    ("GET", "/is_sleeping", None),
    ("POST", "/release_kv_cache_memory", None),
    ("GET", "/server_info", None),
    ("POST", "/collective_rpc", {"method": "echo_args_kwargs"}),
    ("POST", "/weight_checker", {"action": "checksum"}),
]


def request(daemon, method, path, body=None):
    if method == "POST":
        return daemon.post(path, json=body) if body is not None else daemon.post(path)
    return daemon.get(path)


def dev_mode_warned(log):
    return any("warning" in line.lower() and "dev mode" in line.lower()
               for line in log.splitlines())


class DevModeTest(harness.DaemonTestCase):

    def test_without_dev_mode_every_dev_route_is_404_and_never_reaches_the_engine(self):
        handshake = f"tcp://{harness.HOST}:{harness.free_port()}"
        daemon = self.start_daemon(["--engine", "external", "--handshake-address", handshake,
                                    "--data-parallel-size", "1"])
        engine = self.start_engine(handshake, rank=0)
        daemon.wait_healthy()

        unknown = daemon.get("/no_such_route")
        self.assert_error(unknown, 404, "not_found")
        for method, path, body in DEV_ROUTES:
            with self.subTest(method=method, path=path):
                response = request(daemon, method, path, body)
                self.assert_error(response, 404, "not_found")
                self.assertEqual(response.json(), unknown.json(), "404 unlike an unknown path")
                # The wrong method too: the route does not exist at all, so no 405.
                other = "GET" if method == "POST" else "POST"
                self.assert_error(request(daemon, other, path), 404, "not_found")
                self.assert_error(request(daemon, method, path + "?include_dp=false&mode=wait"),
                                  404, "not_found")
        self.assertEqual(engine.calls(), [], "a dev route reached the engine with dev mode off")

        self.assertEqual(daemon.get("/health").status_code, 200)
        version = daemon.get("/version")
        self.assertEqual(version.status_code, 200, version.text)
        self.assertIn("version", version.json())
        self.assertFalse(dev_mode_warned(daemon.log()), daemon.log())

    def test_metrics_is_served_with_and_without_dev_mode(self):
        for index, args in enumerate(([], ["--dev-mode"])):
            with self.subTest(args=args):
                daemon = self.start_daemon(args, name=f"vllmd{index}")
                daemon.wait_healthy()
                response = daemon.get("/metrics")
                self.assertEqual(response.status_code, 200, response.text)
                self.assertTrue(response.headers.get("Content-Type", "").startswith("text/plain"),
                                response.headers)
                self.assertIn("# TYPE ", response.text)

    def test_dev_mode_flag_serves_the_routes_and_warns(self):
        daemon = self.start_daemon(["--dev-mode"])
        daemon.wait_healthy()
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "default"})
        self.assertTrue(dev_mode_warned(daemon.log()), daemon.log())

    def test_env_variable_turns_dev_mode_on_when_non_zero(self):
        cases = [("1", True), ("0", False), ("2", True), ("00", False)]
        for index, (value, on) in enumerate(cases):
            with self.subTest(VLLM_SERVER_DEV_MODE=value):
                daemon = self.start_daemon([], env=harness.clean_env(
                    {"VLLM_SERVER_DEV_MODE": value}), name=f"vllmd{index}")
                daemon.wait_healthy()
                if on:
                    self.assert_json(daemon.get("/weight_info"), 200,
                                     {"weight_version": "default"})
                    self.assert_json(daemon.get("/get_world_size"), 200, {"world_size": 1})
                else:
                    self.assert_error(daemon.get("/weight_info"), 404, "not_found")
                    self.assert_error(daemon.post("/start_weight_update"), 404, "not_found")
                self.assertEqual(daemon.get("/health").status_code, 200)
                self.assertEqual(dev_mode_warned(daemon.log()), on, daemon.log())
                daemon.stop()

    def test_flag_wins_over_env_zero(self):
        daemon = self.start_daemon(["--dev-mode"],
                                   env=harness.clean_env({"VLLM_SERVER_DEV_MODE": "0"}))
        daemon.wait_healthy()
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "default"})


if __name__ == "__main__":
    unittest.main()
