"""Several choices in one answer: `n > 1` on both generation routes and a batch of prompts on
/v1/completions, fanned out by vllmd into one engine request per choice (the engine only ever
sees n = 1, as behind vLLM's Python frontend). Each test is an RL client's exact call (SkyRL's
Tinker sample and forwarding, docs/http-api.md §9.8); every token id is checked against the
weights the engine holds, with choice i's seed being seed + i."""

import json
import math
import threading
import time

from harness import wait_until
from test_generate import GenerateTestCase, body, records, sse_events
import ref_tokens

COMPLETIONS = "/v1/completions"


def prompt_logprobs_ok(test, rows, prompt):
    """vLLM's nested shape: null first, then the prompt's own token's entry per position."""
    test.assertEqual(len(rows), len(prompt))
    test.assertIsNone(rows[0])
    for position, row in enumerate(rows[1:], start=1):
        own = row[str(prompt[position])]
        test.assertTrue(math.isfinite(own["logprob"]))
        test.assertEqual(own["decoded_token"], f"token_id:{prompt[position]}")


class Fanout(GenerateTestCase):
    def test_skyrl_tinker_sample_n4_with_prompt_logprobs_on_generate(self):
        daemon, (engine,) = self.start()
        prompt = [31, 32, 33, 34, 35]
        # remote_inference_client.py sample()'s body (no stop strings: stop is None).
        sampling = {"n": 4, "logprobs": 0, "output_kind": 2, "prompt_logprobs": 1,
                    "temperature": 1.0, "max_tokens": 5, "seed": 40, "top_k": -1, "top_p": 1.0,
                    "stop": None, "stop_token_ids": []}
        response = self.generate(daemon, {"model": "default", "token_ids": prompt,
                                          "sampling_params": sampling},
                                 headers={"X-Request-Id": "tinker-1"})
        self.assertEqual(response.status_code, 200, response.text)
        answer = response.json()
        self.assertEqual(answer["request_id"], "generate-tokens-tinker-1")
        self.assertEqual([choice["index"] for choice in answer["choices"]], [0, 1, 2, 3])
        for i, choice in enumerate(answer["choices"]):
            self.assertEqual(choice["token_ids"], ref_tokens.tokens(prompt, 5, seed=40 + i))
            self.assertEqual(choice["finish_reason"], "length")
            content = choice["logprobs"]["content"]
            self.assertEqual([item["token"] for item in content],
                             [f"token_id:{t}" for t in choice["token_ids"]])
            self.assertTrue(all(math.isfinite(item["logprob"]) for item in content))
        # SkyRL reads the top-level prompt_logprobs, once for the prompt.
        prompt_logprobs_ok(self, answer["prompt_logprobs"], prompt)
        self.assertEqual(answer["prompt_token_ids"], prompt)
        self.assertEqual(answer["usage"]["prompt_tokens"], 5)
        self.assertEqual(answer["usage"]["completion_tokens"], 20)
        self.assertEqual(answer["usage"]["total_tokens"], 25)
        # The engine saw four requests of n = 1, seeds 40..43, named as vLLM names children.
        adds = records(engine, "ADD")
        self.assertEqual(len(adds), 4)
        self.assertEqual(sorted(add["sampling_params"]["seed"] for add in adds), [40, 41, 42, 43])
        self.assertTrue(all(add["sampling_params"].get("n", 1) == 1 for add in adds))
        self.assertEqual(sorted(add["external_req_id"] for add in adds),
                         [f"{i}_generate-tokens-tinker-1" for i in range(4)])
        self.assertEqual(len({add["request_id"] for add in adds}), 4)
        self.assertEqual(daemon.metric("vllmd_generation_tokens_total"), 20)
        self.assertEqual(daemon.metric("vllmd_generations_in_flight"), 0)

    def test_skyrl_forwarding_n4_on_completions_with_session_and_prompt_logprobs(self):
        daemon, (engine,) = self.start()
        prompt = [21, 22, 23]
        # skyrl_train_inference_forwarding.py's body and header.
        payload = {"model": "default", "prompt": prompt, "n": 4, "seed": 3, "max_tokens": 6,
                   "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": 1, "stream": False,
                   "return_token_ids": True, "prompt_logprobs": 1, "stop_token_ids": []}
        response = daemon.post(COMPLETIONS, json=payload, headers={"X-Session-ID": "s-9"})
        self.assertEqual(response.status_code, 200, response.text)
        answer = response.json()
        self.assertTrue(answer["id"].startswith("cmpl-"))
        self.assertEqual(len(answer["choices"]), 4)
        for i, choice in enumerate(answer["choices"]):
            self.assertEqual(choice["index"], i)
            self.assertEqual(choice["token_ids"], ref_tokens.tokens(prompt, 6, seed=3 + i))
            self.assertEqual(choice["prompt_token_ids"], prompt)
            self.assertEqual(len(choice["logprobs"]["token_logprobs"]), 6)
            self.assertIn(choice["finish_reason"], ("length", "stop"))
            prompt_logprobs_ok(self, choice["prompt_logprobs"], prompt)
        self.assertEqual(answer["usage"]["prompt_tokens"], 3)
        self.assertEqual(answer["usage"]["completion_tokens"], 24)
        externals = sorted(add["external_req_id"] for add in records(engine, "ADD"))
        base = answer["id"]
        self.assertEqual(externals, [f"{i}_{base}-0" for i in range(4)])

    def test_a_batch_of_prompts_answers_in_prompt_order_then_by_n(self):
        daemon, (engine,) = self.start()
        prompts = [[1, 2, 3], [4, 5], [6]]
        payload = {"prompt": prompts, "n": 2, "seed": 100, "max_tokens": 4,
                   "return_token_ids": True, "logprobs": 0}
        response = daemon.post(COMPLETIONS, json=payload, headers={"X-Request-Id": "b"})
        self.assertEqual(response.status_code, 200, response.text)
        answer = response.json()
        self.assertEqual(answer["id"], "cmpl-b")
        self.assertEqual([choice["index"] for choice in answer["choices"]], list(range(6)))
        for index, choice in enumerate(answer["choices"]):
            prompt = prompts[index // 2]
            self.assertEqual(choice["prompt_token_ids"], prompt)
            self.assertEqual(choice["token_ids"],
                             ref_tokens.tokens(prompt, 4, seed=100 + index % 2))
            ids = [int(token.split(":")[1]) for token in choice["logprobs"]["tokens"]]
            self.assertEqual(ids, choice["token_ids"])
        # Each prompt's tokens count once, every choice's completion.
        self.assertEqual(answer["usage"]["prompt_tokens"], 6)
        self.assertEqual(answer["usage"]["completion_tokens"], 24)
        self.assertEqual(sorted(add["external_req_id"] for add in records(engine, "ADD")),
                         sorted(f"{i}_cmpl-b-{p}" for p in range(3) for i in range(2)))

    def test_a_batch_with_n1_names_each_prompt_as_vllm_does(self):
        daemon, (engine,) = self.start()
        response = daemon.post(COMPLETIONS, json={"prompt": [[9, 9], [8]], "max_tokens": 3,
                                                  "seed": 1}, headers={"X-Request-Id": "two"})
        self.assertEqual(response.status_code, 200, response.text)
        choices = response.json()["choices"]
        self.assertEqual([c["index"] for c in choices], [0, 1])
        self.assertEqual(choices[1]["logprobs"], None)
        self.assertEqual(sorted(add["external_req_id"] for add in records(engine, "ADD")),
                         ["cmpl-two-0", "cmpl-two-1"])

    def test_streamed_n3_each_choice_by_index_then_usage_then_done(self):
        daemon, _ = self.start()
        prompt = [5, 6, 7]
        payload = {**body(prompt, max_tokens=12, seed=9, n=3), "stream": True,
                   "stream_options": {"include_usage": True}}
        with self.generate(daemon, payload, stream=True) as response:
            self.assertEqual(response.status_code, 200)
            events = sse_events(response)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(event) for event in events[:-1]]
        usage = chunks.pop()
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"]["prompt_tokens"], 3)
        self.assertEqual(usage["usage"]["completion_tokens"], 36)
        streamed = {0: [], 1: [], 2: []}
        finished = {}
        for chunk in chunks:
            choice, = chunk["choices"]
            self.assertNotIn(choice["index"], finished, "a delta after its choice finished")
            streamed[choice["index"]] += choice["token_ids"]
            if choice["finish_reason"] is not None:
                finished[choice["index"]] = choice["finish_reason"]
        self.assertEqual(finished, {0: "length", 1: "length", 2: "length"})
        for i in range(3):
            self.assertEqual(streamed[i], ref_tokens.tokens(prompt, 12, seed=9 + i))

    def test_streamed_n2_completions_label_each_choice_at_its_end(self):
        daemon, _ = self.start()
        prompt = [8, 9]
        payload = {"prompt": prompt, "max_tokens": 5, "seed": 4, "n": 2, "stream": True,
                   "return_token_ids": True, "logprobs": 0,
                   "stream_options": {"include_usage": True}}
        with daemon.post(COMPLETIONS, json=payload, stream=True) as response:
            self.assertEqual(response.status_code, 200)
            events = sse_events(response)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(event) for event in events[:-1]]
        usage = chunks.pop()
        self.assertEqual((usage["choices"], usage["usage"]["completion_tokens"]), ([], 10))
        streamed, tokens, ends = {0: [], 1: []}, {0: [], 1: []}, {}
        for chunk in chunks:
            self.assertEqual(chunk["object"], "text_completion")
            choice, = chunk["choices"]
            streamed[choice["index"]] += choice["token_ids"]
            tokens[choice["index"]] += choice["logprobs"]["tokens"]
            if choice["finish_reason"] is not None:
                ends[choice["index"]] = (choice["finish_reason"], choice["weight_versions"])
            else:
                self.assertNotIn("weight_versions", choice)
        for i in range(2):
            self.assertEqual(streamed[i], ref_tokens.tokens(prompt, 5, seed=4 + i))
            self.assertEqual(tokens[i], [f"token_id:{t}" for t in streamed[i]])
            self.assertEqual(ends[i], ("length", [{"version": "default", "first_token": 0}]))

    def test_the_n_requests_of_a_prompt_go_to_one_engine(self):
        daemon, engines = self.start(dp=2)
        for round_ in range(3):
            response = self.generate(daemon, body([1, 2, round_], max_tokens=2, n=4))
            self.assertEqual(response.status_code, 200, response.text)
        per_engine = [len(records(engine, "ADD")) for engine in engines]
        self.assertEqual(sum(per_engine), 12)
        for engine in engines:
            adds = records(engine, "ADD")
            prompts = {tuple(add["prompt_token_ids"]) for add in adds}
            # Whichever engine a prompt went to got all four of its choices.
            for prompt in prompts:
                self.assertEqual(sum(tuple(a["prompt_token_ids"]) == prompt for a in adds), 4)

    def test_without_a_seed_each_choice_samples_on_its_own(self):
        daemon, (engine,) = self.start()
        response = self.generate(daemon, {"token_ids": [3, 4],
                                          "sampling_params": {"n": 3, "max_tokens": 6}})
        self.assertEqual(response.status_code, 200, response.text)
        answer = response.json()
        adds = records(engine, "ADD")
        self.assertTrue(all(add["sampling_params"].get("seed") is None for add in adds))
        outputs = {tuple(choice["token_ids"]) for choice in answer["choices"]}
        self.assertEqual(len(outputs), 3)
        by_id = {add["external_req_id"]: add["request_id"] for add in adds}
        for i, choice in enumerate(answer["choices"]):
            engine_id = by_id[f"{i}_{answer['request_id']}"]
            self.assertEqual(choice["token_ids"],
                             ref_tokens.tokens([3, 4], 6, seed=None, request_id=engine_id))

    def test_n_beyond_the_limit_or_below_one_is_refused_and_reaches_no_engine(self):
        daemon, (engine,) = self.start()
        for n, needle in ((0, "at least 1"), (257, "at most 256"), (1.5, "integer")):
            response = self.generate(daemon, body([1], n=n))
            self.assertEqual(response.status_code, 400, response.text)
            error = response.json()["error"]
            self.assertEqual(error["param"], "sampling_params.n")
            self.assertIn(needle, error["message"])
        response = daemon.post(COMPLETIONS, json={"prompt": [[1]] * 20, "n": 256})
        self.assertEqual(response.status_code, 400, response.text)
        self.assertEqual(response.json()["error"]["param"], "prompt")
        self.assertIn("4096", response.json()["error"]["message"])
        response = daemon.post(COMPLETIONS, json={"prompt": [[1], []]})
        self.assertEqual(response.status_code, 400, response.text)
        self.assertEqual(response.json()["error"]["param"], "prompt")
        response = daemon.post(COMPLETIONS, json={"prompt": [[1], [2, "x"]]})
        self.assertEqual(response.status_code, 400, response.text)
        self.assertEqual(records(engine, "ADD"), [])

    def test_abort_by_the_answers_id_ends_every_choice_with_its_tokens(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        result = {}

        def post():
            result["response"] = self.generate(
                daemon, body([1, 2], max_tokens=2000, n=3), headers={"X-Request-Id": "long"})

        thread = threading.Thread(target=post)
        thread.start()
        self.wait_for(engine, "ADD", 3)
        time.sleep(0.2)
        aborted = daemon.post("/abort_requests", json={"request_ids": ["long"]})
        self.assertEqual(aborted.json(), {"status": "aborted", "aborted": 1})
        thread.join(10)
        response = result["response"]
        self.assertEqual(response.status_code, 200, response.text)
        choices = response.json()["choices"]
        self.assertEqual([c["finish_reason"] for c in choices], ["abort"] * 3)
        self.assertTrue(all(0 < len(c["token_ids"]) < 2000 for c in choices))
        # vllmd answers once it sent the ABORT; the engine records it when it reads it.
        added = {add["request_id"] for add in records(engine, "ADD")}
        wait_until(lambda: {i for record in records(engine, "ABORT")
                            for i in record["request_ids"]} == added, 5,
                   message="the engine's record of the ABORT of all three")

    def test_a_client_that_leaves_aborts_every_choice(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        payload = {**body([1, 2], max_tokens=2000, n=2), "stream": True}
        response = self.generate(daemon, payload, stream=True)
        self.assertEqual(response.status_code, 200)
        next(response.iter_lines())
        response.close()
        wait_until(lambda: len({i for r in records(engine, "ABORT") for i in r["request_ids"]})
                   == 2, 5, message="both choices aborted")
        wait_until(lambda: daemon.metric("vllmd_generations_in_flight") == 0, 5,
                   message="no generation in flight")

    def test_an_engine_lost_mid_answer_fails_the_whole_answer_once(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        result = {}

        def post():
            result["response"] = self.generate(daemon, body([1, 2], max_tokens=2000, n=3))

        thread = threading.Thread(target=post)
        thread.start()
        self.wait_for(engine, "ADD", 3)
        engine.kill()
        thread.join(10)
        response = result["response"]
        self.assertEqual(response.status_code, 500, response.text)
        self.assertIn("error", response.json())
        wait_until(lambda: daemon.metric("vllmd_generations_in_flight") == 0, 5,
                   message="no generation in flight")
