"""Weight versions per token, end to end: which committed weights each token came from, as an
asynchronous RL trainer needs to measure staleness (docs/http-api.md §9.7). A rollout streams
across a weight sync frozen by /pause?mode=keep; the reference engine's tokens tell which
weights produced each one (support/ref_tokens.py), and the labels must say exactly that."""

import json
import threading
import time
import unittest

from harness import NCCL_INIT_INFO, update_info, wait_until
from test_generate import GenerateTestCase, body, sse_events
import ref_tokens


class WeightVersions(GenerateTestCase):
    def commit(self, daemon, version):
        for path, payload in (("/start_weight_update", None),
                              ("/update_weights", {"update_info": update_info()}),
                              ("/finish_weight_update", {"weight_version": version})):
            response = daemon.post(path, json=payload) if payload else daemon.post(path)
            self.assertEqual(response.status_code, 200, f"{path}: {response.text}")

    def test_a_stream_across_a_sync_labels_each_token_with_the_weights_it_came_from(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        self.assertEqual(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": NCCL_INIT_INFO}).status_code, 200)
        self.commit(daemon, "v1")
        prompt = [3, 1, 4]
        received = []
        events = []

        def run():
            payload = {**body(prompt, max_tokens=60, ignore_eos=True), "stream": True}
            with self.generate(daemon, payload, stream=True) as response:
                for line in response.iter_lines(decode_unicode=True):
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[len("data: "):])
                    events.append(event)
                    if event.get("choices"):
                        received.extend(event["choices"][0]["token_ids"])
        thread = threading.Thread(target=run)
        thread.start()
        wait_until(lambda: len(received) >= 10, 10, message="10 tokens")
        self.assertEqual(daemon.post("/pause", params={"mode": "keep"}).status_code, 200)
        time.sleep(0.3)  # what the engine sent before it paused has arrived
        frozen = len(received)
        self.commit(daemon, "v2")
        time.sleep(0.2)
        self.assertEqual(len(received), frozen)  # nothing generated while paused
        self.assertEqual(daemon.post("/resume").status_code, 200)
        thread.join(20)
        self.assertEqual(len(received), 60)
        last = events[-1]["choices"][0]
        self.assertEqual(last["finish_reason"], "length")
        self.assertEqual(last["weight_versions"], [{"version": "v1", "first_token": 0},
                                                   {"version": "v2", "first_token": frozen}])
        # Only the last chunk carries them, and vime's one label: the last token's version.
        self.assertTrue(all("weight_versions" not in e["choices"][0] for e in events[:-1]))
        self.assertEqual(events[-1]["weight_version"], "v2")
        self.assertTrue(all("weight_version" not in e for e in events[:-1]))
        # The engine's tokens agree: the first `frozen` from v1's weights, the rest from v2's
        # (one finished session each: the version and the session count make the weights).
        under_v1 = ref_tokens.tokens(prompt, 60, 7, weights=ref_tokens.fingerprint("v1", 1))
        under_v2 = ref_tokens.tokens(prompt, 60, 7, weights=ref_tokens.fingerprint("v2", 2))
        self.assertEqual(received[:frozen], under_v1[:frozen])
        self.assertEqual(received[frozen:], under_v2[frozen:])

    def test_a_plain_answer_and_a_completion_name_the_version_in_force(self):
        daemon, _ = self.start()
        answer = self.generate(daemon, body([5], max_tokens=3)).json()
        self.assertEqual(answer["choices"][0]["weight_versions"],
                         [{"version": "default", "first_token": 0}])
        self.assertEqual(answer["weight_version"], "default")  # what vime reads
        self.assertEqual(daemon.post("/init_weight_transfer_engine",
                                     json={"init_info": NCCL_INIT_INFO}).status_code, 200)
        self.commit(daemon, "step-3")
        completion = daemon.post("/v1/completions", json={"prompt": [5], "max_tokens": 2}).json()
        self.assertEqual(completion["choices"][0]["weight_versions"],
                         [{"version": "step-3", "first_token": 0}])
        # n > 1 on the generate route: one label for the answer, and each choice's own.
        several = self.generate(daemon, body([5], max_tokens=2, n=2)).json()
        self.assertEqual(several["weight_version"], "step-3")
        self.assertEqual([c["weight_versions"] for c in several["choices"]],
                         [[{"version": "step-3", "first_token": 0}]] * 2)

    def test_an_answer_without_tokens_names_the_version_in_force_when_it_ended(self):
        daemon, _ = self.start(engine_flags=["--step-ms", "20"])
        self.assertEqual(daemon.post("/pause", params={"mode": "keep"}).status_code, 200)
        answer = {}

        def run():
            answer["json"] = self.generate(daemon, body([5], max_tokens=3)).json()
        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(0.3)  # queued behind the pause: no tokens yet
        self.assertEqual(daemon.post("/pause", params={"mode": "abort"}).status_code, 200)
        thread.join(10)
        self.assertEqual(answer["json"]["choices"][0]["finish_reason"], "abort")
        self.assertEqual(answer["json"]["choices"][0]["token_ids"], [])
        self.assertEqual(answer["json"]["choices"][0]["weight_versions"], [])
        self.assertEqual(answer["json"]["weight_version"], "default")


if __name__ == "__main__":
    unittest.main()
