"""Never commit a version the engines don't hold. A weight-update session belongs to the engine
incarnations it started on: a rank restarted during it loses the session (503 naming the rank,
nothing committed, the survivors' sessions closed so the next start works). A finish that
failed on one rank leaves no rank in a session. Reads answer 503 while an engine is not
attached, and a resume that could not reach an engine is delivered once it answers again."""

import os
import signal
import threading
import time
import unittest

import harness
from harness import NCCL_INIT_INFO, rpc
from test_engine_liveness import cut_connections_to, input_port, without_probes

UPDATE = {"update_info": harness.update_info("model.w")}


class IncarnationTest(harness.DaemonTestCase):
    def start(self, dp=2, engine_extra=None, daemon_args=()):
        daemon, engines, handshake = self.start_external(dp=dp, engine_extra=engine_extra,
                                                         daemon_args=daemon_args)
        self.handshake = handshake
        self.init(daemon)
        return daemon, engines

    def init(self, daemon):
        self.assertEqual(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": NCCL_INIT_INFO}).status_code, 200)

    def restart(self, daemon, engines, rank, dp=2):
        """kill -9 of a rank and a new process in its place; returns once it is admitted."""
        engines[rank].kill()
        engines[rank] = self.start_engine(self.handshake, rank=rank, dp=dp,
                                          name=f"engine{rank}-again")
        harness.wait_until(lambda: daemon.health_status() == 200, 20,
                           message="the restarted rank admitted")

    def test_a_rank_restarted_mid_session_loses_it_and_nothing_is_committed(self):
        daemon, engines = self.start()
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assertEqual(daemon.post("/update_weights", json=UPDATE).status_code, 200)
        self.restart(daemon, engines, 0)
        response = daemon.post("/finish_weight_update", json={"weight_version": "step-42"})
        error = self.assert_error(response, 503, "engine_unavailable", type_="server_error")
        self.assertIn("engine rank 0 restarted during the weight-update session", error["message"])
        self.assertIn("nothing was committed", error["message"])
        self.assertIn("the session was closed on engine rank 1", error["message"])
        # The new rank 0 never heard of the session; rank 1's was closed without a version.
        self.assertEqual(harness.call_names(engines[0].calls()), [])
        self.assertEqual(harness.wire(engines[1].calls())[-1], rpc("finish_weight_update"))
        for engine in engines:
            self.assertNotIn("set_weight_version", harness.call_names(engine.calls()))
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "default"})
        # Nothing is stuck: the next sync works on every rank (the new process needs init).
        self.init(daemon)
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update",
                                     json={"weight_version": "step-43"}).status_code, 200)
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "step-43"})

    def test_a_rank_restarted_while_the_others_finish_commits_nothing(self):
        # The failure as observed: rank 0 answered finish, was killed and restarted while rank
        # 1 was still finishing; the finish answered 200 and /weight_info said step-42.
        daemon, engines = self.start(engine_extra={1: ["--inject-delay", "finish_weight_update=4"]})
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        result = {}
        finishing = threading.Thread(target=lambda: result.update(
            response=daemon.post("/finish_weight_update", json={"weight_version": "step-42"})))
        finishing.start()
        harness.wait_until(lambda: "finish_weight_update" in harness.call_names(engines[0].calls()),
                           5, message="rank 0's finish")
        self.restart(daemon, engines, 0)
        finishing.join()
        error = self.assert_error(result["response"], 503, "engine_unavailable", type_="server_error")
        self.assertIn("engine rank 0 restarted during the weight-update session", error["message"])
        self.assertEqual(harness.call_names(engines[0].calls()), [])  # no set_weight_version
        self.assertNotIn("set_weight_version", harness.call_names(engines[1].calls()))
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "default"})

    def test_a_start_after_a_rank_restarted_mid_session_closes_the_lost_session(self):
        # Found by the chaos test: an anonymous session was open when rank 1 restarted; the
        # next start was refused by rank 0 alone ("already active") while the new rank 1
        # started (and was closed again), and so every start until someone sent an update or
        # a finish. The session is lost: the start says so and closes it on the survivors.
        daemon, engines = self.start()
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.restart(daemon, engines, 1)
        error = self.assert_error(daemon.post("/start_weight_update"), 503, "engine_unavailable",
                                  type_="server_error")
        self.assertIn("engine rank 1 restarted during the weight-update session", error["message"])
        self.assertIn("the session was closed on engine rank 0", error["message"])
        self.assertNotIn("already active", error["message"])
        # The new rank 1 never heard of either start; rank 0's session was closed.
        self.assertEqual(harness.call_names(engines[1].calls()), [])
        self.assertEqual(harness.wire(engines[0].calls())[-1], rpc("finish_weight_update"))
        # The next start works on every rank (the new process needs init).
        self.init(daemon)
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update",
                                     json={"weight_version": "v1"}).status_code, 200)
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "v1"})

    def test_a_finish_failed_on_one_rank_leaves_no_session_anywhere(self):
        daemon, engines = self.start(engine_extra={1: ["--inject-fail-once", "finish_weight_update"]})
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        response = daemon.post("/finish_weight_update", json={"weight_version": "v1"})
        error = self.assert_error(response, 500, "server_error", type_="server_error")
        self.assertIn("engine rank 1: Call to collective_rpc method failed", error["message"])
        self.assertIn("nothing was committed; engine rank 0 finished, and the session was closed "
                      "on engine rank 1", error["message"])
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "default"})
        # Before: the next start failed on rank 1 ("already active") until engines restarted.
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update",
                                     json={"weight_version": "v2"}).status_code, 200)
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "v2"})

    def test_an_update_failed_on_one_rank_closes_the_session_everywhere(self):
        daemon, engines = self.start(engine_extra={0: ["--inject-fail-once", "update_weights"]})
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        error = self.assert_error(daemon.post("/update_weights", json=UPDATE), 500, "server_error",
                                  type_="server_error")
        self.assertIn("nothing was committed, and the session was closed on engine ranks 0, 1",
                      error["message"])
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assertEqual(daemon.post("/update_weights", json=UPDATE).status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update",
                                     json={"weight_version": "v3"}).status_code, 200)

    def test_a_session_on_a_rank_cut_off_meanwhile_is_closed_once_it_is_back(self):
        # Found by the chaos test: the rank was unreachable when vllmd closed the session
        # everywhere, kept it, and refused every later start ("already active").
        daemon, engines = self.start()
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        engines[0].freeze()  # it cannot reconnect while stopped
        self.addCleanup(engines[0].thaw)
        cut_connections_to(input_port(daemon))
        harness.wait_until(lambda: "disconnected" in daemon.get("/health").text, 5,
                           message="rank 0 disconnected")
        error = self.assert_error(daemon.post("/update_weights", json=UPDATE), 503,
                                  "engine_unavailable", type_="server_error")
        self.assertIn("engine rank 0 may still hold it", error["message"])
        self.assertIn("vllmd closes it when the rank answers again", error["message"])
        # Until it is closed no rank gets a start: rank 0 would refuse it once back ("already
        # active", the chaos test saw it) while rank 1 took it.
        calls_before = len(engines[1].calls())
        error = self.assert_error(daemon.post("/start_weight_update"), 503, "engine_unavailable",
                                  type_="server_error")
        # (Rank 1 was cut too: it may still be reconnecting, and be named with rank 0.)
        self.assertRegex(error["message"], r"engine ranks? 0(, 1)? may still hold a weight-update "
                                           r"session that vllmd could not close")
        self.assertNotIn("start_weight_update",
                         harness.call_names(engines[1].calls()[calls_before:]))
        engines[0].thaw()
        harness.wait_until(lambda: daemon.health_status() == 200, 10, message="rank 0 back")
        harness.wait_until(lambda: without_probes(harness.call_names(engines[0].calls()))[-1:] ==
                           ["finish_weight_update"], 5, message="rank 0's session closed")
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update",
                                     json={"weight_version": "after-cut"}).status_code, 200)

    def test_a_start_refused_while_a_session_is_open_leaves_that_session_alone(self):
        # A second start while a session is open, its answer lost on rank 0 (a timeout): it
        # opened nothing there (rank 0 holds the open session), so vllmd must not close rank
        # 0 "where it may have started": that would close the open session on rank 0 alone.
        daemon, engines = self.start(daemon_args=("--call-timeout", "1"))
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        engines[0].freeze()
        self.addCleanup(engines[0].thaw)
        self.assert_error(daemon.post("/start_weight_update"), 504, "engine_timeout",
                          type_="server_error")
        engines[0].thaw()
        harness.wait_until(lambda: daemon.health_status() == 200, 10, message="rank 0 back")
        # The open session goes on, on both ranks.
        self.assertEqual(daemon.post("/update_weights", json=UPDATE).status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update",
                                     json={"weight_version": "v1"}).status_code, 200)
        for engine in engines:
            self.assertEqual(without_probes(harness.call_names(engine.calls()))[-5:],
                             ["start_weight_update", "start_weight_update", "update_weights",
                              "finish_weight_update", "set_weight_version"])
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "v1"})

    def test_reads_answer_503_without_an_engine(self):
        handshake = f"tcp://{harness.HOST}:{harness.free_port()}"
        daemon = self.launch_daemon(["--dev-mode", "--engine", "external",
                                     "--handshake-address", handshake])
        for path in ("/weight_info", "/is_paused"):
            with self.subTest(path=path):
                error = self.assert_error(daemon.get(path), 503, "engine_unavailable",
                                          type_="server_error")
                self.assertIn("engine rank 0 is waiting", error["message"])


class UndeliveredResumeTest(harness.DaemonTestCase):
    def test_a_resume_that_cannot_reach_the_engine_is_delivered_when_it_answers(self):
        # The failure as observed: after a call timeout the engine is marked dead, so /resume
        # got 503 and was never delivered when the engine answered a second later.
        daemon, (engine,), _ = self.start_external(
            engine_extra={0: ["--inject-delay", "update_weights=3"]},
            daemon_args=("--call-timeout", "1"))
        self.assertEqual(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": NCCL_INIT_INFO}).status_code, 200)
        self.assertEqual(daemon.post("/pause").status_code, 200)
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assert_error(daemon.post("/update_weights", json=UPDATE), 504, "engine_timeout",
                          type_="server_error")
        error = self.assert_error(daemon.post("/resume"), 503, "engine_unavailable",
                                  type_="server_error")
        self.assertIn("generation may still be paused on engine rank 0: vllmd resumes it as soon "
                      "as it answers again", error["message"])
        # The engine finishes the update, answers, and gets the resume it missed.
        harness.wait_until(lambda: "resume_scheduler" in harness.call_names(engine.calls()), 10,
                           message="the resume delivered")
        harness.wait_until(lambda: daemon.health_status() == 200, 10, message="healthy again")
        # vllmd records the engine as resumed when the resume's reply comes, and logs it after:
        # the engine's record of the call can come first (CI's ASan run read /is_paused there).
        harness.wait_until(lambda: "delivered resume_scheduler to engine rank 0 now that it "
                           "answers again" in daemon.log(), 10, message="the delivery logged")
        self.assert_json(daemon.get("/is_paused"), 200, {"is_paused": False})

    def test_a_resume_that_times_out_says_so_and_still_takes_effect(self):
        # The engine is busy past the call timeout: the resume is with it and runs when it
        # gets to it; the answer says generation may still be paused, and reads ask again.
        daemon, (engine,), _ = self.start_external(
            engine_extra={0: ["--inject-delay", "resume_scheduler=3"]},
            daemon_args=("--call-timeout", "1"))
        self.assertEqual(daemon.post("/pause").status_code, 200)
        error = self.assert_error(daemon.post("/resume"), 504, "engine_timeout",
                                  type_="server_error")
        self.assertIn("generation may still be paused", error["message"])
        harness.wait_until(lambda: daemon.get("/is_paused").json() == {"is_paused": False}, 10,
                           message="the resume in effect")


if __name__ == "__main__":
    unittest.main()
