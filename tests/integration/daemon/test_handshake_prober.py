"""The handshake port under a TCP prober (docs/engine-protocol.md §2.3): a load balancer's health
check or a port scanner connecting to it never locks an engine out. Its own suite: 120 daemon
starts, which run beside the other suites."""

import socket
import threading
import time
import unittest

import harness


class HandshakeProberTest(harness.DaemonTestCase):

    STARTS = 120

    def test_a_tcp_prober_on_the_handshake_port_never_locks_an_engine_out(self):
        # A load balancer's health check or a port scanner connects and hangs up again: its
        # fds are reused by the engine's handshake connection, and its disconnects must not be
        # taken for the engine's, nor may the engine's own disconnect after READY beat the
        # READY. Embedded mode: the engine connects while vllmd's IO thread is just starting,
        # with the prober's events already queued (about 1 start in 100 failed before).
        port = harness.free_port()
        handshake = f"tcp://{harness.HOST}:{port}"
        stop = threading.Event()

        def probe():
            while not stop.is_set():
                try:
                    socket.create_connection((harness.HOST, port), timeout=1).close()
                except OSError:
                    time.sleep(0.001)  # not listening yet, or between two daemons

        probers = [threading.Thread(target=probe, daemon=True) for _ in range(2)]
        for prober in probers:
            prober.start()
            self.addCleanup(prober.join)
        self.addCleanup(stop.set)
        for start in range(self.STARTS):
            daemon = self.launch_daemon(
                ["--dev-mode", "--engine", "embedded", "--handshake-address", handshake],
                name=f"vllmd{start}")
            try:
                harness.wait_until(lambda: daemon.health_status() == 200, 5,
                                   message=f"start {start}: GET /health -> 200")
            except AssertionError as error:
                raise AssertionError(f"{error}\n--- vllmd log:\n{daemon.log()}") from None
            self.assertNotIn("rejected", daemon.log())
            daemon.stop()


if __name__ == "__main__":
    unittest.main()
