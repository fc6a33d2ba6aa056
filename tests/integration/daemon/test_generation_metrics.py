"""GET /metrics after a known workload: vLLM's generation metrics with its names and labels
(`engine`, `model_name`), and vllmd's per-engine load and aborts by cause
(daemon/generation_metrics.cpp). Real vllmd and vllm-ref-engine processes, DP = 2, each request
pinned to its engine so every expected count is known."""

import threading
import time

from harness import wait_until
from test_generate import GenerateTestCase, body


def labels(engine):
    return f'engine="{engine}",model_name="default"'


class GenerationMetrics(GenerateTestCase):
    def test_counts_after_a_known_workload(self):
        daemon, engines = self.start(dp=2)
        # Engine 0: three requests of 3, 4 and 5 prompt tokens, 5, 6 and 7 tokens each.
        for size, tokens in ((3, 5), (4, 6), (5, 7)):
            response = self.generate(daemon, body(list(range(1, size + 1)), max_tokens=tokens,
                                                  ignore_eos=True),
                                     headers={"X-data-parallel-rank": "0"})
            self.assertEqual(response.status_code, 200, response.text)
        # Engine 1: n = 2 choices of 4 tokens from a 2-token prompt (two engine requests).
        response = self.generate(daemon, body([1, 2], max_tokens=4, n=2, ignore_eos=True),
                                 headers={"X-data-parallel-rank": "1"})
        self.assertEqual(response.status_code, 200, response.text)
        # Engine 1: one aborted by /abort_requests.
        result = {}
        thread = threading.Thread(target=lambda: result.update(response=self.generate(
            daemon, body([3], max_tokens=100000, ignore_eos=True),
            headers={"X-data-parallel-rank": "1", "X-Request-Id": "gone"})))
        thread.start()
        self.wait_for(engines[1], "ADD", 3)
        time.sleep(0.1)
        daemon.post("/abort_requests", json={"request_ids": ["gone"]})
        thread.join(10)
        self.assertEqual(result["response"].json()["choices"][0]["finish_reason"], "abort")
        # Engine 0: one whose client leaves mid-stream.
        stream = self.generate(daemon, {**body([4], max_tokens=100000, ignore_eos=True),
                                        "stream": True},
                               headers={"X-data-parallel-rank": "0"}, stream=True)
        next(stream.iter_lines())
        stream.close()
        wait_until(lambda: daemon.metric("vllmd_generations_in_flight") == 0, 5,
                   message="the stream's end")

        metric = daemon.metric
        self.assertEqual(metric(f"vllm:prompt_tokens_total{{{labels(0)}}}"), 3 + 4 + 5 + 1)
        self.assertEqual(metric(f"vllm:prompt_tokens_total{{{labels(1)}}}"), 2 + 2 + 1)
        self.assertEqual(metric(f'vllm:request_success_total{{{labels(0)},finished_reason="length"}}'), 3)
        self.assertEqual(metric(f'vllm:request_success_total{{{labels(0)},finished_reason="abort"}}'), 1)
        self.assertEqual(metric(f'vllm:request_success_total{{{labels(1)},finished_reason="length"}}'), 2)
        self.assertEqual(metric(f'vllm:request_success_total{{{labels(1)},finished_reason="abort"}}'), 1)
        self.assertEqual(metric(f'vllm:request_success_total{{{labels(0)},finished_reason="stop"}}'), 0)
        generated_0 = metric(f"vllm:generation_tokens_total{{{labels(0)}}}")
        self.assertGreater(generated_0, 18)  # 18 plus the left stream's
        generated_1 = metric(f"vllm:generation_tokens_total{{{labels(1)}}}")
        # 8, plus the aborted request's tokens, every one of which its answer returned.
        aborted_tokens = len(result["response"].json()["choices"][0]["token_ids"])
        self.assertEqual(generated_1, 8 + aborted_tokens)
        self.assertEqual(generated_0 + generated_1, metric("vllmd_generation_tokens_total"))
        # One time to first token and one end-to-end latency per engine request.
        self.assertEqual(metric(f"vllm:time_to_first_token_seconds_count{{{labels(0)}}}"), 4)
        self.assertEqual(metric(f"vllm:time_to_first_token_seconds_count{{{labels(1)}}}"), 3)
        self.assertEqual(metric(f"vllm:e2e_request_latency_seconds_count{{{labels(0)}}}"), 4)
        self.assertEqual(metric(
            f'vllm:e2e_request_latency_seconds_bucket{{{labels(1)},le="+Inf"}}'), 3)
        # A token per engine step: a gap between each output and the one before.
        gaps_1 = metric(f"vllm:inter_token_latency_seconds_count{{{labels(1)}}}")
        self.assertEqual(gaps_1, generated_1 - 3)
        self.assertGreater(metric(f"vllm:inter_token_latency_seconds_sum{{{labels(1)}}}"), 0)
        self.assertEqual(metric('vllmd_generation_aborts_total{cause="abort_requests"}'), 1)
        self.assertEqual(metric('vllmd_generation_aborts_total{cause="client_gone"}'), 1)
        self.assertEqual(metric('vllmd_generation_aborts_total{cause="engine"}'), 0)
        for engine in (0, 1):
            self.assertEqual(metric(f'vllmd_engine_requests_in_flight{{engine="{engine}"}}'), 0)
            self.assertGreaterEqual(metric(f"vllm:num_requests_running{{{labels(engine)}}}"), 0)
            self.assertGreaterEqual(metric(f"vllm:num_requests_waiting{{{labels(engine)}}}"), 0)

    def test_running_and_waiting_count_the_engines_batch_and_queue(self):
        # Two run at a time: of three requests, two run and one waits.
        daemon, engines = self.start(dp=2, engine_flags=["--step-ms", "20", "--max-num-seqs", "2"])
        threads = [threading.Thread(target=self.generate, args=(
            daemon, body([i + 1], max_tokens=100000, ignore_eos=True)),
            kwargs={"headers": {"X-data-parallel-rank": "0", "X-Request-Id": f"long-{i}"}})
            for i in range(3)]
        for thread in threads:
            thread.start()
        running = f"vllm:num_requests_running{{{labels(0)}}}"
        waiting = f"vllm:num_requests_waiting{{{labels(0)}}}"
        wait_until(lambda: (daemon.metric(running), daemon.metric(waiting)) == (2, 1), 10,
                   message="2 running and 1 waiting on engine 0")
        self.assertEqual(daemon.metric(f"vllm:num_requests_running{{{labels(1)}}}"), 0)
        self.assertEqual(daemon.metric('vllmd_engine_requests_in_flight{engine="0"}'), 3)
        # The load score the DP balance and the session bound use: 3 in flight, 1 waiting ×4.
        self.assertEqual(daemon.metric('vllmd_engine_load_score{engine="0"}'), 6)
        self.assertEqual(daemon.metric('vllmd_engine_load_score{engine="1"}'), 0)
        daemon.post("/abort_requests", json={"request_ids": [f"long-{i}" for i in range(3)]})
        for thread in threads:
            thread.join(10)
        # The engine's last step after the aborts says so: nothing runs or waits any more.
        wait_until(lambda: (daemon.metric(running), daemon.metric(waiting)) == (0, 0), 10,
                   message="engine 0 idle")
        self.assertEqual(daemon.metric('vllmd_engine_requests_in_flight{engine="0"}'), 0)
        self.assertEqual(daemon.metric('vllmd_engine_load_score{engine="0"}'), 0)

    def test_an_engine_abort_by_pause_counts_under_cause_engine(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        result = {}
        thread = threading.Thread(target=lambda: result.update(response=self.generate(
            daemon, body([9], max_tokens=100000, ignore_eos=True))))
        thread.start()
        self.wait_for(engine, "ADD")
        time.sleep(0.1)
        self.assertEqual(daemon.post("/pause", params={"mode": "abort"}).status_code, 200)
        thread.join(10)
        self.assertEqual(daemon.post("/resume").status_code, 200)
        self.assertEqual(result["response"].json()["choices"][0]["finish_reason"], "abort")
        self.assertEqual(daemon.metric('vllmd_generation_aborts_total{cause="engine"}'), 1)
        self.assertEqual(daemon.metric(
            f'vllm:request_success_total{{{labels(0)},finished_reason="abort"}}'), 1)
