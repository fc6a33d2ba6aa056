"""Generation end to end: real vllmd and vllm-ref-engine processes, each test written as an RL
client's call (SkyRL, prime-rl and vime post to /inference/v1/generate; docs/http-api.md §9).

The reference engine's tokens are predicted with support/ref_tokens.py, so every token id in
an answer is checked against the weights the engine holds."""

import json
import os
import socket
import threading
import time
import unittest

import requests

from harness import HOST, DaemonTestCase, wait_until
import ref_tokens

GENERATE = "/inference/v1/generate"


def body(prompt, max_tokens=8, seed=7, **sampling):
    return {"token_ids": prompt, "sampling_params": {"max_tokens": max_tokens, "seed": seed,
                                                     **sampling}}


def sse_events(response):
    """The data payloads of an SSE response, as text, in order ([DONE] included)."""
    events = []
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            events.append(line[len("data: "):])
    return events


def records(engine, method):
    """The engine's ADDs (as dicts of the fields tests read) or ABORTs (their ids), in order."""
    found = [call for call in engine.calls() if call["method"] == method]
    if method == "ABORT":
        return [{"request_ids": call["args"]} for call in found]
    if method == "ADD":
        # EngineCoreRequest positions of the "2025" layout, which vllmd sends to the reference
        # engine's version 0.0.0 (docs/engine-protocol.md §10).
        return [{"request_id": args[0], "prompt_token_ids": args[1], "sampling_params": args[3],
                 "external_req_id": args[15] if len(args) > 15 else None}
                for args in (call["args"] for call in found)]
    return found


class RawClient:
    """A client on a plain socket, so a test controls when it reads and how it leaves."""

    def __init__(self, port, payload, headers=(), rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((HOST, port))
        data = json.dumps(payload).encode()
        head = (f"POST {GENERATE} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n")
        for name, value in headers:
            head += f"{name}: {value}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + data)

    def read_some(self, size=65536, timeout=10):
        self.sock.settimeout(timeout)
        return self.sock.recv(size)

    def half_close(self):
        self.sock.shutdown(socket.SHUT_WR)

    def close(self):
        self.sock.close()


class GenerateTestCase(DaemonTestCase):
    def start(self, dp=1, engine_flags=(), daemon_args=()):
        step = [] if "--step-ms" in engine_flags else ["--step-ms", "5"]
        flags = {rank: [*step, *engine_flags] for rank in range(dp)}
        daemon, engines, _ = self.start_external(dp=dp, engine_extra=flags,
                                                 daemon_args=daemon_args)
        return daemon, engines

    def generate(self, daemon, payload, **kwargs):
        return daemon.post(GENERATE, json=payload, **kwargs)

    def wait_for(self, engine, method, count=1, timeout=5):
        wait_until(lambda: len(records(engine, method)) >= count, timeout,
                   message=f"{count} {method} on {engine.name}")
        return records(engine, method)


class PlainAndStreamed(GenerateTestCase):
    def test_plain_answer_in_the_python_shape_with_the_engines_tokens(self):
        daemon, (engine,) = self.start()
        prompt = [101, 102, 103]
        response = self.generate(daemon, body(prompt, max_tokens=6), headers={"X-Request-Id": "r1"})
        self.assertEqual(response.status_code, 200, response.text)
        answer = response.json()
        self.assertEqual(answer["request_id"], "generate-tokens-r1")
        self.assertEqual(answer["model"], "default")
        choice, = answer["choices"]
        self.assertEqual(choice["token_ids"], ref_tokens.tokens(prompt, 6, seed=7))
        self.assertEqual(choice["finish_reason"], "length")
        self.assertIsNone(choice["stop_reason"])
        self.assertIsNone(choice["logprobs"])
        self.assertEqual(answer["usage"]["prompt_tokens"], 3)
        self.assertEqual(answer["usage"]["completion_tokens"], 6)
        self.assertEqual(answer["usage"]["total_tokens"], 9)
        self.assertIn("cached_tokens", answer["usage"]["prompt_tokens_details"])
        self.assertEqual(answer["prompt_token_ids"], prompt)
        # The engine got one ADD with a unique id of its own and the client's as external id.
        add, = records(engine, "ADD")
        self.assertTrue(add["request_id"].startswith("generate-tokens-r1-"), add)
        self.assertEqual(add["external_req_id"], "generate-tokens-r1")
        self.assertEqual(add["prompt_token_ids"], prompt)
        self.assertIn("tokens=6", daemon.log())
        # Counted once, at its end.
        self.assertEqual(daemon.metric("vllmd_generation_tokens_total"), 6)
        self.assertEqual(daemon.metric("vllmd_time_to_first_token_seconds_count"), 1)
        self.assertEqual(daemon.metric("vllmd_generations_in_flight"), 0)

    def test_streamed_deltas_terminal_chunk_usage_and_done(self):
        daemon, _ = self.start()
        prompt = [5, 6]
        payload = {**body(prompt, max_tokens=10), "stream": True,
                   "stream_options": {"include_usage": True}}
        with self.generate(daemon, payload, stream=True) as response:
            self.assertEqual(response.status_code, 200)
            self.assertTrue(response.headers["Content-Type"].startswith("text/event-stream"))
            events = sse_events(response)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(event) for event in events[:-1]]
        usage = chunks.pop()
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"]["completion_tokens"], 10)
        streamed = [t for chunk in chunks for t in chunk["choices"][0]["token_ids"]]
        self.assertEqual(streamed, ref_tokens.tokens(prompt, 10, seed=7))
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")
        self.assertTrue(all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1]))
        self.assertGreater(len(chunks), 1)  # one event per step, not one at the end


class Logprobs(GenerateTestCase):
    def check_logprobs(self, threshold):
        daemon, _ = self.start(engine_flags=["--zero-copy-threshold", str(threshold)])
        prompt = [1, 2, 3]
        payload = body(prompt, max_tokens=5, logprobs=3, prompt_logprobs=2)
        response = self.generate(daemon, payload)
        self.assertEqual(response.status_code, 200, response.text)
        answer = response.json()
        choice = answer["choices"][0]
        content = choice["logprobs"]["content"]
        self.assertEqual([item["token"] for item in content],
                         [f"token_id:{t}" for t in choice["token_ids"]])
        for item, token in zip(content, choice["token_ids"]):
            self.assertEqual(item["logprob"], -0.5)
            self.assertEqual([top["token"] for top in item["top_logprobs"]][0], f"token_id:{token}")
            self.assertEqual(len(item["top_logprobs"]), 3)
            self.assertEqual([top["logprob"] for top in item["top_logprobs"]], [-0.5, -1.0, -1.5])
        prompt_logprobs = answer["prompt_logprobs"]
        self.assertIsNone(prompt_logprobs[0])
        self.assertEqual(len(prompt_logprobs), len(prompt))
        for position, entry in zip(prompt[1:], prompt_logprobs[1:]):
            self.assertEqual(list(entry)[0], str(position))
            self.assertEqual(entry[str(position)]["decoded_token"], f"token_id:{position}")

    def test_logprobs_inline(self):
        self.check_logprobs(threshold=1 << 20)

    def test_logprobs_in_extra_frames(self):
        self.check_logprobs(threshold=1)


class ModelDirectory(GenerateTestCase):
    def model_dir(self, eos, max_new_tokens=None):
        path = os.path.join(self.workdir, "model")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as handle:
            json.dump({"vocab_size": 32000, "eos_token_id": eos}, handle)
        generation = {"eos_token_id": eos}
        if max_new_tokens:
            generation["max_new_tokens"] = max_new_tokens
        with open(os.path.join(path, "generation_config.json"), "w") as handle:
            json.dump(generation, handle)
        return path

    def test_eos_from_the_model_ends_generation_with_stop(self):
        prompt = [11, 12]
        expected = ref_tokens.tokens(prompt, 10, seed=3)
        eos = expected[3]
        daemon, _ = self.start(daemon_args=["--model", self.model_dir(eos)])
        self.assertIn("EOS ids " + str(eos), daemon.log())
        answer = self.generate(daemon, body(prompt, max_tokens=10, seed=3)).json()
        choice = answer["choices"][0]
        self.assertEqual(choice["finish_reason"], "stop")
        self.assertIsNone(choice["stop_reason"])  # EOS, not a stop id
        self.assertEqual(choice["token_ids"], expected[:4])
        # ignore_eos runs to max_tokens.
        answer = self.generate(daemon, body(prompt, max_tokens=10, seed=3, ignore_eos=True)).json()
        self.assertEqual(answer["choices"][0]["token_ids"], expected)

    def test_max_new_tokens_when_the_request_sets_no_max_tokens(self):
        daemon, _ = self.start(daemon_args=["--model", self.model_dir(eos=31999, max_new_tokens=4)])
        answer = self.generate(daemon, {"token_ids": [1], "sampling_params": {"seed": 1}}).json()
        self.assertEqual(answer["choices"][0]["finish_reason"], "length")
        self.assertEqual(len(answer["choices"][0]["token_ids"]), 4)

    def test_without_a_model_vllmd_says_so_at_start(self):
        daemon, _ = self.start()
        self.assertIn("no model directory", daemon.log())


class Validation(GenerateTestCase):
    def test_every_validation_error_is_a_400_naming_its_parameter_and_reaches_no_engine(self):
        path = os.path.join(self.workdir, "model")
        os.makedirs(path)
        with open(os.path.join(path, "config.json"), "w") as handle:
            json.dump({"vocab_size": 1000, "eos_token_id": 2}, handle)
        daemon, (engine,) = self.start(daemon_args=["--model", path])
        cases = [
            ({"token_ids": [], "sampling_params": {}}, "token_ids"),
            ({"token_ids": [-1], "sampling_params": {}}, "token_ids"),
            ({"token_ids": [1000], "sampling_params": {}}, "token_ids"),
            ({"token_ids": [1], "sampling_params": {"max_tokens": 0}}, "sampling_params.max_tokens"),
            ({"token_ids": [1] * 4096, "sampling_params": {}}, "token_ids"),
            ({"token_ids": [1], "sampling_params": {"temperature": -1}},
             "sampling_params.temperature"),
            ({"token_ids": [1], "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
            ({"token_ids": [1], "sampling_params": {"n": 0}}, "sampling_params.n"),
            ({"token_ids": [1], "sampling_params": {"stop": ["</s>"]}}, "sampling_params.stop"),
        ]
        for payload, param in cases:
            with self.subTest(param=param, payload=str(payload)[:80]):
                response = self.generate(daemon, payload)
                self.assertEqual(response.status_code, 400, response.text)
                self.assertEqual(response.json()["error"]["param"], param, response.text)
        response = self.generate(daemon, {"model": "other", "token_ids": [1],
                                          "sampling_params": {}})
        self.assertEqual(response.status_code, 404)
        response = self.generate(daemon, body([1]), headers={"X-data-parallel-rank": "1"})
        self.assertEqual(response.status_code, 400)
        self.assertEqual(response.json()["error"]["param"], "X-data-parallel-rank")
        # Unknown and detokenizer-only keys are accepted and ignored.
        response = self.generate(daemon, body([1], max_tokens=2, top_k=-1, return_token_ids=True,
                                              skip_special_tokens=False, detokenize=False))
        self.assertEqual(response.status_code, 200, response.text)
        self.assertEqual(len(records(engine, "ADD")), 1)


class Disconnects(GenerateTestCase):
    def check_abort_within_a_second(self, stream, half_close):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        payload = {**body([1, 2], max_tokens=100000, ignore_eos=True), "stream": stream}
        client = RawClient(daemon.port, payload)
        self.wait_for(engine, "ADD")
        if stream:
            self.assertIn(b"200", client.read_some())
        left = time.monotonic()
        if half_close:
            client.half_close()
        else:
            client.close()
        abort, = self.wait_for(engine, "ABORT", timeout=1)
        self.assertLess(time.monotonic() - left, 1.0)
        self.assertEqual(abort["request_ids"], [records(engine, "ADD")[0]["request_id"]])
        wait_until(lambda: " 499 " in daemon.log(), 2, message="the 499 in the access log")
        client.close()

    def test_plain_client_closes(self):
        self.check_abort_within_a_second(stream=False, half_close=False)

    def test_plain_client_half_closes(self):
        self.check_abort_within_a_second(stream=False, half_close=True)

    def test_streaming_client_closes(self):
        self.check_abort_within_a_second(stream=True, half_close=False)

    def test_streaming_client_half_closes(self):
        self.check_abort_within_a_second(stream=True, half_close=True)

    def test_a_reader_of_one_byte_a_second_is_cut_at_the_limit_and_memory_stays_bounded(self):
        # 64 tokens a millisecond with 20 logprobs each: about 70 MB/s of events for a client
        # that reads one byte a second through a 4 KiB receive buffer.
        daemon, (engine,) = self.start(engine_flags=[
            "--step-ms", "1", "--tokens-per-step", "64", "--max-model-len", "10000000"])
        rss_before = daemon_rss(daemon)
        peak = [rss_before]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], daemon_rss(daemon))
                time.sleep(0.01)
        sampler = threading.Thread(target=sample)
        sampler.start()
        payload = {**body([1], max_tokens=5000000, ignore_eos=True, logprobs=20), "stream": True}
        client = RawClient(daemon.port, payload, rcvbuf=4096)
        try:
            add, = self.wait_for(engine, "ADD")
            deadline = time.monotonic() + 30
            while not records(engine, "ABORT") and time.monotonic() < deadline:
                client.read_some(1)
                time.sleep(1)
            abort, = self.wait_for(engine, "ABORT", timeout=1)
            self.assertEqual(abort["request_ids"], [add["request_id"]])
            wait_until(lambda: " 499 " in daemon.log(), 2, message="the 499 in the access log")
        finally:
            done.set()
            sampler.join()
            client.close()
        # At most the 8 MiB limit of merged deltas and unsent bytes, plus what ZeroMQ holds
        # for vllmd when its IO thread lags this 1 ms engine (the output socket's receive queue,
        # at most its high-water mark of 1,000 steps of 64 tokens with 21 logprobs each), plus
        # allocator slack: 13-15 MiB alone, 39-40 MiB under ctest -j8 on 2 cores, 975 MiB
        # without the limit. Under ASan freed memory sits in its quarantine (256 MiB) instead of
        # being reused, so RSS says nothing there; the cut above is still checked.
        if "ASAN_OPTIONS" not in os.environ:
            grown = peak[0] - rss_before
            self.assertLess(grown, 64 << 20, f"RSS grew by {grown >> 20} MiB")


def daemon_rss(daemon):
    with open(f"/proc/{daemon.pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Pause(GenerateTestCase):
    def stream_in_thread(self, daemon, payload, results, key):
        def run():
            with self.generate(daemon, {**payload, "stream": True}, stream=True) as response:
                results[key] = sse_events(response)
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def test_pause_abort_ends_requests_with_their_tokens_and_abort(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        results = {}
        plain = {}

        def run_plain():
            plain["answer"] = self.generate(daemon, body([9], max_tokens=100000,
                                                        ignore_eos=True)).json()
        threads = [threading.Thread(target=run_plain),
                   self.stream_in_thread(daemon, body([8], max_tokens=100000, ignore_eos=True),
                                         results, "stream")]
        threads[0].start()
        self.wait_for(engine, "ADD", count=2)
        time.sleep(0.2)  # some tokens
        self.assertEqual(daemon.post("/pause", params={"mode": "abort"}).status_code, 200)
        for thread in threads:
            thread.join(10)
        choice = plain["answer"]["choices"][0]
        self.assertEqual(choice["finish_reason"], "abort")
        self.assertGreater(len(choice["token_ids"]), 0)
        self.assertEqual(choice["token_ids"], ref_tokens.tokens([9], len(choice["token_ids"]), 7))
        events = results["stream"]
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(json.loads(events[-2])["choices"][0]["finish_reason"], "abort")
        # A request arriving while paused waits, and runs after /resume.
        late = {}
        waiter = threading.Thread(target=lambda: late.update(
            answer=self.generate(daemon, body([7], max_tokens=3)).json()))
        waiter.start()
        self.wait_for(engine, "ADD", count=3)
        time.sleep(0.5)
        self.assertNotIn("answer", late)
        self.assertEqual(daemon.post("/resume").status_code, 200)
        waiter.join(10)
        self.assertEqual(late["answer"]["choices"][0]["token_ids"], ref_tokens.tokens([7], 3, 7))

    def test_pause_keep_freezes_requests_and_they_finish_after_resume(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        result = {}
        thread = threading.Thread(target=lambda: result.update(
            answer=self.generate(daemon, body([4], max_tokens=40)).json()))
        thread.start()
        self.wait_for(engine, "ADD")
        time.sleep(0.1)
        self.assertEqual(daemon.post("/pause", params={"mode": "keep"}).status_code, 200)
        time.sleep(1.2)  # 40 tokens at 20 ms would be done by now
        self.assertNotIn("answer", result)
        self.assertEqual(daemon.post("/resume").status_code, 200)
        thread.join(10)
        choice = result["answer"]["choices"][0]
        self.assertEqual(choice["finish_reason"], "length")
        self.assertEqual(choice["token_ids"], ref_tokens.tokens([4], 40, 7))

    def test_pause_wait_answers_once_requests_drained(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        result = {}
        thread = threading.Thread(target=lambda: result.update(
            answer=self.generate(daemon, body([4], max_tokens=25)).json()))
        thread.start()
        self.wait_for(engine, "ADD")
        added = time.monotonic()
        response = daemon.post("/pause", params={"mode": "wait"})
        self.assertEqual(response.status_code, 200)
        # 25 tokens at one per 20 ms step: the pause answered only once they were out.
        self.assertGreater(time.monotonic() - added, 0.4)
        thread.join(2)
        self.assertEqual(result["answer"]["choices"][0]["finish_reason"], "length")
        self.assertEqual(len(result["answer"]["choices"][0]["token_ids"]), 25)
        self.assertEqual(daemon.post("/resume").status_code, 200)


class EngineLossAndStop(GenerateTestCase):
    def test_kill_9_of_one_engine_ends_its_streams_with_an_error_the_other_finishes(self):
        daemon, engines = self.start(dp=2, engine_flags=["--step-ms", "20"])
        results = {}
        threads = []
        for rank in (0, 1):
            payload = {**body([rank + 1], max_tokens=100 if rank else 100000, ignore_eos=True),
                       "stream": True}

            def run(rank=rank, payload=payload):
                with self.generate(daemon, payload, stream=True,
                                   headers={"X-data-parallel-rank": str(rank)}) as response:
                    results[rank] = sse_events(response)
                    results[f"{rank}-at"] = time.monotonic()
            threads.append(threading.Thread(target=run))
            threads[-1].start()
        for engine in engines:
            self.wait_for(engine, "ADD")
        time.sleep(0.2)
        killed = time.monotonic()
        engines[0].kill()
        for thread in threads:
            thread.join(15)
        lost = results[0]
        self.assertEqual(lost[-1], "[DONE]")
        self.assertIn("error", json.loads(lost[-2]))
        self.assertLess(results["0-at"] - killed, 1.0)
        kept = results[1]
        self.assertEqual(json.loads(kept[-2])["choices"][0]["finish_reason"], "length")
        streamed = [t for e in kept[:-1] for t in json.loads(e)["choices"][0]["token_ids"]]
        self.assertEqual(streamed, ref_tokens.tokens([2], 100, 7))

    def test_stop_aborts_streams_in_flight_then_drains(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        results = {}

        def run():
            payload = {**body([3], max_tokens=100000, ignore_eos=True), "stream": True}
            with self.generate(daemon, payload, stream=True) as response:
                results["events"] = sse_events(response)
        thread = threading.Thread(target=run)
        thread.start()
        self.wait_for(engine, "ADD")
        time.sleep(0.2)
        started = time.monotonic()
        daemon.stop()
        thread.join(10)
        self.assertLess(time.monotonic() - started, 10)
        events = results["events"]
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(json.loads(events[-2])["choices"][0]["finish_reason"], "abort")


class EngineErrors(GenerateTestCase):
    def test_a_request_the_engine_ends_with_error_is_a_500_or_an_error_event(self):
        daemon, _ = self.start(engine_flags=["--inject-fail", "generate"])
        response = self.generate(daemon, body([1], max_tokens=4))
        self.assert_error(response, 500, "server_error", message="Internal server error")
        with self.generate(daemon, {**body([1], max_tokens=4), "stream": True},
                           stream=True) as response:
            self.assertEqual(response.status_code, 200)
            events = sse_events(response)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(json.loads(events[-2]),
                         {"error": {"message": "Internal server error",
                                    "type": "InternalServerError", "param": None, "code": 500}})


class DataParallel(GenerateTestCase):
    def test_requests_spread_over_ranks_and_the_header_pins_one(self):
        daemon, engines = self.start(dp=2, engine_flags=["--step-ms", "20"])
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            self.generate(daemon, body([i], max_tokens=10)).status_code)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        self.assertEqual(results, [200] * 8)
        counts = [len(records(engine, "ADD")) for engine in engines]
        self.assertEqual(sum(counts), 8)
        self.assertGreaterEqual(min(counts), 2, counts)
        for rank in (0, 1):
            before = len(records(engines[rank], "ADD"))
            response = self.generate(daemon, body([5], max_tokens=2),
                                     headers={"X-data-parallel-rank": str(rank)})
            self.assertEqual(response.status_code, 200)
            self.assertEqual(len(records(engines[rank], "ADD")), before + 1)


class WithoutDevMode(GenerateTestCase):
    def test_the_rollout_routes_serve_and_the_control_plane_does_not(self):
        # The embedded engine, as `vllmd` runs with no flags: rollouts need no dev mode.
        daemon = self.launch_daemon([])
        daemon.wait_healthy()
        answer = self.generate(daemon, body([1, 2, 3], max_tokens=3))
        self.assertEqual(answer.status_code, 200, answer.text)
        self.assertEqual(len(answer.json()["choices"][0]["token_ids"]), 3)
        completion = daemon.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2,
                                                          "return_token_ids": True})
        self.assertEqual(completion.status_code, 200, completion.text)
        self.assertEqual(len(completion.json()["choices"][0]["token_ids"]), 2)
        with daemon.post(GENERATE, json={**body([4], max_tokens=2), "stream": True},
                         stream=True) as streamed:
            self.assertEqual(streamed.status_code, 200)
            self.assertEqual(sse_events(streamed)[-1], "[DONE]")
        # vLLM hides its admin routes, /abort_requests among them, without dev mode.
        for path in ("/pause", "/abort_requests", "/start_weight_update", "/collective_rpc"):
            self.assertEqual(daemon.post(path, json={}).status_code, 404, path)


if __name__ == "__main__":
    unittest.main()
