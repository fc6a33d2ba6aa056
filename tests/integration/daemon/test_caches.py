"""The cache resets (docs/http-api.md, dev-mode routes): POST /reset_prefix_cache,
/reset_mm_cache and /reset_encoder_cache reach every engine with vLLM's utility call and
arguments (as the reference engine records them), answer with the Rust frontend's bodies,
refuse a bad query flag before any engine sees it, and report an engine's failure."""

import unittest

import harness


class CacheResetTest(harness.DaemonTestCase):

    def test_each_reset_reaches_every_engine_with_vllms_arguments(self):
        daemon, engines, _ = self.start_external(dp=2)
        self.assert_json(daemon.post("/reset_prefix_cache"), 200, {"success": True})
        # What Python's requests sends for params={"reset_running_requests": True}.
        self.assert_json(daemon.post("/reset_prefix_cache?reset_running_requests=True"), 200,
                         {"success": True})
        self.assert_json(daemon.post("/reset_prefix_cache?reset_external=true"), 200,
                         {"success": True})
        for path in ("/reset_mm_cache", "/reset_encoder_cache"):
            response = daemon.post(path)
            self.assertEqual(response.status_code, 200, response.text)
            self.assertEqual(response.content, b"", f"{path}: vLLM answers an empty body")
        expected = [
            ("reset_prefix_cache", [False, False]),
            ("reset_prefix_cache", [True, False]),
            ("reset_prefix_cache", [False, True]),
            ("reset_mm_cache", []),
            ("reset_encoder_cache", []),
        ]
        for engine in engines:
            with self.subTest(engine=engine.name):
                self.assertEqual(harness.wire(engine.calls()), expected)

    def test_a_flag_that_is_not_a_boolean_is_400_and_reaches_no_engine(self):
        daemon, engines, _ = self.start_external(dp=2)
        for query in ("reset_running_requests=maybe", "reset_external=2"):
            with self.subTest(query=query):
                self.assert_error(daemon.post(f"/reset_prefix_cache?{query}"), 400,
                                  "invalid_request_error", param=query.split("=")[0])
        for engine in engines:
            self.assertEqual(engine.calls(), [])

    def test_running_requests_make_the_reset_decline_on_their_engine_only(self):
        # Rank 1 has requests holding blocks: the AND over engines is false, still a 200.
        daemon, _, _ = self.start_external(dp=2, engine_extra={1: ["--running-requests", "4"]})
        self.assert_json(daemon.post("/reset_prefix_cache"), 200, {"success": False})
        self.assert_json(daemon.post("/reset_prefix_cache?reset_running_requests=true"), 200,
                         {"success": True})
        # A pause that keeps them changes nothing; one that aborts them frees the blocks.
        self.assertEqual(daemon.post("/pause?mode=keep").status_code, 200)
        self.assert_json(daemon.post("/reset_prefix_cache"), 200, {"success": False})
        self.assertEqual(daemon.post("/pause?mode=abort").status_code, 200)
        self.assert_json(daemon.post("/reset_prefix_cache"), 200, {"success": True})

    def test_an_engine_that_fails_the_reset_is_a_500_naming_its_rank(self):
        daemon, _, _ = self.start_external(
            dp=2, engine_extra={1: ["--inject-fail", "reset_mm_cache"]})
        response = daemon.post("/reset_mm_cache")
        self.assertEqual(response.status_code, 500, response.text)
        self.assertIn("rank 1", response.json()["error"]["message"])


if __name__ == "__main__":
    unittest.main()
