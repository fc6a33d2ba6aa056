"""Type=notify: vllmd talks to a NOTIFY_SOCKET this test owns. READY=1 only once the port
answers and every engine is attached, STATUS= while waiting, WATCHDOG=1 when WATCHDOG_USEC is
set, STOPPING=1 on SIGTERM, and a request in flight at SIGTERM still completes (exit 0). A
clean stop says "stopped" and nothing alarming: the engines vllmd stops itself going away
is not news for the operator's logs."""

import os
import re
import signal
import threading
import time
import unittest

import harness


def start_blocked_call(daemon):
    """POST /start_weight_update on a thread; returns once the call is blocked in the engine
    (which delays it). The result dict gets the status and JSON body when it completes."""
    result = {}

    def call():
        response = daemon.post("/start_weight_update")
        result["status"] = response.status_code
        result["body"] = response.json()

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.5)
    return caller, result


class SystemdNotifyTest(harness.DaemonTestCase):
    def notify_socket(self):
        notify = harness.NotifySocket(os.path.join(self.workdir, "notify.sock"))
        self.addCleanup(notify.close)
        return notify

    def test_ready_only_when_the_port_answers_and_engines_are_attached(self):
        notify = self.notify_socket()
        handshake = f"tcp://{harness.HOST}:{harness.free_port()}"
        daemon = self.start_daemon(
            ["--dev-mode", "--engine", "external", "--handshake-address", handshake],
            env=harness.clean_env({"NOTIFY_SOCKET": notify.path}))
        # Listening, but no engine yet: a STATUS line says so, and no READY=1.
        _, status = notify.first("STATUS")
        self.assertIn("waiting for rank 0", status["STATUS"])
        time.sleep(0.5)
        self.assertEqual(notify.values("READY"), [])

        self.start_engine(handshake)
        ready_at, _ = notify.first("READY")
        self.assertEqual(daemon.get("/health").status_code, 200)
        self.assertIn("1/1 engine(s) attached", notify.values("STATUS")[-1])
        # READY=1 is sent once.
        time.sleep(0.6)
        self.assertEqual(notify.values("READY"), ["1"])
        self.assertGreater(ready_at, 0)

    def test_watchdog_is_fed_while_the_server_answers(self):
        notify = self.notify_socket()
        self.start_daemon(["--dev-mode"], env=harness.clean_env({"NOTIFY_SOCKET": notify.path,
                                               "WATCHDOG_USEC": "400000"}))
        notify.first("READY")
        harness.wait_until(lambda: len(notify.values("WATCHDOG")) >= 3, 10,
                           message="three WATCHDOG=1 messages")

    def test_no_watchdog_messages_without_watchdog_usec(self):
        notify = self.notify_socket()
        self.start_daemon(["--dev-mode"], env=harness.clean_env({"NOTIFY_SOCKET": notify.path}))
        notify.first("READY")
        time.sleep(0.8)
        self.assertEqual(notify.values("WATCHDOG"), [])

    def test_sigterm_sends_stopping_and_lets_the_request_in_flight_finish(self):
        notify = self.notify_socket()
        handshake = f"tcp://{harness.HOST}:{harness.free_port()}"
        daemon = self.start_daemon(
            ["--dev-mode", "--engine", "external", "--handshake-address", handshake],
            env=harness.clean_env({"NOTIFY_SOCKET": notify.path}))
        self.start_engine(handshake, extra=["--inject-delay", "start_weight_update=2"])
        notify.first("READY")

        caller, result = start_blocked_call(daemon)
        daemon.popen.send_signal(signal.SIGTERM)
        notify.first("STOPPING", timeout=5)
        caller.join(timeout=10)
        self.assertEqual(result.get("status"), 200, result)
        self.assertEqual(result["body"], {"message": "Weight update started"})
        self.assertEqual(daemon.popen.wait(timeout=15), 0)

    def test_requests_still_running_at_the_drain_deadline_fail_with_503(self):
        handshake = f"tcp://{harness.HOST}:{harness.free_port()}"
        daemon = self.start_daemon(
            ["--dev-mode", "--engine", "external", "--handshake-address", handshake],
            env=harness.clean_env({"VLLMD_DRAIN_TIMEOUT": "1"}))
        self.start_engine(handshake, extra=["--inject-delay", "start_weight_update=30"])
        daemon.wait_healthy()
        caller, result = start_blocked_call(daemon)
        stopped_at = time.monotonic()
        daemon.popen.send_signal(signal.SIGTERM)
        caller.join(timeout=15)
        self.assertLess(time.monotonic() - stopped_at, 5)
        self.assertEqual(result.get("status"), 503, result)
        self.assertEqual(result["body"]["error"]["code"], "engine_unavailable")
        self.assertEqual(daemon.popen.wait(timeout=15), 0)


class CleanStopTest(harness.DaemonTestCase):
    def assert_quiet_stop(self, daemon):
        daemon.wait_healthy()
        daemon.popen.send_signal(signal.SIGTERM)
        self.assertEqual(daemon.popen.wait(timeout=20), 0)
        log = daemon.log()
        self.assertIn("shutting down", log)
        self.assertIn("stopped", log)
        stop = log[log.index("shutting down"):]
        alarms = [line for line in stop.splitlines()
                  if re.search(r"\b(warning|error|critical)\b", line, re.IGNORECASE)]
        self.assertEqual(alarms, [], "a clean stop logged alarms")

    def test_an_embedded_engine_stops_without_alarms(self):
        self.assert_quiet_stop(self.start_daemon(["--dev-mode"]))

    def test_a_managed_engine_stops_without_alarms(self):
        command = f"{harness.engine_bin()} --handshake {{handshake_address}} --rank 0"
        self.assert_quiet_stop(self.start_daemon(["--dev-mode", "--engine", "managed",
                                                  "--engine-command", command]))


if __name__ == "__main__":
    unittest.main()
