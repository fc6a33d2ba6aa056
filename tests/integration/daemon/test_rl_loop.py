"""An RL job learns through vllmd without a GPU: examples/rl_loop.py (rollouts through
/inference/v1/generate, a verifiable reward, a policy-gradient step, the sync over the tcp
backend with /pause?mode=keep) against vllmd whose embedded engine runs the same Llama. With
the sync the mean reward rises from its start to 0.8 within 90 s, every step's rollouts come
from the version the step before committed, and the train-inference mismatch stays under
1e-6; without the sync the reward stays where it began, which shows the sync is what made it
learn."""

import json
import os
import subprocess
import time
import unittest

import harness

RL_LOOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples",
                       "rl_loop.py")


class RlLoopTest(harness.DaemonTestCase):

    def run_loop(self, *flags, timeout=90):
        model_dir = os.path.join(self.workdir, "model")
        subprocess.run(["/usr/bin/python3", RL_LOOP, "init", model_dir], check=True,
                       capture_output=True, timeout=60)
        daemon = self.start_daemon(["--dev-mode", "--model", model_dir],
                                   env=harness.clean_env({"VLLMD_BACKEND": "tcp"}))
        daemon.wait_healthy()  # listening comes before the engine's READY
        begin = time.monotonic()
        result = subprocess.run(
            ["/usr/bin/python3", RL_LOOP, "train", "--server", daemon.url, "--model", model_dir,
             "--json", *flags], capture_output=True, text=True, timeout=timeout)
        elapsed = time.monotonic() - begin
        steps = [json.loads(line) for line in result.stdout.splitlines()]
        self.assertTrue(steps, result.stderr)
        return result, steps, elapsed

    def test_the_loop_learns_with_the_sync(self):
        result, steps, elapsed = self.run_loop("--steps", "60", "--target-reward", "0.8")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertLess(elapsed, 90)
        self.assertLess(steps[0]["mean_reward"], 0.2)  # 1/16 of the tokens by chance
        self.assertGreaterEqual(steps[-1]["mean_reward"], 0.8)
        for step in steps:
            self.assertLess(step["mismatch"], 1e-6, step)
            previous = "default" if step["step"] == 1 else f"step-{step['step'] - 1}"
            self.assertEqual(step["rollout_versions"], [previous], step)

    def test_without_the_sync_it_does_not_learn(self):
        result, steps, _ = self.run_loop("--steps", "25", "--target-reward", "0.8",
                                         "--no-sync")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(len(steps), 25)
        self.assertLess(max(step["mean_reward"] for step in steps), 0.2)
        self.assertTrue(all(step["rollout_versions"] == ["default"] for step in steps))
        # The trainer moved on alone: its logprobs part from the engine's.
        self.assertGreater(steps[-1]["mismatch"], 1e-3)


if __name__ == "__main__":
    unittest.main()
