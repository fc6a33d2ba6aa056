"""Managed mode: vllmd starts the engine command itself, with the handshake address filled
in, supervises it, and reports its exit (503 and a log line) while it keeps serving."""

import os
import unittest

import harness


class ManagedModeTest(harness.DaemonTestCase):
    def start_managed(self, engine_flags=""):
        record = os.path.join(self.workdir, "managed.record.jsonl")
        command = (f"{harness.engine_bin()} --handshake {{handshake_address}} --rank 0 "
                   f"--record {record} {engine_flags}")
        daemon = self.start_daemon(["--dev-mode", "--engine", "managed",
                                    "--engine-command", command])
        daemon.wait_healthy()
        return daemon, record

    def test_the_spawned_engine_serves_the_lifecycle(self):
        daemon, record = self.start_managed()
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        self.assert_json(daemon.post("/finish_weight_update", json={"weight_version": "m-1"}),
                         200, {"message": "Weight update finished"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "m-1"})
        methods = [call["worker_method"] or call["method"] for call in harness.read_record(record)]
        self.assertEqual(methods[:3], ["start_weight_update", "finish_weight_update",
                                       "set_weight_version"])

    def test_engine_exit_gives_503_and_a_log_line_and_vllmd_keeps_serving(self):
        daemon, _ = self.start_managed("--inject-exit start_weight_update")
        response = daemon.post("/start_weight_update")
        self.assert_error(response, 503, "engine_unavailable",
                          message_prefix="failed to call start_weight_update:")
        daemon.wait_unhealthy()
        self.assert_error(daemon.post("/finish_weight_update"), 503, "engine_unavailable",
                          message_prefix="failed to call finish_weight_update:")
        self.assertEqual(daemon.get("/version").status_code, 200)
        harness.wait_until(lambda: "managed engine process" in daemon.log(), 10,
                           message="a log line about the engine's exit")
        self.assertRegex(daemon.log(), r"managed engine process \d+ exited with status 1")

    def test_a_command_that_cannot_start_is_refused_at_start(self):
        process = harness.Daemon(self.workdir, ["--dev-mode", "--engine", "managed",
                                                "--engine-command", "/nonexistent/engine"])
        self._track(process)
        self.assertEqual(process.popen.wait(timeout=20), 69)
        self.assertIn("cannot start the engine command", process.log())


if __name__ == "__main__":
    unittest.main()
