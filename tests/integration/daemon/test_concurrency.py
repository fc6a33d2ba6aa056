"""Concurrency semantics (docs/http-api.md §5.2, §5.3): weight-sync lifecycle calls are serialized
across clients, while read-only routes are never blocked by a long-running update."""

import threading
import time
import unittest

import harness
from harness import rpc

DELAY = 3.0  # seconds the engine blocks in update_weights
SLACK = 0.05  # how far apart two client threads may see simultaneous replies
UPDATE = harness.update_info("x.weight")


class Call(threading.Thread):
    """One HTTP call on its own thread, with the monotonic times it started and finished."""

    def __init__(self, daemon, method, path, **kwargs):
        super().__init__(daemon=True)
        self.args = (daemon, method, path, kwargs)
        self.response = None
        self.error = None
        self.started = self.finished = None

    def run(self):
        daemon, method, path, kwargs = self.args
        self.started = time.monotonic()
        try:
            send = daemon.post if method == "POST" else daemon.get
            self.response = send(path, timeout=60, **kwargs)
        except Exception as error:  # reported by the main thread
            self.error = error
        self.finished = time.monotonic()

    def result(self, test, timeout=30):
        self.join(timeout)
        test.assertFalse(self.is_alive(), f"{self.args[2]} did not answer in {timeout} s")
        test.assertIsNone(self.error, self.error)
        return self.response


def methods(calls):
    return [call["worker_method"] or call["method"] for call in calls]


class ConcurrencyTest(harness.DaemonTestCase):

    def update_blocking_the_engine(self, daemon, engine):
        """init and start, then call A: an update the engine holds for DELAY seconds, under
        way (at the engine) once this returns."""
        self.assert_json(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": harness.NCCL_INIT_INFO}),
                         200, {"message": "Weight transfer initialized"})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        a = Call(daemon, "POST", "/update_weights", json={"update_info": UPDATE})
        a.start()
        harness.wait_until(lambda: "update_weights" in methods(engine.calls()), 10,
                           message="the engine to receive A's update_weights")
        return a

    def test_lifecycle_waits_its_turn_while_reads_are_fast(self):
        daemon, (engine,), _ = self.start_external(
            engine_extra={0: ["--inject-delay", f"update_weights={DELAY}"]})
        # Known state first, so the daemon has a version and a pause state to answer from.
        self.assert_json(daemon.post("/update_weight_version", json={"new_version": "step-7"}),
                         200, {"success": True, "new_version": "step-7"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "step-7"})
        self.assert_json(daemon.get("/is_paused"), 200, {"is_paused": False})

        a = self.update_blocking_the_engine(daemon, engine)
        b = Call(daemon, "POST", "/finish_weight_update", json={"weight_version": "step-8"})
        b.start()

        # While A blocks the engine, read-only routes answer at once.
        reads = 0
        while a.is_alive() and time.monotonic() - a.started < DELAY - 0.6:
            for path, body in (("/weight_info", {"weight_version": "step-7"}),
                               ("/is_paused", {"is_paused": False}),
                               ("/get_world_size", {"world_size": 1}),
                               ("/health", None)):
                started = time.monotonic()
                response = daemon.get(path, timeout=10)
                took = time.monotonic() - started
                self.assertEqual(response.status_code, 200, (path, response.text))
                if body is not None:
                    self.assertEqual(response.json(), body, path)
                self.assertLess(took, 0.2, f"GET {path} took {took:.3f} s during an update")
                reads += 1
            time.sleep(0.05)
        self.assertGreater(reads, 0)
        self.assertTrue(a.is_alive(), "A answered before the engine's delay was over")
        self.assertTrue(b.is_alive(), "B answered while A still held the engine session")

        self.assert_json(a.result(self), 200, {"message": "Weights updated"})
        self.assert_json(b.result(self), 200, {"message": "Weight update finished"})
        self.assertGreaterEqual(a.finished - a.started, DELAY - 0.2)
        # B could only complete once the engine was done with A. (Client-side finish times
        # of two threads are only good to a few ms: the reply that came second may be read
        # first, hence the slack.)
        self.assertGreaterEqual(b.finished, a.started + DELAY - 0.2, "B did not wait for A")
        self.assertGreaterEqual(b.finished, a.finished - SLACK, "B finished before A")
        self.assertEqual(methods(engine.calls())[-3:],
                         ["update_weights", "finish_weight_update", "set_weight_version"])
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "step-8"})

    # A newly admitted engine is known to be at "default", unpaused: no query needed first.
    def test_reads_are_fast_during_an_update_even_with_a_cold_cache(self):
        daemon, (engine,), _ = self.start_external(
            engine_extra={0: ["--inject-delay", f"update_weights={DELAY}"]})
        a = self.update_blocking_the_engine(daemon, engine)
        try:
            for path, body in (("/weight_info", {"weight_version": "default"}),
                               ("/is_paused", {"is_paused": False})):
                started = time.monotonic()
                response = daemon.get(path, timeout=10)
                took = time.monotonic() - started
                self.assert_json(response, 200, body)
                self.assertLess(took, 0.2, f"GET {path} took {took:.3f} s during an update")
        finally:
            self.assert_json(a.result(self), 200, {"message": "Weights updated"})

    def test_lifecycle_calls_are_serialized_in_the_daemon(self):
        # With one engine, its own one-call-at-a-time loop would order A and B even without
        # the daemon's serialization. With DP=2 and only rank 0 slow, rank 1 answers A at once:
        # if the daemon let B through, rank 1 would receive B while A is still in flight.
        daemon, (slow, fast), _ = self.start_external(
            dp=2, engine_extra={0: ["--inject-delay", f"update_weights={DELAY}"]})
        self.assert_json(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": harness.NCCL_INIT_INFO}),
                         200, {"message": "Weight transfer initialized"})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})

        a = Call(daemon, "POST", "/update_weights", json={"update_info": UPDATE})
        a.start()
        harness.wait_until(lambda: "update_weights" in methods(slow.calls()) and
                           "update_weights" in methods(fast.calls()), 10,
                           message="both engines to receive A's update_weights")
        b = Call(daemon, "POST", "/finish_weight_update")  # no body, as a trainer sends it
        c = Call(daemon, "POST", "/update_weight_version", json={"new_version": "step-9"})
        b.start()
        time.sleep(0.1)
        c.start()
        while a.is_alive() and time.monotonic() - a.started < DELAY - 0.5:
            self.assertEqual(methods(fast.calls()), ["init_weight_transfer_engine",
                                                     "start_weight_update", "update_weights"],
                             "a lifecycle call reached an engine while another was in flight")
            time.sleep(0.05)
        self.assertTrue(a.is_alive())

        self.assert_json(a.result(self), 200, {"message": "Weights updated"})
        self.assert_json(b.result(self), 200, {"message": "Weight update finished"})
        self.assert_json(c.result(self), 200, {"success": True, "new_version": "step-9"})
        for call in (b, c):
            self.assertGreaterEqual(call.finished, a.started + DELAY - 0.2)
            self.assertGreaterEqual(call.finished, a.finished - SLACK)
        # B and C waited for the same lock: either may go first, but each went whole, and
        # both engines saw the same order.
        head = [rpc("init_weight_transfer_engine", {"init_info": harness.NCCL_INIT_INFO}),
                rpc("start_weight_update"), rpc("update_weights", {"update_info": UPDATE})]
        b_call, c_call = rpc("finish_weight_update"), ("set_weight_version", ["step-9"])
        seen = harness.wire(slow.calls())
        self.assertIn(seen, [head + [b_call, c_call], head + [c_call, b_call]])
        self.assertEqual(harness.wire(fast.calls()), seen)


if __name__ == "__main__":
    unittest.main()
