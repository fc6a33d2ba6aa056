"""--model and --load-format, for vllm-ref-engine and vllmd's embedded engine: weights from
safetensors (one file or an index over shards, float32 or bfloat16) generate exactly what the
trainer-side model (examples/llama_numpy.py) does with them; a checkpoint or config the engine
cannot run is refused at start with a message that says what and where."""

import json
import os
import subprocess
import sys
import unittest

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "examples"))
import llama_numpy  # noqa: E402

PROMPT = [7, 300, 12, 45]


class ModelLoadingTest(harness.DaemonTestCase):

    def model_dir(self, name="model", dtype="float32", shards=1, seed=3, **config):
        directory = os.path.join(self.workdir, name)
        self.config = llama_numpy.config_dict(**config)
        weights = llama_numpy.init_weights(self.config, seed=seed)
        llama_numpy.write_model_dir(directory, self.config, weights, dtype=dtype, shards=shards)
        self.model = llama_numpy.Model(self.config, llama_numpy.round_to(weights, dtype))
        return directory

    def assert_generates_like_the_model(self, daemon):
        tokens, logprobs = harness.greedy(daemon, PROMPT, 64)
        expected, expected_logprobs = self.model.greedy(PROMPT, 64)
        self.assertEqual(tokens, expected)
        self.assertLess(max(abs(a - b) for a, b in zip(logprobs, expected_logprobs)), 1e-6)

    def refused(self, argv, env=None):
        """A process that must exit at start: its exit status and what it printed."""
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                env=env or harness.clean_env())
        return result.returncode, result.stdout + result.stderr

    def test_an_engine_runs_safetensors_shards_in_bfloat16(self):
        directory = self.model_dir(dtype="bfloat16", shards=3, tie_word_embeddings=True)
        self.assertTrue(os.path.exists(os.path.join(directory, "model.safetensors.index.json")))
        daemon, _, _ = self.start_external(
            engine_extra={0: ["--model", directory, "--load-format", "safetensors"]})
        self.assert_generates_like_the_model(daemon)
        # The registration carries the model's context length.
        self.assertEqual(daemon.get("/v1/models").json()["data"][0]["max_model_len"],
                         self.config["max_position_embeddings"])

    def test_the_embedded_engine_loads_the_model_directory(self):
        directory = self.model_dir()
        daemon = self.start_daemon(["--dev-mode", "--model", directory])
        daemon.wait_healthy()  # listening comes before the engine's READY
        self.assert_generates_like_the_model(daemon)
        self.assertIn("embedded engine: Llama from", daemon.log())

    def test_the_embedded_engine_keeps_the_formula_for_a_metadata_only_directory(self):
        directory = os.path.join(self.workdir, "metadata")
        os.makedirs(directory)
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
            json.dump({"vocab_size": 1000, "eos_token_id": 2}, handle)
        daemon = self.start_daemon(["--dev-mode", "--model", directory])
        daemon.wait_healthy()
        self.assertIn("has no safetensors weights; tokens follow the reference formula",
                      daemon.log())
        self.assertEqual(len(harness.greedy(daemon, PROMPT, 4)[0]), 4)
        status, output = self.refused([harness.vllmd_bin(), "--dev-mode", "--model", directory,
                                       "--load-format", "safetensors", "--port", "0"])
        self.assertNotEqual(status, 0)
        self.assertIn("cannot load the model", output)
        self.assertIn("hidden_size", output)  # not a Llama config: refused before the weights

    def test_a_bad_safetensors_header_is_refused_naming_the_file(self):
        directory = self.model_dir()
        path = os.path.join(directory, "model.safetensors")
        with open(path, "r+b") as handle:
            handle.write((10**12).to_bytes(8, "little"))  # a header longer than the file
        status, output = self.refused([harness.engine_bin(), "--handshake",
                                       "tcp://127.0.0.1:9", "--model", directory])
        self.assertEqual(status, 1)
        self.assertIn("cannot load --model", output)
        self.assertIn(path, output)
        status, output = self.refused([harness.vllmd_bin(), "--dev-mode", "--model", directory,
                                       "--port", "0"])
        self.assertNotEqual(status, 0)
        self.assertIn(path, output)

    def test_a_config_the_engine_cannot_run_is_refused_at_start(self):
        directory = self.model_dir()
        config_path = os.path.join(directory, "config.json")
        for change, words in [({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
                               "rope_scaling"),
                              ({"architectures": ["Qwen2ForCausalLM"]}, "Qwen2ForCausalLM")]:
            with open(config_path, "w", encoding="utf-8") as handle:
                json.dump({**self.config, **change}, handle)
            status, output = self.refused([harness.engine_bin(), "--handshake",
                                           "tcp://127.0.0.1:9", "--model", directory,
                                           "--load-format", "dummy"])
            self.assertEqual(status, 1, output)
            self.assertIn(words, output)

    def test_a_checkpoint_missing_a_parameter_is_refused_naming_it(self):
        directory = os.path.join(self.workdir, "partial")
        config = llama_numpy.config_dict()
        weights = llama_numpy.init_weights(config, seed=1)
        del weights["model.layers.1.mlp.down_proj.weight"]
        os.makedirs(directory)
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        llama_numpy.write_safetensors(os.path.join(directory, "model.safetensors"),
                                      {name: ("float32", array) for name, array in weights.items()})
        status, output = self.refused([harness.engine_bin(), "--handshake",
                                       "tcp://127.0.0.1:9", "--model", directory])
        self.assertEqual(status, 1, output)
        self.assertIn("model.layers.1.mlp.down_proj.weight", output)


if __name__ == "__main__":
    unittest.main()
