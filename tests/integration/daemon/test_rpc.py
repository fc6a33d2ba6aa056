"""POST /collective_rpc through vllmd (docs/http-api.md, dev-mode routes): the body's JSON
reaches every engine as collective_rpc [method, timeout, args, kwargs] without loss (as the
reference engine records it), the results come back as vLLM's Rust frontend returns them
(every engine's per-worker list, concatenated in rank order), a bad body reaches no engine,
and a worker's exception is a 500 in the worker's words."""

import unittest

import harness


class CollectiveRpcTest(harness.DaemonTestCase):

    def test_arguments_reach_every_engine_and_the_results_come_back_concatenated(self):
        daemon, engines, _ = self.start_external(dp=2)
        body = {"method": "echo_args_kwargs", "args": ["arg1", "arg2"],
                "kwargs": {"key1": "value1", "key2": {"n": [1, 2.5, True, None]}},
                "timeout": 1.5}
        response = daemon.post("/collective_rpc", json=body)
        self.assertEqual(response.status_code, 200, response.text)
        one = {"args": ["arg1", "arg2"],
               "kwargs": {"key1": "value1", "key2": {"n": [1, 2.5, True, None]}},
               "total_items": 4}
        self.assertEqual(response.json(), {"results": [one, one]})
        expected = [("collective_rpc", ["echo_args_kwargs", 1.5, ["arg1", "arg2"],
                                        {"key1": "value1", "key2": {"n": [1, 2.5, True, None]}}])]
        for engine in engines:
            with self.subTest(engine=engine.name):
                self.assertEqual(harness.wire(engine.calls()), expected)

    def test_defaults_and_an_integer_timeout_sent_as_a_float(self):
        daemon, engines, _ = self.start_external(dp=1)
        response = daemon.post("/collective_rpc", json={"method": "echo_args_kwargs",
                                                        "timeout": 900})
        self.assert_json(response, 200, {"results": [{"args": [], "kwargs": {},
                                                      "total_items": 0}]})
        [call] = engines[0].calls()
        self.assertEqual(call["args"], ["echo_args_kwargs", 900.0, [], {}])
        self.assertIsInstance(call["args"][1], float)

    def test_a_bad_body_is_400_and_reaches_no_engine(self):
        daemon, engines, _ = self.start_external(dp=2)
        for body, param in (({"args": []}, "method"), ({"method": "m", "args": "ab"}, "args"),
                            ({"method": "m", "kwargs": [1]}, "kwargs"),
                            ({"method": "m", "timeout": "5"}, "timeout")):
            with self.subTest(body=body):
                self.assert_error(daemon.post("/collective_rpc", json=body), 400,
                                  "invalid_request_error", param=param)
        self.assert_error(daemon.post("/collective_rpc", data=b"{"), 400, "json_parse_error")
        for engine in engines:
            self.assertEqual(engine.calls(), [])

    def test_a_worker_exception_is_a_500_in_its_words(self):
        daemon, _, _ = self.start_external(dp=1)
        response = daemon.post("/collective_rpc", json={"method": "load_model"})
        self.assert_error(response, 500, "server_error")
        self.assertIn("'Worker' object has no attribute 'load_model'",
                      response.json()["error"]["message"])


if __name__ == "__main__":
    unittest.main()
