"""Engine liveness through vllmd (docs/engine-protocol.md §8.3, §8.4 and §8.6): a READY after
engine.startup_timeout is still admitted, a cut input connection is restored by ZeroMQ's
reconnect without an engine restart, and the liveness probe reports a stopped engine (and never
runs while a call is in flight). The handshake port under a prober: test_handshake_prober.py."""

import os
import re
import signal
import subprocess
import time
import unittest

import harness

UPDATE = harness.update_info("a.weight")


def methods(calls):
    return [call["worker_method"] or call["method"] for call in calls]


def without_probes(names):
    return [name for name in names if name != "is_scheduler_paused"]


def input_port(daemon):
    """The port of vllmd's input ROUTER, from its start-up log line."""
    found = re.search(r"engine link: handshake \S+, input tcp://[0-9.]+:(\d+),", daemon.log())
    if not found:
        raise AssertionError(f"no input endpoint in the log:\n{daemon.log()}")
    return int(found.group(1))


def cut_connections_to(port):
    """Kills every TCP connection to 127.0.0.1:port (the engine's side; vllmd sees a reset)."""
    subprocess.run(["ss", "-K", "dst", harness.HOST, "dport", "=", f":{port}"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def health_message(daemon):
    response = daemon.get("/health", timeout=5)
    return response.status_code, (response.json()["error"]["message"]
                                  if response.status_code != 200 else "")


class StartupTimeoutTest(harness.DaemonTestCase):

    def test_a_loading_engine_reads_as_loading_with_no_deadline_by_default(self):
        handshake = f"tcp://{harness.HOST}:{harness.free_port()}"
        daemon = self.launch_daemon(
            ["--dev-mode", "--engine", "external", "--handshake-address", handshake])
        self.start_engine(handshake, extra=["--delay-ready", "2"])
        harness.wait_until(lambda: "is loading" in health_message(daemon)[1], 5,
                           message="GET /health naming the loading engine")
        status, message = health_message(daemon)
        self.assertEqual(status, 503)
        self.assertIn("engine rank 0 is loading", message)
        daemon.wait_healthy(timeout=10)

    def test_a_ready_after_the_startup_timeout_is_still_admitted(self):
        handshake = f"tcp://{harness.HOST}:{harness.free_port()}"
        daemon = self.launch_daemon(
            ["--dev-mode", "--engine", "external", "--handshake-address", handshake,
             "--engine-startup-timeout", "2"])
        started = time.monotonic()
        engine = self.start_engine(handshake, extra=["--delay-ready", "5"])
        harness.wait_until(lambda: "no READY within 2 s" in health_message(daemon)[1], 5,
                           message="GET /health reporting the startup timeout")
        self.assertGreater(time.monotonic() - started, 1.5)
        self.assertEqual(health_message(daemon)[0], 503)
        # The model load ends after the timeout: the engine is admitted all the same.
        daemon.wait_healthy(timeout=10)
        self.assertGreater(time.monotonic() - started, 4.5)
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        self.assertEqual(methods(engine.calls()), ["start_weight_update"])
        self.assertNotIn("rejected", daemon.log())


class ConnectionCutTest(harness.DaemonTestCase):

    def test_a_cut_input_connection_is_restored_without_an_engine_restart(self):
        daemon, (engine,), _ = self.start_external()
        port = input_port(daemon)
        # Stopped, the engine cannot reconnect yet: the disconnected state lasts until SIGCONT.
        engine.freeze()
        cut_connections_to(port)
        daemon.wait_unhealthy(timeout=5)
        status, message = health_message(daemon)
        self.assertEqual(status, 503)
        self.assertIn("engine rank 0 is disconnected", message)

        started = time.monotonic()
        response = daemon.post("/start_weight_update")
        self.assertLess(time.monotonic() - started, 1)
        error = self.assert_error(response, 503, "engine_unavailable", type_="server_error",
                                  message_prefix="failed to call start_weight_update:")
        self.assertIn("engine rank 0 is disconnected", error["message"])

        engine.thaw()
        daemon.wait_healthy(timeout=5)
        self.assertEqual(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": harness.NCCL_INIT_INFO}).status_code, 200)
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        self.assert_json(daemon.post("/update_weights", json={"update_info": UPDATE}), 200,
                         {"message": "Weights updated"})
        self.assert_json(daemon.post("/finish_weight_update", json={"weight_version": "c1"}),
                         200, {"message": "Weight update finished"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "c1"})
        # One engine process, one handshake; the refused call never reached it.
        self.assertTrue(engine.alive())
        self.assertEqual(engine.log().count("ready; inputs"), 1)
        self.assertEqual(daemon.log().count("HELLO from engine rank 0"), 1)
        self.assertEqual(without_probes(methods(engine.calls())),
                         ["init_weight_transfer_engine", "start_weight_update", "update_weights",
                          "finish_weight_update", "set_weight_version"])

    def test_repeated_cuts_are_each_noticed_and_recovered_from(self):
        daemon, (engine,), _ = self.start_external()
        port = input_port(daemon)
        for cut in range(3):
            with self.subTest(cut=cut):
                before = daemon.log().count("engine rank 0 is disconnected")
                cut_connections_to(port)
                harness.wait_until(
                    lambda: daemon.log().count("engine rank 0 is disconnected") > before, 5,
                    message=f"cut {cut} noticed in the log")
                daemon.wait_healthy(timeout=5)
                self.assert_json(daemon.post("/update_weight_version",
                                             json={"new_version": f"v{cut}"}),
                                 200, {"success": True, "new_version": f"v{cut}"})
        self.assertTrue(engine.alive())
        self.assertEqual(daemon.log().count("HELLO from engine rank 0"), 1)


class LivenessProbeTest(harness.DaemonTestCase):

    def start_probed(self, engine_extra=None):
        config = self.write_config("[engine]\nprobe_interval = 0.5\nquery_timeout = 1\n")
        return self.start_external(daemon_args=["--config", config],
                                   engine_extra=engine_extra)

    def test_a_stopped_engine_is_reported_and_revived_when_it_answers(self):
        daemon, (engine,), _ = self.start_probed()
        engine.freeze()
        stopped = time.monotonic()
        daemon.wait_unhealthy(timeout=5)
        self.assertLess(time.monotonic() - stopped, 4)
        status, message = health_message(daemon)
        self.assertEqual(status, 503)
        self.assertIn("engine rank 0", message)
        self.assertIn("liveness probe timed out after 1 s", message)

        engine.thaw()
        daemon.wait_healthy(timeout=5)
        self.assert_json(daemon.post("/update_weight_version", json={"new_version": "p1"}),
                         200, {"success": True, "new_version": "p1"})

    def test_no_probe_is_sent_while_a_call_is_in_flight(self):
        daemon, (engine,), _ = self.start_probed(
            engine_extra={0: ["--inject-delay", "start_weight_update=3"]})
        # Idle: probed every half second, and the probes are not counted as pending calls.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            self.assertEqual(daemon.metric("vllmd_engine_calls_pending"), 0)
            time.sleep(0.05)
        self.assertIn("is_scheduler_paused", methods(engine.calls()))

        # A probe sent during the 3 s call would time out after 1 s and fail the call.
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        time.sleep(0.2)  # a probe sent during the call would be served right after it
        names = methods(engine.calls())
        self.assertEqual(names[-1], "start_weight_update", names)
        # Idle again: the probes resume.
        harness.wait_until(lambda: methods(engine.calls())[-1] == "is_scheduler_paused", 3,
                           message="a probe after the call")
        self.assertEqual(daemon.health_status(), 200)


if __name__ == "__main__":
    unittest.main()
