#!/usr/bin/python3
"""A whole RL job against vllmd without a GPU: rollouts through vllmd, a verifiable reward, a
policy-gradient step, the new weights synced back, and again.

The engine (vllmd's embedded engine or vllm-ref-engine) runs the same small Llama the trainer
holds (examples/llama_numpy.py). The task: make completions use tokens of a target set (ids
100-131, 1/16 of the vocabulary); the reward is the fraction of a completion's tokens in it,
about 0.06 for the starting model. Each step:

  1. rollouts: POST /inference/v1/generate for 8 prompts, n=8 samples of 8 tokens each at
     temperature 1, with logprobs (each choice says which weight version made its tokens);
  2. reward, and the group-relative advantage (reward minus its prompt's mean);
  3. a policy-gradient step on the lm_head (REINFORCE on the head's log-softmax; the rest of
     the model stays fixed, which keeps the gradient a few lines of numpy);
  4. the sync: /pause?mode=keep, /start_weight_update, every tensor over the tcp backend
     (float32), /finish_weight_update with the step as the version, /resume.

It prints, per step, the mean reward, the version the rollouts came from and the train-inference
mismatch: the largest difference between vllmd's logprob of a sampled token and the trainer's own.

    python3 examples/rl_loop.py init /tmp/tiny-llama          # the starting checkpoint
    VLLMD_BACKEND=tcp vllmd --dev-mode --model /tmp/tiny-llama --port 8000 &
    python3 examples/rl_loop.py train --server http://127.0.0.1:8000 --model /tmp/tiny-llama

Debian's /usr/bin/python3 with python3-numpy; the standard library otherwise.
"""

import argparse
import concurrent.futures
import json
import os
import sys
import time
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_numpy  # noqa: E402
import tcp_trainer  # noqa: E402

TARGET = np.arange(100, 132)
PROMPTS, SAMPLES, TOKENS, PROMPT_LENGTH = 8, 8, 8, 4


def post(server, path, body=None, timeout=600):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"POST {path}: {error.code} {error.read().decode()}") from None
    return json.loads(text) if text else None


def get(server, path):
    with urllib.request.urlopen(server + path, timeout=60) as response:
        return json.loads(response.read().decode())


def reward(tokens):
    return float(np.isin(tokens, TARGET).mean())


class Trainer:
    """The policy (float32 weights, as it sends them) and its connection to the engines."""

    def __init__(self, server, model_dir, learning_rate):
        self.server = server
        self.config, weights = llama_numpy.read_model_dir(model_dir)
        self.weights = llama_numpy.round_to(weights, "float32")
        self.model = llama_numpy.Model(self.config, self.weights)
        self.learning_rate = learning_rate
        self.head = "model.embed_tokens.weight" if self.config.get("tie_word_embeddings") \
            else "lm_head.weight"
        workers = get(server, "/get_world_size")["world_size"]
        self.transfer = tcp_trainer.TcpTrainer(workers)
        self.transfer.initialize(
            lambda info: post(server, "/init_weight_transfer_engine", {"init_info": info}))

    def rollout(self, prompt, seed):
        answer = post(self.server, "/inference/v1/generate", {
            "token_ids": prompt,
            "sampling_params": {"n": SAMPLES, "max_tokens": TOKENS, "temperature": 1.0,
                                "seed": seed, "logprobs": 0, "ignore_eos": True}})
        return [(choice["token_ids"], [item["logprob"] for item in choice["logprobs"]["content"]],
                 [v["version"] for v in choice.get("weight_versions", [])])
                for choice in answer["choices"]]

    def policy_gradient(self, batch):
        """REINFORCE with group-relative advantages, on the head: d log p(token) / d W is
        (onehot(token) - softmax(logits)) outer features."""
        head = self.weights[self.head]
        gradient = np.zeros_like(head)
        for prompt, samples in batch:
            rewards = np.array([reward(tokens) for tokens, _, _ in samples])
            for (tokens, _, _), advantage in zip(samples, rewards - rewards.mean()):
                if advantage == 0:
                    continue
                features = self.model.features(prompt + tokens)[len(prompt) - 1:-1]
                probs = np.exp(llama_numpy.log_softmax(features @ head.T))
                probs[np.arange(len(tokens)), tokens] -= 1.0
                gradient -= advantage * probs.T @ features
        count = sum(len(samples) for _, samples in batch)
        self.weights[self.head] = llama_numpy.round_to(
            head + self.learning_rate * gradient / count, "float32")
        self.model = llama_numpy.Model(self.config, self.weights)

    def sync(self, version):
        tensors = [tcp_trainer.Tensor(name, "float32", list(array.shape),
                                      llama_numpy.tensor_bytes(array, "float32"))
                   for name, array in self.weights.items()]
        post(self.server, "/pause?mode=keep")
        post(self.server, "/start_weight_update")
        sender = self.transfer.send_async(tensors)
        post(self.server, "/update_weights", {"update_info": tcp_trainer.update_info(tensors)})
        sender.join()
        post(self.server, "/finish_weight_update", {"weight_version": version})
        post(self.server, "/resume")

    def mismatch(self, batch):
        worst = 0.0
        for prompt, samples in batch:
            for tokens, logprobs, _ in samples:
                own = self.model.token_logprobs(prompt, tokens)
                worst = max(worst, float(np.max(np.abs(own - np.array(logprobs)))))
        return worst


def train(args):
    trainer = Trainer(args.server, args.model, args.learning_rate)
    random = np.random.default_rng(args.seed)
    vocab = trainer.config["vocab_size"]
    pool = concurrent.futures.ThreadPoolExecutor(PROMPTS)
    begin = time.monotonic()
    history = []
    for step in range(1, args.steps + 1):
        prompts = [[int(t) for t in random.integers(3, vocab, PROMPT_LENGTH)]
                   for _ in range(PROMPTS)]
        seeds = [step * 1000 + i for i in range(PROMPTS)]
        batch = list(zip(prompts, pool.map(trainer.rollout, prompts, seeds)))
        # The trainer's logprobs before its step: the weights the engines were sent.
        mismatch = trainer.mismatch(batch)
        mean = float(np.mean([reward(t) for _, samples in batch for t, _, _ in samples]))
        versions = sorted({v for _, samples in batch for _, _, vs in samples for v in vs})
        trainer.policy_gradient(batch)
        if not args.no_sync:
            trainer.sync(f"step-{step}")
        record = {"step": step, "mean_reward": round(mean, 4), "rollout_versions": versions,
                  "mismatch": mismatch, "seconds": round(time.monotonic() - begin, 2)}
        history.append(record)
        if args.json:
            print(json.dumps(record), flush=True)
        else:
            print(f"step {step:3d}  reward {mean:.3f}  rollouts from {','.join(versions)}  "
                  f"mismatch {mismatch:.1e}", flush=True)
        if mean >= args.target_reward:
            print(f"reached mean reward {args.target_reward} at step {step} "
                  f"({time.monotonic() - begin:.1f} s)", file=sys.stderr)
            return 0
    print(f"mean reward stayed below {args.target_reward} for {args.steps} steps",
          file=sys.stderr)
    return 1


def init(args):
    config = llama_numpy.config_dict()
    weights = llama_numpy.init_weights(config, seed=args.seed)
    llama_numpy.write_model_dir(args.directory, config, weights, dtype="float32")
    print(f"wrote {args.directory}: config.json and model.safetensors (Llama, hidden "
          f"{config['hidden_size']}, {config['num_hidden_layers']} layers, vocabulary "
          f"{config['vocab_size']})")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("init", help="write the starting checkpoint")
    start.add_argument("directory")
    start.add_argument("--seed", type=int, default=0)
    loop = commands.add_parser("train", help="run the RL loop against vllmd")
    loop.add_argument("--server", default="http://127.0.0.1:8000")
    loop.add_argument("--model", required=True, help="the directory `init` wrote")
    loop.add_argument("--steps", type=int, default=40)
    loop.add_argument("--learning-rate", type=float, default=10.0)
    loop.add_argument("--target-reward", type=float, default=0.8)
    loop.add_argument("--seed", type=int, default=0)
    loop.add_argument("--no-sync", action="store_true",
                      help="never send the new weights (the control: nothing is learned)")
    loop.add_argument("--json", action="store_true", help="one JSON line per step")
    args = parser.parse_args()
    return init(args) if args.command == "init" else train(args)


if __name__ == "__main__":
    sys.exit(main())
