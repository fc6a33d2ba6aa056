"""POST /v1/completions with token-id prompts, end to end, each test written as the client's
exact call: TRL's async GRPO and AReaL roll out through this route (docs/http-api.md §9.1.1).
Real vllmd and vllm-ref-engine processes; every token id is checked against the weights the
engine holds (support/ref_tokens.py)."""

import json
import math
import threading
import time
import unittest

from test_generate import GenerateTestCase, records, sse_events
import ref_tokens

COMPLETIONS = "/v1/completions"


class Completions(GenerateTestCase):
    def complete(self, daemon, payload, **kwargs):
        return daemon.post(COMPLETIONS, json=payload, **kwargs)

    def test_trl_async_grpo_reads_token_ids_and_token_logprobs(self):
        daemon, (engine,) = self.start()
        prompt = [11, 12, 13, 14]
        # async_rollout_worker.py _generate_one_turn's body, exactly, and no headers.
        response = self.complete(daemon, {"model": "default", "prompt": prompt, "max_tokens": 7,
                                          "temperature": 1.0, "n": 1, "return_token_ids": True,
                                          "logprobs": 0})
        self.assertEqual(response.status_code, 200, response.text)
        answer = response.json()
        self.assertRegex(answer["id"], r"^cmpl-[0-9a-f]{32}$")
        self.assertEqual((answer["object"], answer["model"]), ("text_completion", "default"))
        self.assertIsInstance(answer["created"], int)
        choice, = answer["choices"]
        add, = records(engine, "ADD")
        # No seed: the engine's tokens follow from the id vllmd gave the request.
        self.assertEqual(choice["token_ids"],
                         ref_tokens.tokens(prompt, 7, None, request_id=add["request_id"]))
        self.assertEqual(choice["prompt_token_ids"], prompt)
        logprobs = choice["logprobs"]["token_logprobs"]
        self.assertEqual(len(logprobs), 7)
        self.assertTrue(all(isinstance(x, float) and math.isfinite(x) for x in logprobs))
        # TRL sends no return_tokens_as_token_ids; with no tokenizer the tokens and the
        # top_logprobs keys are still the placeholders, each sampled token's logprob its own.
        tokens = [f"token_id:{t}" for t in choice["token_ids"]]
        self.assertEqual(choice["logprobs"]["tokens"], tokens)
        for token, top, logprob in zip(tokens, choice["logprobs"]["top_logprobs"], logprobs):
            self.assertEqual(top, {token: logprob})  # logprobs 0: the sampled one only
        self.assertEqual((choice["index"], choice["text"], choice["finish_reason"]),
                         (0, "", "length"))
        self.assertIsNone(choice["stop_reason"])
        self.assertIsNone(choice["prompt_logprobs"])
        self.assertEqual(answer["usage"]["prompt_tokens"], 4)
        self.assertEqual(answer["usage"]["completion_tokens"], 7)
        self.assertEqual(answer["usage"]["total_tokens"], 11)
        self.assertEqual(add["external_req_id"], answer["id"] + "-0")
        self.assertTrue(add["request_id"].startswith(answer["id"] + "-0-"), add)
        self.assertEqual(add["prompt_token_ids"], prompt)

    def test_areal_parses_ids_from_the_logprobs_tokens(self):
        daemon, (engine,) = self.start()
        prompt = [7, 8, 9]
        # vllm_remote.py build_generation_request's body: no model, top_k 1e8, placeholders.
        response = self.complete(daemon, {
            "prompt": prompt, "top_p": 1.0, "top_k": 100000000, "max_tokens": 6,
            "temperature": 0.0, "stop_token_ids": [], "ignore_eos": False,
            "skip_special_tokens": True, "return_tokens_as_token_ids": True, "logprobs": 0,
            "use_beam_search": False, "stream": False})
        self.assertEqual(response.status_code, 200, response.text)
        choice = response.json()["choices"][0]
        # parse_generation_response: int(t.split(":")[1]) over logprobs.tokens.
        ids = [int(token.split(":")[1]) for token in choice["logprobs"]["tokens"]]
        add, = records(engine, "ADD")
        self.assertEqual(ids, ref_tokens.tokens(prompt, 6, seed=None,
                                                request_id=add["request_id"]))
        # Its logprobs: one finite value per token, the one its top_logprobs map holds.
        token_logprobs = choice["logprobs"]["token_logprobs"]
        self.assertEqual(len(token_logprobs), 6)
        self.assertTrue(all(math.isfinite(x) and -9999.0 < x <= 0 for x in token_logprobs))
        self.assertEqual([list(top.values()) for top in choice["logprobs"]["top_logprobs"]],
                         [[x] for x in token_logprobs])
        self.assertEqual(choice["finish_reason"], "length")
        # No return_token_ids: the fields are there, null, as vLLM's Python server has them.
        self.assertIsNone(choice["token_ids"])
        self.assertIsNone(choice["prompt_token_ids"])
        # logprobs 0: each top_logprobs map holds the sampled token only.
        self.assertEqual([list(top) for top in choice["logprobs"]["top_logprobs"]],
                         [[f"token_id:{i}"] for i in ids])
        offsets = choice["logprobs"]["text_offset"]
        self.assertEqual(offsets[0], 0)
        self.assertEqual(offsets[1], len(f"token_id:{ids[0]}"))
        # The sampling keys at the top level reach the engine as on /inference/v1/generate.
        self.assertEqual((add["sampling_params"]["temperature"], add["sampling_params"]["top_p"],
                          add["sampling_params"]["max_tokens"]), (0.0, 1.0, 6))
        # top_k 1e8 goes on as sent, as vLLM's frontend passes it (the sampler caps it).
        self.assertEqual(add["sampling_params"]["top_k"], 100000000)

    def test_streamed_with_usage_token_id_deltas_and_the_prompt_ids_once(self):
        daemon, _ = self.start()
        prompt = [5, 6]
        payload = {"prompt": prompt, "max_tokens": 10, "seed": 3, "stream": True,
                   "return_token_ids": True, "logprobs": 1,
                   "stream_options": {"include_usage": True}}
        with self.complete(daemon, payload, stream=True) as response:
            self.assertEqual(response.status_code, 200)
            self.assertTrue(response.headers["Content-Type"].startswith("text/event-stream"))
            events = sse_events(response)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(event) for event in events[:-1]]
        usage = chunks.pop()
        self.assertEqual((usage["object"], usage["choices"]), ("text_completion", []))
        self.assertEqual(usage["usage"]["completion_tokens"], 10)
        self.assertGreater(len(chunks), 1)
        choices = [chunk["choices"][0] for chunk in chunks]
        streamed = [t for choice in choices for t in choice["token_ids"]]
        self.assertEqual(streamed, ref_tokens.tokens(prompt, 10, seed=3))
        self.assertEqual([choice["prompt_token_ids"] for choice in choices],
                         [prompt] + [None] * (len(choices) - 1))
        tokens = [t for choice in choices for t in choice["logprobs"]["tokens"]]
        self.assertEqual(tokens, [f"token_id:{t}" for t in streamed])
        # text_offset runs on across the events.
        offsets = [o for choice in choices for o in choice["logprobs"]["text_offset"]]
        self.assertEqual(offsets, [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))])
        self.assertTrue(all(len(top) in (1, 2) for choice in choices
                            for top in choice["logprobs"]["top_logprobs"]))
        self.assertEqual(choices[-1]["finish_reason"], "length")
        self.assertTrue(all(chunk["object"] == "text_completion" and chunk["id"].startswith("cmpl-")
                            for chunk in chunks))

    def test_prompt_logprobs_in_vllms_nested_shape(self):
        # prime-rl scores a sequence and SkyRL's Tinker forwarding reads prompt logprobs: a list
        # as long as the prompt, null first, then {"<id>": {logprob, rank, decoded_token}}.
        daemon, (engine,) = self.start()
        prompt = [21, 22, 23, 24]
        response = self.complete(daemon, {"prompt": prompt, "max_tokens": 1, "seed": 1,
                                          "prompt_logprobs": 2})
        self.assertEqual(response.status_code, 200, response.text)
        rows = response.json()["choices"][0]["prompt_logprobs"]
        self.assertEqual(len(rows), len(prompt))
        self.assertIsNone(rows[0])
        for position, row in enumerate(rows[1:], start=1):
            own = row[str(prompt[position])]
            self.assertEqual(own["decoded_token"], f"token_id:{prompt[position]}")
            self.assertIsInstance(own["rank"], int)
            self.assertTrue(math.isfinite(own["logprob"]) and own["logprob"] <= 0)
            self.assertTrue(all(entry["decoded_token"] == f"token_id:{key}"
                                for key, entry in row.items()))
        self.assertEqual(records(engine, "ADD")[0]["sampling_params"]["prompt_logprobs"], 2)

    def test_pause_abort_returns_the_partial_tokens_with_abort_in_a_200(self):
        # AReaL's loop: a request aborted by a pause is resent with its tokens appended.
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        answer = {}
        thread = threading.Thread(target=lambda: answer.update(response=self.complete(
            daemon, {"prompt": [4], "max_tokens": 100000, "seed": 7, "ignore_eos": True,
                     "logprobs": 0})))
        thread.start()
        self.wait_for(engine, "ADD")
        time.sleep(0.2)
        self.assertEqual(daemon.post("/pause", params={"mode": "abort"}).status_code, 200)
        thread.join(10)
        self.assertEqual(daemon.post("/resume").status_code, 200)
        self.assertEqual(answer["response"].status_code, 200)
        choice = answer["response"].json()["choices"][0]
        self.assertEqual(choice["finish_reason"], "abort")
        ids = [int(token.split(":")[1]) for token in choice["logprobs"]["tokens"]]
        self.assertGreater(len(ids), 0)
        self.assertEqual(ids, ref_tokens.tokens([4], len(ids), seed=7))

    def test_what_needs_a_tokenizer_is_refused_naming_why_and_reaches_no_engine(self):
        daemon, (engine,) = self.start()
        cases = [
            ({"prompt": "Hello"}, "prompt", "tokenizer"),
            ({"prompt": ["Hello", "world"]}, "prompt", "tokenizer"),
            ({"prompt": []}, "prompt", "must be provided"),
            ({"max_tokens": 3}, "prompt", "must be provided"),
            ({"prompt": [[1, 2], "x"]}, "prompt", "token ids"),
            ({"prompt": [1, 2], "echo": True}, "echo", "echo"),
            ({"prompt": [1, 2], "suffix": "x"}, "suffix", "suffix"),
            ({"prompt": [1, 2], "use_beam_search": True}, "use_beam_search", "beam"),
            ({"prompt": [1, 2], "stop": ["\n"]}, "stop", "stop_token_ids"),
            ({"prompt": [1, 2], "n": 0}, "n", "at least 1"),
            ({"prompt": [1, -2]}, "prompt", "negative"),
            ({"prompt": [1, 2], "temperature": 3}, "temperature", "[0, 2]"),
            ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens", "at least 1"),
            ({"prompt": [1, 2], "stream": True, "prompt_logprobs": 1}, "prompt_logprobs",
             "stream"),
            ({"prompt": [1, 2], "model": "other"}, "model", "does not exist"),
        ]
        for payload, param, text in cases:
            with self.subTest(payload=payload):
                response = self.complete(daemon, payload)
                # An unknown model is vLLM's 404; everything else a 400.
                self.assertEqual(response.status_code, 404 if param == "model" else 400,
                                 response.text)
                error = response.json()["error"]
                self.assertEqual(error["param"], param)
                self.assertIn(text, error["message"])
        self.assertEqual(records(engine, "ADD"), [])
        # One prompt in a list of lists is that prompt.
        response = self.complete(daemon, {"prompt": [[1, 2]], "max_tokens": 2, "seed": 1,
                                          "return_token_ids": True})
        self.assertEqual(response.status_code, 200, response.text)
        self.assertEqual(response.json()["choices"][0]["token_ids"],
                         ref_tokens.tokens([1, 2], 2, seed=1))


if __name__ == "__main__":
    unittest.main()
