"""Sleep mode through vllmd (docs/http-api.md, dev-mode routes): POST /sleep, /wake_up and
/release_kv_cache_memory and GET /is_sleeping reach every engine with vLLM's utility call and
arguments (as the reference engine records them) and answer with vLLM's bodies; a bad query
reaches no engine; engines that disagree are a 500; and a weight update while the weights
sleep is a 409 that no engine sees (vLLM's engine crashes on one: vllm#57853)."""

import unittest

import harness


class SleepTest(harness.DaemonTestCase):

    def test_each_route_sends_vllms_call_and_answers_vllms_body(self):
        daemon, engines, _ = self.start_external(dp=2)
        self.assert_json(daemon.post("/sleep"), 200, {"status": "sleeping", "level": 1})
        self.assert_json(daemon.get("/is_sleeping"), 200, {"is_sleeping": True})
        self.assert_json(daemon.post("/wake_up?tags=weights&tags%5B%5D=ignored"), 200,
                         {"status": "sleeping", "tags_woken": ["weights"]})
        self.assert_json(daemon.post("/wake_up?tags=kv_cache"), 200,
                         {"status": "awake", "tags_woken": ["kv_cache"]})
        self.assert_json(daemon.get("/is_sleeping"), 200, {"is_sleeping": False})
        self.assert_json(daemon.post("/sleep?level=0&mode=keep"), 200,
                         {"status": "sleeping", "level": 0})
        self.assert_json(daemon.post("/release_kv_cache_memory"), 200,
                         {"status": "kv_cache_released"})
        self.assert_json(daemon.post("/wake_up"), 200, {"status": "awake", "tags_woken": None})
        expected = [
            ("sleep", [1, "abort"]),
            ("is_sleeping", []),
            ("wake_up", [["weights"]]),
            ("wake_up", [["kv_cache"]]),
            ("is_sleeping", []),
            ("sleep", [0, "keep"]),
            ("release_kv_cache_memory", []),
            ("wake_up", [None]),
        ]
        for engine in engines:
            with self.subTest(engine=engine.name):
                self.assertEqual(harness.wire(engine.calls()), expected)
        # A full wake resumed generation.
        self.assert_json(daemon.get("/is_paused"), 200, {"is_paused": False})

    def test_a_bad_query_is_400_and_reaches_no_engine(self):
        daemon, engines, _ = self.start_external(dp=2)
        for path, param in (("/sleep?level=invalid", "query.level"),
                            ("/sleep?level=-1", "query.level"),
                            ("/sleep?level=3", "query.level"),
                            ("/sleep?mode=invalid", "query.mode"),
                            ("/wake_up?tags=weight", "query.tags")):
            with self.subTest(path=path):
                self.assert_error(daemon.post(path), 400, "invalid_request_error", param=param)
        for engine in engines:
            self.assertEqual(engine.calls(), [])

    def test_a_weight_update_while_the_weights_sleep_is_409_and_reaches_no_engine(self):
        daemon, engines, _ = self.start_external(dp=2)
        self.assertEqual(daemon.post("/sleep?level=2").status_code, 200)
        before = [len(engine.calls()) for engine in engines]
        for path, body in (("/start_weight_update", None),
                           ("/update_weights", {"update_info": harness.update_info()}),
                           ("/finish_weight_update", {"weight_version": "step-1"})):
            with self.subTest(path=path):
                self.assert_error(daemon.post(path, json=body), 409, "weights_asleep",
                                  type_="conflict",
                                  message="the model weights are asleep on engine ranks 0, 1 "
                                          "(sleep level 2): POST /wake_up?tags=weights before a "
                                          "weight update")
        self.assertEqual([len(engine.calls()) for engine in engines], before)
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "default"})

    def test_the_colocated_order_reaches_the_engines_as_sent(self):
        daemon, engines, _ = self.start_external(dp=2)
        steps = [
            ("/init_weight_transfer_engine", {"init_info": harness.NCCL_INIT_INFO}, 200),
            ("/pause?mode=keep", None, 200),
            ("/sleep?level=1", None, 200),
            ("/start_weight_update", None, 409),  # still asleep: refused, reaches nothing
            ("/wake_up?tags=weights", None, 200),
            ("/start_weight_update", None, 200),
            ("/update_weights", {"update_info": harness.update_info()}, 200),
            ("/finish_weight_update", {"weight_version": "step-7"}, 200),
            ("/wake_up?tags=kv_cache", None, 200),
            ("/reset_prefix_cache", None, 200),
            ("/resume", None, 200),
        ]
        for path, body, status in steps:
            response = daemon.post(path, json=body) if body else daemon.post(path)
            self.assertEqual(response.status_code, status, f"{path}: {response.text}")
        expected = ["init_weight_transfer_engine", "pause_scheduler", "sleep", "wake_up", "start_weight_update",
                    "update_weights", "finish_weight_update", "set_weight_version", "wake_up",
                    "reset_prefix_cache", "resume_scheduler"]
        for engine in engines:
            with self.subTest(engine=engine.name):
                self.assertEqual(harness.call_names(engine.calls()), expected)
        self.assert_json(daemon.get("/weight_info"), 200, {"weight_version": "step-7"})
        self.assert_json(daemon.get("/is_sleeping"), 200, {"is_sleeping": False})

    def test_engines_that_disagree_on_is_sleeping_are_a_500(self):
        daemon, _, _ = self.start_external(dp=2, engine_extra={1: ["--inject-fail", "sleep"]})
        response = daemon.post("/sleep")
        self.assertEqual(response.status_code, 500, response.text)
        self.assertIn("asleep on engine rank 0: POST /wake_up wakes them",
                      response.json()["error"]["message"])
        self.assert_error(daemon.get("/is_sleeping"), 500, "server_error",
                          message="failed to call is_sleeping: the engines disagree (engine rank "
                                  "0: true, engine rank 1: false)")
        self.assertEqual(daemon.post("/start_weight_update").status_code, 409)
        self.assert_json(daemon.post("/wake_up"), 200, {"status": "awake", "tags_woken": None})
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)

    def test_release_kv_cache_memory_needs_a_paused_engine(self):
        daemon, _, _ = self.start_external(dp=1)
        response = daemon.post("/release_kv_cache_memory")
        self.assert_error(response, 500, "server_error")
        self.assertIn("release_kv_cache_memory() requires a completed pause first",
                      response.json()["error"]["message"])
        self.assertEqual(daemon.post("/pause").status_code, 200)
        self.assert_json(daemon.post("/release_kv_cache_memory"), 200,
                         {"status": "kv_cache_released"})
        # The KV cache alone sleeps: a weight update may run.
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update").status_code, 200)
        self.assert_json(daemon.post("/wake_up?tags=kv_cache"), 200,
                         {"status": "awake", "tags_woken": ["kv_cache"]})

    def test_metrics_show_the_sleep_state_and_vllms_operation_series(self):
        daemon, _, _ = self.start_external(dp=2, engine_extra={1: ["--inject-fail", "sleep"]})

        def state(rank, name):
            return daemon.metric(f'vllm:engine_sleep_state{{engine="{rank}",sleep_state="{name}"}}')

        def outcome(operation, status):
            return daemon.metric(
                f'vllm:rl_weight_update_operations_total{{operation="{operation}",status="{status}"}}')

        self.assertEqual((state(0, "awake"), state(1, "awake")), (1, 1))
        self.assertEqual(daemon.post("/sleep?level=2").status_code, 500)  # rank 1 refuses
        self.assertEqual((state(0, "discard_all"), state(0, "awake")), (1, 0))
        self.assertEqual((state(1, "awake"), state(1, "discard_all")), (1, 0))
        self.assertEqual(
            daemon.metric('vllm:sleep_mode_operation_duration_seconds_count{operation="sleep"}'), 1)
        self.assertEqual(daemon.post("/wake_up").status_code, 200)
        self.assertEqual(state(0, "awake"), 1)
        self.assertEqual(
            daemon.metric('vllm:sleep_mode_operation_duration_seconds_count{operation="wake"}'), 1)
        self.assertEqual(daemon.metric('vllm:sleep_mode_operations_in_flight{operation="wake"}'), 0)
        # vLLM's weight-update outcome counter: one success, then one engine failure.
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        self.assertEqual(daemon.post("/start_weight_update").status_code, 500)  # already active
        self.assertEqual((outcome("start", "success"), outcome("start", "error")), (1, 1))
        self.assertEqual(
            daemon.metric('vllm:rl_weight_update_operations_in_flight{operation="start"}'), 0)


if __name__ == "__main__":
    unittest.main()
