"""The reference engine runs a real Llama from the weights the trainer sends: the GPU-free form
of vLLM's own weight-sync check. After each of three syncs through vllmd (the tcp backend,
float32 and bfloat16 bytes, TP=2 so every worker receives them), 128 greedy tokens for four
prompts through /inference/v1/generate equal the trainer's own greedy decode token for token,
and every token's logprob equals the trainer's within 1e-6. The trainer's model
(examples/llama_numpy.py) is written apart from the engine's C++. Before the first sync the
engine holds dummy weights and answers differently, so a sync that did nothing fails. A
tensor that does not fit the model fails its update by name and changes nothing. vLLM's
weight checker sees the model's own weights, its reset reaches them, and reload_weights
reads them again from the model directory."""

import json
import os
import sys
import unittest

import harness

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples")
sys.path.insert(0, EXAMPLES)
import llama_numpy  # noqa: E402
import tcp_trainer  # noqa: E402

PROMPTS = [[1, 2, 3], [5], [100, 200, 300, 400, 7], [511, 0, 42, 42]]
TOKENS = 128


def tensors_of(weights, dtype):
    return [tcp_trainer.Tensor(name, dtype, list(array.shape),
                               llama_numpy.tensor_bytes(array, dtype))
            for name, array in weights.items()]


class ModelAlignmentTest(harness.DaemonTestCase):

    def setUp(self):
        super().setUp()
        self.config = llama_numpy.config_dict()
        model_dir = os.path.join(self.workdir, "model")
        os.makedirs(model_dir)
        with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(self.config, handle)
        flags = ["--model", model_dir, "--load-format", "dummy", "--step-ms", "0"]
        self.daemon, self.engines, _ = self.start_external(dp=1, tp=2, backend="tcp",
                                                           engine_extra={0: flags})
        self.trainer = tcp_trainer.TcpTrainer(2)
        self.addCleanup(self.trainer.close)
        response = self.trainer.initialize(lambda info: self.daemon.post(
            "/init_weight_transfer_engine", json={"init_info": info}, timeout=120))
        self.assertEqual(response.status_code, 200, response.text)

    def update(self, tensors):
        """start, update_weights with the bytes on the wire; the update's response."""
        self.assertEqual(self.daemon.post("/start_weight_update").status_code, 200)
        sender = self.trainer.send_async(tensors)
        response = self.daemon.post("/update_weights",
                                    json={"update_info": tcp_trainer.update_info(tensors)},
                                    timeout=120)
        sender.join(120)
        return response

    def sync(self, weights, dtype, version):
        response = self.update(tensors_of(weights, dtype))
        self.assertEqual(response.status_code, 200, response.text)
        response = self.daemon.post("/finish_weight_update", json={"weight_version": version})
        self.assertEqual(response.status_code, 200, response.text)

    def greedy(self, prompt):
        return harness.greedy(self.daemon, prompt, TOKENS)

    def assert_matches(self, model, label):
        for prompt in PROMPTS:
            tokens, logprobs = self.greedy(prompt)
            expected_tokens, expected_logprobs = model.greedy(prompt, TOKENS)
            self.assertEqual(tokens, [int(t) for t in expected_tokens], f"{label}, prompt {prompt}")
            worst = max(abs(a - b) for a, b in zip(logprobs, expected_logprobs))
            self.assertLess(worst, 1e-6, f"{label}, prompt {prompt}")

    def test_greedy_tokens_and_logprobs_equal_the_trainers_after_every_sync(self):
        first = llama_numpy.init_weights(self.config, seed=1)
        model = llama_numpy.Model(self.config, llama_numpy.round_to(first, "float32"))
        differing = sum(self.greedy(p)[0] != [int(t) for t in model.greedy(p, TOKENS)[0]]
                        for p in PROMPTS)
        self.assertEqual(differing, len(PROMPTS), "dummy weights answered like the trainer's")

        for step, dtype in enumerate(["float32", "bfloat16", "float32"], start=1):
            weights = llama_numpy.init_weights(self.config, seed=step)
            self.sync(weights, dtype, f"step-{step}")
            self.assertEqual(self.daemon.get("/weight_info").json(),
                             {"weight_version": f"step-{step}"})
            model = llama_numpy.Model(self.config, llama_numpy.round_to(weights, dtype))
            self.assert_matches(model, f"step {step} ({dtype})")

    def test_a_tensor_that_does_not_fit_fails_its_update_by_name_and_changes_nothing(self):
        weights = llama_numpy.init_weights(self.config, seed=4)
        self.sync(weights, "float32", "good")
        model = llama_numpy.Model(self.config, llama_numpy.round_to(weights, "float32"))
        other = llama_numpy.init_weights(self.config, seed=5)
        good = tensors_of(other, "float32")
        head = other["lm_head.weight"]
        misfits = {
            "model.layers.9.mlp.up_proj.weight":
                tcp_trainer.Tensor("model.layers.9.mlp.up_proj.weight", "float32", [2, 2],
                                   bytes(16)),
            "Attempted to load weight":
                tcp_trainer.Tensor("lm_head.weight", "float32", [head.shape[1], head.shape[0]],
                                   llama_numpy.tensor_bytes(head.T, "float32")),
            "cannot load dtype 'int64'":
                tcp_trainer.Tensor("model.norm.weight", "int64", [self.config["hidden_size"]],
                                   bytes(8 * self.config["hidden_size"])),
        }
        for words, misfit in misfits.items():
            # The misfit between good tensors: all of them are read off the wire, none is kept.
            response = self.update(good[:3] + [misfit] + good[3:])
            self.assertGreaterEqual(response.status_code, 400, response.text)
            self.assertIn(words, response.text)
            finish = self.daemon.post("/finish_weight_update", json={"weight_version": "bad"})
            self.assertGreaterEqual(finish.status_code, 400, finish.text)  # session abandoned
            self.assertEqual(self.daemon.get("/weight_info").json(), {"weight_version": "good"})
            tokens, _ = self.greedy(PROMPTS[0])
            self.assertEqual(tokens, [int(t) for t in model.greedy(PROMPTS[0], TOKENS)[0]])
        # The transfer group is still in step: the next correct update lands.
        self.sync(other, "float32", "next")
        self.assertEqual(self.daemon.get("/weight_info").json(), {"weight_version": "next"})
        self.assert_matches(llama_numpy.Model(self.config, llama_numpy.round_to(other, "float32")),
                            "after the failed updates")

    def test_the_weight_checker_sees_the_models_weights(self):
        """vLLM's weight-checker workflow: the checksums are the model's, in the dtype it was
        sent; a reset or a level-2 sleep changes what it generates until the weights return."""
        weights = llama_numpy.init_weights(self.config, seed=6)
        tensors = tensors_of(weights, "bfloat16")
        model = llama_numpy.Model(self.config, llama_numpy.round_to(weights, "bfloat16"))
        expected = tcp_trainer.checksums(tensors, tp=2)
        dummy = self.daemon.post("/weight_checker", json={"action": "checksum"}).json()
        self.assertEqual(dummy["checksums"].keys(), expected.keys())
        self.assertTrue(all(dummy["checksums"][k] != v for k, v in expected.items()))

        self.sync(weights, "bfloat16", "v1")
        compare = {"action": "compare", "baseline": expected}
        self.assertEqual(self.daemon.post("/weight_checker", json=compare).json()["match"], True)
        for corrupt in [lambda: self.daemon.post("/weight_checker", json={"action": "reset"}),
                        lambda: self.daemon.post("/sleep?level=2")]:
            self.assertEqual(self.daemon.post("/pause?mode=abort").status_code, 200)
            self.assertEqual(corrupt().status_code, 200)
            self.assertEqual(self.daemon.post("/wake_up").status_code, 200)
            self.assertEqual(self.daemon.post("/resume").status_code, 200)
            result = self.daemon.post("/weight_checker", json=compare).json()
            self.assertEqual(sorted(result["mismatches"]), sorted(expected))
            tokens, _ = self.greedy(PROMPTS[2])
            self.assertNotEqual(tokens, [int(t) for t in model.greedy(PROMPTS[2], TOKENS)[0]])
            self.sync(weights, "bfloat16", "v1")
            self.assertEqual(self.daemon.post("/weight_checker", json=compare).json()["match"],
                             True)
            self.assert_matches(model, "weights sent again")

    def test_vllms_weight_checker_example_reloads_the_models_weights(self):
        """examples/rl/weight_checker.py's steps: checksum, pause, reset, reload_weights,
        reset the prefix cache, compare, resume; the engine answers as before the reset."""
        before = [self.greedy(prompt)[0] for prompt in PROMPTS]
        baseline = self.daemon.post("/weight_checker", json={"action": "checksum"}).json()
        self.assertEqual(len(baseline["checksums"]),
                         2 * len(llama_numpy.parameter_shapes(self.config)))  # TP=2
        self.assertEqual(self.daemon.post("/pause?mode=abort").status_code, 200)
        self.assertEqual(self.daemon.post("/weight_checker", json={"action": "reset"}).status_code,
                         200)
        reload = self.daemon.post("/collective_rpc",
                                  json={"method": "reload_weights", "timeout": 900})
        self.assertEqual(reload.status_code, 200, reload.text)
        reset = self.daemon.post("/reset_prefix_cache?reset_running_requests=True")
        self.assertEqual(reset.json(), {"success": True})
        compare = self.daemon.post("/weight_checker", json={
            "action": "compare", "baseline": baseline["checksums"]}).json()
        self.assertEqual((compare["match"], compare["mismatches"]), (True, []))
        self.assertEqual(self.daemon.post("/resume").status_code, 200)
        self.assertEqual([self.greedy(prompt)[0] for prompt in PROMPTS], before)


if __name__ == "__main__":
    unittest.main()
