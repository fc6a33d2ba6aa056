"""What operators read: /metrics in Prometheus text format after a lifecycle, and log lines
with <N> priority prefixes (no timestamps) under journald, timestamps otherwise."""

import re
import unittest

import harness

METRIC = "vllm:rl_weight_update_operation_duration_seconds"


def samples(text):
    """{(name, frozenset(labels)): value} of every sample line."""
    found = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r'([^{\s]+)(?:\{([^}]*)\})? (\S+)', line)
        assert match, line
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        found[(match.group(1), labels)] = float(match.group(3))
    return found


class MetricsTest(harness.DaemonTestCase):
    def test_metrics_after_a_lifecycle(self):
        daemon = self.start_daemon(["--dev-mode"])
        daemon.wait_healthy()
        info = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2, 2]]}
        init = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
                "world_size": 2}
        self.assertEqual(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": init}).status_code, 200)
        self.assertEqual(daemon.post("/start_weight_update").status_code, 200)
        for _ in range(3):
            self.assertEqual(daemon.post("/update_weights", json={"update_info": info}).status_code, 200)
        self.assertEqual(daemon.post("/finish_weight_update",
                                     json={"weight_version": "s1"}).status_code, 200)
        # A rejected body never reaches the engine: no observation for it.
        self.assertEqual(daemon.post("/update_weights", json={"update_info": 1}).status_code, 400)

        response = daemon.get("/metrics")
        self.assertEqual(response.status_code, 200)
        self.assertTrue(response.headers["Content-Type"].startswith("text/plain; version=0.0.4"))
        text = response.text
        self.assertIn(f"# TYPE {METRIC} histogram", text)
        self.assertIn(f"# HELP {METRIC} ", text)
        values = samples(text)

        def count(operation):
            return values[(f"{METRIC}_count", frozenset({("operation", operation)}))]

        self.assertEqual(count("update"), 3)
        self.assertEqual(count("finish"), 1)
        self.assertEqual(count("set_version"), 1)
        self.assertEqual(count("start"), 1)
        self.assertEqual(count("init"), 1)
        self.assertEqual(count("start_draft"), 0)
        # Buckets are cumulative and end at +Inf == count.
        buckets = sorted(
            (float("inf") if dict(labels)["le"] == "+Inf" else float(dict(labels)["le"]), value)
            for (name, labels), value in values.items()
            if name == f"{METRIC}_bucket" and ("operation", "update") in labels)
        self.assertEqual(buckets[-1], (float("inf"), 3))
        self.assertEqual([v for _, v in buckets], sorted(v for _, v in buckets))
        self.assertGreater(values[(f"{METRIC}_sum", frozenset({("operation", "update")}))], 0)

        requests_total = values[("vllmd_http_requests_total",
                                 frozenset({("route", "/update_weights"), ("status", "200")}))]
        self.assertEqual(requests_total, 3)
        self.assertEqual(values[("vllmd_http_requests_total",
                                 frozenset({("route", "/update_weights"), ("status", "400")}))], 1)
        self.assertEqual(values[("vllmd_engine_up", frozenset({("rank", "0")}))], 1)
        for gauge in ("vllmd_http_connections", "vllmd_http_connections_queued",
                      "vllmd_http_connections_refused_total"):
            self.assertIn((gauge, frozenset()), values)

    def test_server_timing_splits_a_call_into_body_engine_and_vllmd_time(self):
        daemon, _, _ = self.start_external(engine_extra={0: ["--inject-delay",
                                                            "start_weight_update=0.3"]})
        response = daemon.post("/start_weight_update", json={})
        self.assertEqual(response.status_code, 200)
        timing = dict(re.fullmatch(r"(\w+);dur=([\d.]+)", part.strip()).groups()
                      for part in response.headers["Server-Timing"].split(","))
        self.assertEqual(sorted(timing), ["engine", "read", "vllmd"])
        self.assertGreaterEqual(float(timing["engine"]), 300)  # the injected delay
        self.assertGreater(float(timing["read"]), 0)  # "{}" was read
        self.assertLess(float(timing["vllmd"]), 100)
        # Nothing to split for a bodyless answer from vllmd itself.
        self.assertNotIn("Server-Timing", daemon.get("/health").headers)

    def test_engine_up_drops_to_zero_when_the_engine_dies(self):
        daemon, (engine,), _ = self.start_external()
        engine.kill()
        daemon.wait_unhealthy()
        values = samples(daemon.get("/metrics").text)
        self.assertEqual(values[("vllmd_engine_up", frozenset({("rank", "0")}))], 0)


class JournaldLoggingTest(harness.DaemonTestCase):
    def test_priority_prefixes_without_timestamps_under_journald(self):
        daemon = self.start_daemon(["--dev-mode"],
                                   env=harness.clean_env({"JOURNAL_STREAM": "8:12345"}))
        daemon.wait_healthy()
        daemon.get("/version")
        lines = [line for line in daemon.log().splitlines() if line]
        self.assertTrue(lines)
        for line in lines:
            self.assertRegex(line, r"^<[0-7]>\S")
            self.assertNotRegex(line, r"^<\d>\d{4}-\d\d-\d\dT")
        self.assertTrue(any(line.startswith("<4>dev mode is on") for line in lines), lines)
        self.assertTrue(any(line.startswith("<6>127.0.0.1 GET /version 200") for line in lines), lines)

    def test_timestamps_elsewhere(self):
        daemon = self.start_daemon(["--dev-mode"])
        daemon.wait_healthy()
        first = daemon.log().splitlines()[0]
        self.assertRegex(first, r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z vllmd \w+: ")


if __name__ == "__main__":
    unittest.main()
