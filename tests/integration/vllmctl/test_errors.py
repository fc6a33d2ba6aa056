"""Every failure exit code, provoked for real: 65 (local check and the daemon's 413), 66, 69
(503: no engine), 70 (engine failure), 75 (client timeout) and 77 (401)."""

import json
import os
import time

from ctl_harness import CtlTestCase
from harness import NCCL_INIT_INFO, call_names, free_port, update_info


class InputErrorTest(CtlTestCase):
    def setUp(self):
        super().setUp()
        self.daemon = self.start_daemon()

    def test_missing_or_unreadable_file_exits_66(self):
        for args in (["weights", "init", "--info", "missing.json"],
                     ["weights", "update", "--info", self.workdir],
                     ["weights", "sync", "--init", "missing.json", "--update", "missing.json"]):
            with self.subTest(args=args):
                self.assert_exit(self.ctl(*args), 66, ["cannot", args[-1]])

    def test_invalid_json_exits_65_with_the_byte_offset(self):
        self.write("bad.json", '{"names": ["a",, "b"]}')
        self.assert_exit(self.ctl("weights", "update", "--info", "bad.json"), 65,
                         ["bad.json", "invalid JSON", "at byte 15"])
        self.write("truncated.json", '{"master_address": "h"')
        self.assert_exit(self.ctl("weights", "init", "--info", "truncated.json"), 65,
                         ["truncated.json", "at byte 22"])
        self.write("two.json", '{"a": 1} {"b": 2}')
        self.assert_exit(self.ctl("weights", "init", "--info", "two.json"), 65, "at byte 9")
        self.assert_exit(self.ctl("weights", "init", "--info", "-", input=""), 65, "stdin")

    def test_wrong_shape_exits_65_naming_the_field(self):
        self.write("list.json", [NCCL_INIT_INFO])
        self.assert_exit(self.ctl("weights", "init", "--info", "list.json"), 65,
                         ["'init_info' must be a JSON object", "(param: init_info)"])
        for content in ("3", '"text"', "null", "[{}, 1]", "[[]]"):
            with self.subTest(content=content):
                self.write("shape.json", content)
                self.assert_exit(self.ctl("weights", "update", "--info", "shape.json"), 65,
                                 ["'update_info' must be a JSON object or a list",
                                  "(param: update_info)"])
        self.write("wrapped.json", {"update_info": update_info()})
        self.assert_exit(self.ctl("weights", "update", "--info", "wrapped.json"), 65,
                         "value itself")

    def test_every_file_is_checked_before_the_first_call(self):
        self.write("good.json", update_info())
        self.write("bad.json", "{")
        self.assert_ok(self.ctl("weights", "init", "--info", self.write("i.json", NCCL_INIT_INFO)))
        self.assert_ok(self.ctl("weights", "start"))
        result = self.assert_exit(
            self.ctl("weights", "update", "--info", "good.json", "--info", "bad.json"), 65)
        self.assertEqual(result.stdout, "")  # good.json was not sent either
        self.assert_exit(self.ctl("weights", "update", "--info", "-", "--info", "-", input="{}"),
                         64, "only once")


class ServerErrorTest(CtlTestCase):
    def test_payload_too_large_exits_65(self):
        self.start_daemon("--max-body-bytes", "256")
        self.write("big.json", update_info(*[f"layer.{i}" for i in range(50)]))
        self.assert_exit(self.ctl("weights", "update", "--info", "big.json"), 65,
                         ["weights update (big.json)", "exceeds"])

    def test_engine_failure_exits_70(self):
        daemon = self.start_daemon()
        # The engine's state machine refuses a finish without a start: HTTP 500.
        self.assert_exit(self.ctl("weights", "finish", "--version", "v1"), 70,
                         ["vllmctl: weights finish: failed to call finish_weight_update",
                          "without a matching start_weight_update"])
        self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "default"})
        self.write("names-only.json", {"names": ["a"]})
        self.assert_ok(self.ctl("weights", "start"))
        self.assert_exit(self.ctl("weights", "update", "--info", "names-only.json"), 70,
                         "failed to call update_weights")

    def test_injected_engine_failure_exits_70(self):
        self.start_external("--inject-fail", "start_weight_update")
        self.assert_exit(self.ctl("weights", "start"), 70, "injected failure")

    def test_no_engine_exits_69(self):
        # External mode with no engine attached: /health and the routes answer 503.
        self.start_daemon("--engine", "external", "--handshake-address",
                          f"tcp://127.0.0.1:{free_port()}")
        self.assert_exit(self.ctl("health"), 69, "vllmctl: health:")
        self.assert_exit(self.ctl("weights", "start"), 69)
        result = self.assert_exit(self.ctl("status"), 69)
        self.assertRegex(result.stdout, r"(?m)^health\s+unhealthy$")
        result = self.assert_exit(self.ctl("-o", "json", "status"), 69)
        status = json.loads(result.stdout)
        self.assertFalse(status["healthy"])
        self.assertIsNone(status["world_size"])
        self.assertIn("world_size", status["errors"])

    def test_client_timeout_exits_75(self):
        self.start_external("--inject-delay", "update_weights=5")
        self.write("update.json", update_info())
        self.assert_ok(self.ctl("weights", "init", "--info", self.write("i.json", NCCL_INIT_INFO)))
        self.assert_ok(self.ctl("weights", "start"))
        started = time.monotonic()
        self.assert_exit(self.ctl("--timeout", "1", "weights", "update", "--info", "update.json"),
                         75, ["weights update (update.json)", "no reply within 1 s"])
        self.assertLess(time.monotonic() - started, 4.5)


class AuthTest(CtlTestCase):
    def setUp(self):
        super().setUp()
        self.daemon = self.start_daemon("--api-key", "secret")
        self.token_file = self.write("token", "secret\n")

    def test_missing_or_wrong_token_exits_77(self):
        self.assert_exit(self.ctl("weights", "info"), 77, "missing or invalid API key")
        self.assert_exit(self.ctl("pause", env={"VLLMCTL_TOKEN": "wrong"}), 77)
        wrong = self.write("wrong-token", "wrong")
        self.assert_exit(self.ctl("--token-file", wrong, "weights", "info"), 77)
        self.assert_exit(self.ctl("weights", "info", env={"VLLMCTL_TOKEN_FILE": wrong}), 77)
        self.assertFalse(self.daemon.get("/is_paused",
                                         headers={"Authorization": "Bearer secret"})
                         .json()["is_paused"])

    def test_right_token_works(self):
        self.assert_ok(self.ctl("--token-file", self.token_file, "weights", "set-version", "a"))
        self.assertEqual(self.assert_ok(self.ctl("weights", "info",
                                                 env={"VLLMCTL_TOKEN": "secret"})).stdout, "a\n")
        self.assert_ok(self.ctl("status", env={"VLLMCTL_TOKEN_FILE": self.token_file}))
        # The flag wins over the environment.
        self.assert_ok(self.ctl("--token-file", self.token_file, "weights", "info",
                                env={"VLLMCTL_TOKEN": "wrong"}))

    def test_health_needs_no_token(self):
        self.assert_ok(self.ctl("health"))


class RecordTest(CtlTestCase):
    """What reaches the engine for the lifecycle commands."""

    def test_commands_reach_the_engine_as_expected(self):
        _, engine = self.start_external()
        self.write("init.json", NCCL_INIT_INFO)
        self.write("update.json", [update_info("w")])
        for args in (["weights", "init", "--info", "init.json"], ["weights", "start"],
                     ["weights", "update", "--info", "update.json"],
                     ["weights", "finish", "--version", "s1"], ["pause", "--mode", "keep",
                                                                "--keep-cache"],
                     ["resume"]):
            self.assert_ok(self.ctl(*args))
        calls = [call for call in engine.calls()
                 if call["method"] not in ("get_weight_version", "is_scheduler_paused")]
        self.assertEqual(call_names(calls),
                         ["init_weight_transfer_engine", "start_weight_update", "update_weights",
                          "finish_weight_update", "set_weight_version", "pause_scheduler",
                          "resume_scheduler"])
        self.assertEqual(calls[0]["args"][3], {"init_info": NCCL_INIT_INFO})
        self.assertEqual(calls[2]["args"][3], {"update_info": [update_info("w")]})
        self.assertEqual(calls[4]["args"], ["s1"])
        self.assertEqual(calls[5]["args"], ["keep", False])
        self.assertTrue(os.path.exists(engine.record_path))
