"""Engine failures through vllmd (docs/http-api.md §4.3, §5.1 and §8.1; docs/engine-protocol.md
§6.1, §8.2 and §8.5): a failed finish never commits the version, a failed set_weight_version
is told apart, DP=2 fans every call out and names the failing rank, and an engine killed
mid-update is noticed at once (503), reported by /health, and replaced by a restarted engine
of the same rank."""

import sys
import threading
import time
import unittest

import harness
from harness import rpc

UPDATE = harness.update_info("a.weight", "b.weight")


def methods(calls):
    return [call["worker_method"] or call["method"] for call in calls]


class FinishFailureTest(harness.DaemonTestCase):

    def test_failed_finish_leaves_the_old_version(self):
        daemon, (engine,), _ = self.start_external(
            engine_extra={0: ["--inject-fail", "finish_weight_update"]})
        self.assertEqual(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": harness.NCCL_INIT_INFO}).status_code, 200)
        self.assert_json(daemon.post("/update_weight_version", json={"new_version": "step-0"}),
                         200, {"success": True, "new_version": "step-0"})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        self.assert_json(daemon.post("/update_weights", json={"update_info": UPDATE}), 200,
                         {"message": "Weights updated"})

        response = daemon.post("/finish_weight_update", json={"weight_version": "step-1"})
        self.assert_error(response, 500, "server_error", type_="server_error",
                          message_prefix="failed to call finish_weight_update:")
        self.assertIn("injected failure", response.json()["error"]["message"])

        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "step-0"})
        # step-1 was never sent to the engine: only step-0 ever was.
        sent = [call["args"] for call in engine.calls() if call["method"] == "set_weight_version"]
        self.assertEqual(sent, [["step-0"]])
        # Answered from what the engines last reported (nothing changed it): no query.
        self.assertEqual(methods(engine.calls())[-1], "finish_weight_update")

    def test_failed_set_weight_version_after_a_good_finish_is_named(self):
        daemon, (engine,), _ = self.start_external(
            engine_extra={0: ["--inject-fail", "set_weight_version"]})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        response = daemon.post("/finish_weight_update", json={"weight_version": "step-1"})
        error = self.assert_error(response, 500, "server_error", type_="server_error",
                                  message_prefix="failed to call set_weight_version:")
        self.assertNotIn("failed to call finish_weight_update", error["message"])
        # finish did run (and succeed) before the version was attempted.
        self.assertEqual(harness.wire(engine.calls()), [
            rpc("start_weight_update"), rpc("finish_weight_update"),
            ("set_weight_version", ["step-1"])])
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "default"})


class DataParallelTest(harness.DaemonTestCase):

    def test_every_lifecycle_call_reaches_both_engines(self):
        daemon, engines, _ = self.start_external(dp=2)
        update_list = [harness.update_info("rank0.weight"), harness.update_info("rank1.weight")]

        self.assert_json(daemon.get("/get_world_size"), 200, {"world_size": 2})
        self.assert_json(daemon.get("/get_world_size?include_dp=false"), 200, {"world_size": 1})
        self.assert_json(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": harness.NCCL_INIT_INFO}),
                         200, {"message": "Weight transfer initialized"})
        self.assert_json(daemon.post("/pause"), 200, {"status": "paused"})
        self.assert_json(daemon.get("/is_paused"), 200, {"is_paused": True})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        self.assert_json(daemon.post("/update_weights", json={"update_info": UPDATE}), 200,
                         {"message": "Weights updated"})
        self.assert_json(daemon.post("/update_weights", json={"update_info": update_list}), 200,
                         {"message": "Weights updated"})
        self.assert_json(daemon.post("/finish_weight_update", json={"weight_version": "step-1"}),
                         200, {"message": "Weight update finished"})
        self.assert_json(daemon.post("/resume"), 200, {"status": "resumed"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "step-1"})
        self.assert_json(daemon.post("/update_weight_version", json={"new_version": "step-2"}),
                         200, {"success": True, "new_version": "step-2"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "step-2"})
        self.assert_json(daemon.post("/start_draft_weight_update"), 200,
                         {"message": "Draft weight update started"})

        expected = [
            rpc("init_weight_transfer_engine", {"init_info": harness.NCCL_INIT_INFO}),
            ("pause_scheduler", ["abort", True]),
            rpc("start_weight_update"),
            rpc("update_weights", {"update_info": UPDATE}),
            rpc("update_weights", {"update_info": update_list}),
            rpc("finish_weight_update"),
            ("set_weight_version", ["step-1"]),
            ("resume_scheduler", []),
            ("set_weight_version", ["step-2"]),
            rpc("start_draft_weight_update"),
        ]
        for engine in engines:
            with self.subTest(engine=engine.name):
                self.assertEqual(harness.wire(engine.calls()), expected)

    def test_a_failure_on_rank_1_names_rank_1(self):
        daemon, engines, _ = self.start_external(
            dp=2, engine_extra={1: ["--inject-fail", "start_weight_update"]})
        response = daemon.post("/start_weight_update")
        error = self.assert_error(response, 500, "server_error", type_="server_error",
                                  message_prefix="failed to call start_weight_update: engine "
                                                 "rank 1: Call to collective_rpc method failed")
        # Rank 0 did start: vllmd closes its session again, so no rank is left in one.
        self.assertTrue(error["message"].endswith(
            "; no session was opened: the session was closed on engine rank 0"), error)
        self.assertEqual(harness.wire(engines[0].calls()),
                         [rpc("start_weight_update"), rpc("finish_weight_update")])
        self.assertEqual(harness.wire(engines[1].calls()), [rpc("start_weight_update")])

    def test_a_finish_failing_on_one_rank_commits_no_version_anywhere(self):
        daemon, engines, _ = self.start_external(
            dp=2, engine_extra={1: ["--inject-fail", "finish_weight_update"]})
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        response = daemon.post("/finish_weight_update", json={"weight_version": "step-1"})
        error = self.assert_error(response, 500, "server_error", type_="server_error",
                                  message_prefix="failed to call finish_weight_update:")
        self.assertIn("engine rank 1", error["message"])
        self.assertIn("nothing was committed; engine rank 0 finished", error["message"])
        self.assertEqual(harness.wire(engines[0].calls()),
                         [rpc("start_weight_update"), rpc("finish_weight_update")])
        # vLLM keeps a session whose finish failed open: vllmd tries to close it once more.
        self.assertEqual(harness.wire(engines[1].calls()),
                         [rpc("start_weight_update"), rpc("finish_weight_update"),
                          rpc("finish_weight_update")])
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "default"})


    def test_engines_that_disagree_on_the_version_are_reported(self):
        daemon, engines, _ = self.start_external(
            dp=2, engine_extra={1: ["--inject-fail", "set_weight_version"]})
        response = daemon.post("/update_weight_version", json={"new_version": "step-1"})
        error = self.assert_error(response, 500, "server_error", type_="server_error",
                                  message_prefix="failed to call set_weight_version:")
        self.assertIn("engine rank 1", error["message"])
        self.assertNotIn("engine rank 0", error["message"])
        # Rank 0 now holds step-1, rank 1 still "default": /weight_info must not pick one.
        error = self.assert_error(daemon.get("/weight_info"), 500, "server_error",
                                  type_="server_error")
        self.assertIn("step-1", error["message"])
        self.assertIn("default", error["message"])
        for engine in engines:
            self.assertEqual(harness.wire(engine.calls()),
                             [("set_weight_version", ["step-1"]), ("get_weight_version", [])])


class TimeoutTest(harness.DaemonTestCase):

    def test_a_lifecycle_call_past_the_call_timeout_answers_504(self):
        daemon, (engine,), _ = self.start_external(
            daemon_args=["--call-timeout", "1"],
            engine_extra={0: ["--inject-delay", "start_weight_update=30"]})
        started = time.monotonic()
        response = daemon.post("/start_weight_update")
        took = time.monotonic() - started
        self.assert_error(response, 504, "engine_timeout", type_="server_error",
                          message_prefix="failed to call start_weight_update:")
        self.assertGreater(took, 0.9)
        self.assertLess(took, 3.0)
        self.assertEqual(methods(engine.calls()), ["start_weight_update"])
        self.assertEqual(daemon.get("/version").status_code, 200)
        daemon.wait_no_pending_calls()  # expired, not leaked


class KnownStateTest(harness.DaemonTestCase):

    def test_after_a_failed_pause_is_paused_asks_the_engines_again(self):
        daemon, (engine,), _ = self.start_external(
            engine_extra={0: ["--inject-fail", "pause_scheduler"]})
        self.assert_json(daemon.get("/is_paused"), 200, {"is_paused": False})
        self.assertEqual(methods(engine.calls()), [])  # known: a new engine is not paused
        self.assertEqual(daemon.post("/pause").status_code, 500)
        # The pause may or may not have happened: only the engine can say.
        self.assert_json(daemon.get("/is_paused"), 200, {"is_paused": False})
        self.assertEqual(methods(engine.calls()), ["pause_scheduler", "is_scheduler_paused"])
        self.assert_json(daemon.get("/is_paused"), 200, {"is_paused": False})
        self.assertEqual(len(engine.calls()), 2)  # known again


class GarbageFramesTest(harness.DaemonTestCase):

    def test_malformed_engine_frames_fail_the_call_at_once_and_the_link_goes_on(self):
        # --inject-garbage: before its real reply, the engine sends empty, truncated,
        # non-msgpack, deeply nested, huge-claiming and wrongly typed frames and a reply to a
        # call nobody made. An undecodable frame may have been the reply itself: the call
        # fails at once, naming it, instead of waiting out the call timeout (30 min).
        daemon, (engine,), _ = self.start_external(
            engine_extra={0: ["--inject-garbage", "start_weight_update"]})
        self.assertEqual(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": harness.NCCL_INIT_INFO}).status_code, 200)
        started = time.monotonic()
        response = daemon.post("/start_weight_update")
        self.assertLess(time.monotonic() - started, 1)
        self.assert_error(response, 500, "server_error", type_="server_error",
                          message_prefix="failed to call start_weight_update: engine rank 0 "
                                         "sent an undecodable message")
        # No crash; the engine stays attached and the late real reply is dropped. The start
        # may have run (its answer was lost), so vllmd closed the session it may have opened.
        # That finish may itself meet one of the bad frames still in flight (then its outcome
        # is unknown too, and vllmd closes the session again before the next start).
        self.assertTrue(daemon.alive())
        self.assertEqual(daemon.health_status(), 200)
        self.assertEqual(harness.call_names(engine.calls())[-2:],
                         ["start_weight_update", "finish_weight_update"])
        self.assertRegex(response.json()["error"]["message"],
                         "; no session was opened: (the session was closed on engine rank 0|"
                         "engine rank 0 may still hold it .*; vllmd closes it when the rank "
                         "answers again)$")
        # Either way the engine never gets a start while it may hold a session: a finish
        # comes between any two starts.
        self.assertEqual(daemon.post("/start_weight_update").status_code, 500)
        names = [name for name in harness.call_names(engine.calls())
                 if name in ("start_weight_update", "finish_weight_update")]
        self.assertEqual(names[:2], ["start_weight_update", "finish_weight_update"])
        for earlier, later in zip(names, names[1:]):
            self.assertFalse(earlier == later == "start_weight_update", names)
        self.assert_json(daemon.post("/update_weight_version", json={"new_version": "g1"}), 200,
                         {"success": True, "new_version": "g1"})
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "g1"})
        self.assertIn("dropped an undecodable message", daemon.log())
        daemon.wait_no_pending_calls()


class EngineDeathTest(harness.DaemonTestCase):

    def test_engine_dying_without_a_reply_answers_503_at_once(self):
        # --inject-exit: the process exits without replying; --inject-dead: it sends
        # ENGINE_CORE_DEAD first, as a crashing vLLM engine does.
        for index, fault in enumerate(("--inject-exit", "--inject-dead")):
            with self.subTest(fault=fault):
                handshake = f"tcp://{harness.HOST}:{harness.free_port()}"
                daemon = self.start_daemon(
                    ["--dev-mode", "--engine", "external", "--handshake-address", handshake],
                    name=f"vllmd{index}")
                engine = self.start_engine(handshake, extra=[fault, "start_weight_update"],
                                           name=f"engine{index}")
                daemon.wait_healthy()
                started = time.monotonic()
                response = daemon.post("/start_weight_update", timeout=30)
                self.assertLess(time.monotonic() - started, 2.5)
                self.assert_error(response, 503, "engine_unavailable", type_="server_error",
                                  message_prefix="failed to call start_weight_update:")
                self.assertEqual(daemon.health_status(), 503)
                engine.popen.wait(timeout=10)
                self.assertEqual(methods(engine.calls()), ["start_weight_update"])
                self.assertEqual(daemon.get("/version").status_code, 200)

    def test_engine_killed_mid_update_then_restarted(self):
        daemon, (engine,), handshake = self.start_external(
            engine_extra={0: ["--inject-delay", "update_weights=30"]})
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)

        result = {}

        def update():
            try:
                result["response"] = daemon.post("/update_weights", json={"update_info": UPDATE},
                                                 timeout=60)
            except Exception as error:  # reported by the main thread
                result["exception"] = error
            result["done"] = time.monotonic()

        client = threading.Thread(target=update, daemon=True)
        client.start()
        # The engine has the call and sits in its injected delay.
        harness.wait_until(lambda: "update_weights" in methods(engine.calls()), 10,
                           message="the engine to receive update_weights")
        time.sleep(0.2)
        self.assertTrue(client.is_alive(), "update_weights answered while the engine was blocked")
        killed = time.monotonic()
        engine.kill()  # SIGKILL, reaped
        client.join(timeout=15)
        self.assertFalse(client.is_alive(), "the HTTP call is still hanging on a dead engine")
        self.assertNotIn("exception", result, result)
        elapsed = result["done"] - killed
        self.assert_error(result["response"], 503, "engine_unavailable", type_="server_error",
                          message_prefix="failed to call update_weights:")
        self.assertLess(elapsed, 1.0, "a dead engine must be answered 503 within 1 s")
        daemon.wait_no_pending_calls()
        print(f"\n  kill -9 -> 503 in {elapsed * 1000:.0f} ms", file=sys.stderr)

        # Unhealthy, yet the daemon keeps serving.
        self.assert_error(daemon.get("/health"), 503, "engine_unavailable", type_="server_error")
        version = daemon.get("/version")
        self.assertEqual(version.status_code, 200, version.text)
        self.assertIn("version", version.json())
        self.assert_error(daemon.post("/start_weight_update"), 503, "engine_unavailable",
                          type_="server_error")
        self.assertEqual(daemon.health_status(), 503)

        # The same rank comes back: admitted again within a few seconds.
        restarted = self.start_engine(handshake, rank=0, name="engine0-restarted")
        started = time.monotonic()
        daemon.wait_healthy(timeout=10)
        self.assertLess(time.monotonic() - started, 5)
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "default"})
        self.assert_json(daemon.post("/start_weight_update"), 200,
                         {"message": "Weight update started"})
        # A new engine process holds "default": /weight_info needed no query.
        self.assertEqual(methods(restarted.calls()), ["start_weight_update"])
        self.assertTrue(daemon.alive())


if __name__ == "__main__":
    unittest.main()
