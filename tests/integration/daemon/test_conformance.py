"""What prime-rl, vime and SkyRL's rollouts send, exactly, and every field they read, checked as
each client checks it (the project's spec of the RL clients, prime-rl's, vime's and SkyRL's
sections; SkyRL's n > 1 and prompt_logprobs are in test_choices.py, TRL's and AReaL's bodies in
test_completions.py). Real vllmd and
vllm-ref-engine processes; every token id is checked against the weights the engine holds."""

import json
import math
import threading
import time

from test_generate import GenerateTestCase, records, sse_events
import ref_tokens


class ClientTestCase(GenerateTestCase):
    def rollout(self, daemon, prompt, sampling, headers=None):
        """POST /inference/v1/generate as these clients do (not streamed); the answer, a 200."""
        response = self.generate(daemon, {"model": "default", "token_ids": prompt,
                                          "sampling_params": sampling}, headers=headers)
        self.assertEqual(response.status_code, 200, response.text)  # a 4xx raises in each
        return response.json()


class PrimeRl(ClientTestCase):
    def test_renderer_rollout_with_a_top_k_head_passes_the_strict_check(self):
        daemon, (engine,) = self.start()
        prompt = [151, 152, 153, 154]
        k = 3
        # verifiers' train client through renderers: the config's keys, extra_body merged into
        # sampling_params, the renderer's stop ids and logprobs k + 2 for the head.
        sampling = {"temperature": 1.0, "top_p": 1.0, "logprobs": k + 2, "max_tokens": 8,
                    "top_k": -1, "min_p": 0.0, "return_token_ids": True, "stop_token_ids": [2],
                    "skip_special_tokens": False, "flat_logprobs": True, "detokenize": False,
                    "seed": 11, "extra_args": {"prl_compact_logprobs": True}}
        answer = self.rollout(daemon, prompt, sampling, headers={"X-Session-ID": "episode-3"})
        choice = answer["choices"][0]
        ids = choice["token_ids"]
        expected = ref_tokens.tokens(prompt, 8, seed=11)
        if 2 in expected:  # a stop id: the answer ends with it
            expected = expected[:expected.index(2) + 1]
        self.assertEqual(ids, expected)
        # The newer renderers client's strict check, as it raises.
        content = choice["logprobs"]["content"]
        self.assertEqual(len(content), len(ids))
        for item, token in zip(content, ids):
            self.assertEqual(item["token"], f"token_id:{token}")
            self.assertTrue(math.isfinite(item["logprob"]))
            self.assertNotEqual(item["logprob"], -9999.0)
            self.assertGreaterEqual(len(item["top_logprobs"]), k + 2)
            for candidate in item["top_logprobs"]:
                self.assertRegex(candidate["token"], r"^token_id:\d+$")
                self.assertLessEqual(candidate["logprob"], 0)
        self.assertTrue(answer["request_id"].startswith("generate-tokens-"))
        self.assertEqual(answer["prompt_token_ids"], prompt)
        usage = answer["usage"]
        self.assertEqual((usage["prompt_tokens"], usage["completion_tokens"]),
                         (4, len(ids)))
        self.assertIn("cached_tokens", usage["prompt_tokens_details"])
        self.assertIn(choice["finish_reason"], ("stop", "length"))
        add, = records(engine, "ADD")
        self.assertEqual(add["sampling_params"]["logprobs"], k + 2)

    def test_prefill_logprobs_scoring_reads_the_first_value_of_each_row(self):
        # utils/client.py prefill_logprobs: max_tokens 1, temperature and top_p 1, prompt
        # logprobs 1; it reads each row's first value, which must be the prompt's own token.
        daemon, (engine,) = self.start()
        prompt = [5, 6, 7, 8, 9]
        rows = self.rollout(daemon, prompt, {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0,
                                             "prompt_logprobs": 1})["prompt_logprobs"]
        self.assertEqual(len(rows), len(prompt))
        self.assertIsNone(rows[0])
        for position, row in enumerate(rows[1:], start=1):
            first_key, first = next(iter(row.items()))
            self.assertEqual(first_key, str(prompt[position]))
            self.assertTrue(math.isfinite(first["logprob"]))
            self.assertNotEqual(first["logprob"], -9999.0)
        add, = records(engine, "ADD")
        self.assertEqual(add["sampling_params"]["prompt_logprobs"], 1)


class SkyRl(ClientTestCase):
    def test_rollout_as_generate_single_sends_it_and_reads_it(self):
        # RemoteInferenceClient._generate_single: get_vllm_sampling_params' keys (stop left at
        # its default, None), the model, the prompt ids and the session header; not streamed.
        daemon, (engine,) = self.start()
        prompt = [17, 18, 19, 20, 21]
        sampling = {"min_tokens": 1, "skip_special_tokens": True,
                    "include_stop_str_in_output": True, "max_tokens": 12, "temperature": 1.0,
                    "top_p": 1.0, "top_k": -1, "min_p": 0.0, "logprobs": 1, "stop": None}
        choice = self.rollout(daemon, prompt, sampling,
                              headers={"X-Session-ID": "skyrl-traj-0"})["choices"][0]
        # What it reads: the ids, the finish reason and one logprob per id.
        add, = records(engine, "ADD")
        ids = choice["token_ids"]
        # No seed: the engine's tokens follow from the id vllmd gave the request.
        self.assertEqual(ids, ref_tokens.tokens(prompt, 12, None, request_id=add["request_id"]))
        self.assertEqual(choice["finish_reason"], "length")
        logprobs = [item["logprob"] for item in choice["logprobs"]["content"]]
        self.assertEqual(len(logprobs), len(ids))
        self.assertTrue(all(math.isfinite(value) and value <= 0 for value in logprobs))
        sent = add["sampling_params"]
        self.assertEqual((sent["min_tokens"], sent["logprobs"], sent["max_tokens"],
                          sent["temperature"], sent["top_p"]), (1, 1, 12, 1.0, 1.0))
        self.assertNotIn("top_k", sent)  # -1 is vLLM's 0, its default, which the map leaves out
        self.assertEqual(add["prompt_token_ids"], prompt)


class Vime(ClientTestCase):
    def stream(self, daemon, payload, into):
        with self.generate(daemon, payload, stream=True, headers={"x-session-id": "s1"}) as r:
            into["status"] = r.status_code
            into["events"] = sse_events(r)

    @staticmethod
    def read_stream(events):
        """vime's streaming rollout: token deltas, logprobs, finish_reason, the usage chunk and
        the weight version (from any chunk that has one)."""
        tokens, logprobs, finish, usage, version = [], [], None, None, None
        for event in events:
            if event == "[DONE]":
                break
            chunk = json.loads(event)
            if chunk.get("weight_version") is not None:
                version = str(chunk["weight_version"])
            if not chunk["choices"]:
                usage = chunk["usage"]
                continue
            choice = chunk["choices"][0]
            tokens += choice["token_ids"]
            if choice["logprobs"]:
                logprobs += [item["logprob"] for item in choice["logprobs"]["content"]]
            finish = choice["finish_reason"] or finish
        return tokens, logprobs, finish, usage, version

    def test_plain_rollout_as_generate_sends_it_and_reads_it(self):
        # vllm_rollout.generate: _build_inference_sampling_params' keys, x-session-id, plain.
        daemon, (engine,) = self.start()
        prompt = [61, 62, 63, 64]
        sampling = {"max_tokens": 9, "temperature": 1.0, "top_p": 1.0, "logprobs": 1,
                    "top_k": -1, "seed": 3, "skip_special_tokens": True}
        output = self.rollout(daemon, prompt, sampling, headers={"x-session-id": "vime-sample-1"})
        choice = output["choices"][0]
        self.assertEqual(choice["token_ids"], ref_tokens.tokens(prompt, 9, seed=3))
        logprobs = [float(item.get("logprob", 0.0)) for item in choice["logprobs"]["content"]]
        self.assertEqual(len(logprobs), 9)
        self.assertTrue(all(math.isfinite(x) and x <= 0 for x in logprobs))
        self.assertEqual(choice["finish_reason"], "length")  # vime: {"type": "length"}
        self.assertEqual(str(output["weight_version"]), "default")
        usage = output["usage"]
        self.assertEqual((usage["prompt_tokens"], usage["completion_tokens"]), (4, 9))
        self.assertIsInstance(usage["prompt_tokens_details"]["cached_tokens"], int)
        self.assertIsNone(choice.get("routed_experts"))  # vime guards on the value
        self.assertIsNone(choice.get("sampling_mask"))

    def test_streaming_rollout_and_its_abort_by_pause_loop_resending_the_prefix(self):
        daemon, (engine,) = self.start(engine_flags=["--step-ms", "20"])
        prompt = [41, 42, 43]
        budget = 200

        def payload(token_ids, max_tokens):
            return {"model": "default", "token_ids": token_ids, "stream": True,
                    "stream_options": {"include_usage": True},
                    "sampling_params": {"max_tokens": max_tokens, "temperature": 1.0,
                                        "top_p": 1.0, "logprobs": 1, "top_k": -1, "seed": 5,
                                        "skip_special_tokens": False, "ignore_eos": True}}

        first = {}
        thread = threading.Thread(target=self.stream, args=(daemon, payload(prompt, budget), first))
        thread.start()
        self.wait_for(engine, "ADD")
        time.sleep(0.3)  # some tokens
        # vime's abort(): /pause?mode=abort with a {} body, wait for the tasks, /resume.
        self.assertEqual(daemon.post("/pause", params={"mode": "abort"}, json={}).status_code, 200)
        thread.join(10)
        self.assertEqual(daemon.post("/resume", json={}).status_code, 200)
        self.assertEqual(first["status"], 200)
        self.assertEqual(first["events"][-1], "[DONE]")
        partial, logprobs, finish, usage, version = self.read_stream(first["events"])
        self.assertEqual(finish, "abort")
        self.assertEqual(version, "default")  # vime appends it to the sample's weight_versions
        self.assertGreater(len(partial), 0)
        self.assertLess(len(partial), budget)
        self.assertEqual(len(logprobs), len(partial))
        self.assertEqual(partial, ref_tokens.tokens(prompt, len(partial), seed=5))
        self.assertEqual((usage["prompt_tokens"], usage["completion_tokens"]), (3, len(partial)))
        self.assertIsInstance(usage["prompt_tokens_details"]["cached_tokens"], int)
        # The partial rollout goes on: the whole prefix resent, with what is left of the budget.
        rest = budget - len(partial)
        second = {}
        self.stream(daemon, payload(prompt + partial, rest), second)
        tokens, logprobs, finish, usage, version = self.read_stream(second["events"])
        self.assertEqual(finish, "length")
        self.assertEqual(version, "default")
        self.assertEqual(tokens, ref_tokens.tokens(prompt + partial, rest, seed=5))
        self.assertEqual(len(logprobs), rest)
        self.assertEqual(usage["prompt_tokens"], len(prompt) + len(partial))
        self.assertEqual(len(partial) + len(tokens), budget)
        adds = records(engine, "ADD")
        self.assertEqual(adds[1]["prompt_token_ids"], prompt + partial)
