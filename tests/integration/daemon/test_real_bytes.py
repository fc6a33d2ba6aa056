"""Real bytes without a GPU: DP=2 x TP=2 reference engines on the "tcp" backend (NCCL-shaped,
bytes over TCP), a trainer (examples/tcp_trainer.py) sending a few MB of tensors per step
for several steps through vllmd, and vLLM's weight checksums (compute_weight_checksums
through /collective_rpc) matching the trainer's own SHA-256 on every worker; one flipped
byte in transit shows up on exactly the worker that got it."""

import json
import os
import subprocess
import sys
import unittest

import harness

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "examples"))
import tcp_trainer  # noqa: E402


class RealBytesTest(harness.DaemonTestCase):

    def setUp(self):
        super().setUp()
        self.daemon, self.engines, _ = self.start_external(dp=2, tp=2, backend="tcp")
        self.assertEqual(self.daemon.get("/get_world_size").json(), {"world_size": 4})
        self.trainer = tcp_trainer.TcpTrainer(4)
        self.addCleanup(self.trainer.close)
        response = self.trainer.initialize(lambda info: self.daemon.post(
            "/init_weight_transfer_engine", json={"init_info": info}, timeout=120))
        self.assertEqual(response.status_code, 200, response.text)
        self.assertEqual(sorted(self.trainer.connections), [1, 2, 3, 4])

    def sync(self, tensors, version, corrupt_rank=None):
        self.assertEqual(self.daemon.post("/start_weight_update").status_code, 200)
        sender = self.trainer.send_async(tensors, corrupt_rank)
        response = self.daemon.post("/update_weights",
                                    json={"update_info": tcp_trainer.update_info(tensors)},
                                    timeout=120)
        sender.join(120)
        self.assertEqual(response.status_code, 200, response.text)
        response = self.daemon.post("/finish_weight_update", json={"weight_version": version})
        self.assertEqual(response.status_code, 200, response.text)

    def held(self):
        response = self.daemon.post("/collective_rpc", json={"method": "compute_weight_checksums"})
        self.assertEqual(response.status_code, 200, response.text)
        merged = {}
        for worker in response.json()["results"]:
            merged.update(worker)
        return merged

    def test_every_worker_holds_the_bytes_the_trainer_sent(self):
        for step in range(1, 4):
            tensors = [tcp_trainer.random_tensor("model.layers.0.mlp.weight", "float32",
                                                 [512, 1024]),
                       tcp_trainer.random_tensor("model.layers.0.norm.weight", "bfloat16",
                                                 [1024]),
                       tcp_trainer.random_tensor("model.embed.weight", "bfloat16", [256, 1024])]
            self.sync(tensors, f"step-{step}")
            expected = tcp_trainer.checksums(tensors, dp=2, tp=2)
            self.assertEqual(self.held(), expected)
            self.assert_json(self.daemon.post("/weight_checker",
                                              json={"action": "compare", "baseline": expected}),
                             200, {"match": True, "mismatches": [], "ranks": []})
            self.assertEqual(self.daemon.get("/weight_info").json(),
                             {"weight_version": f"step-{step}"})

    def test_a_flipped_byte_shows_on_the_worker_that_got_it(self):
        tensors = [tcp_trainer.random_tensor("w", "float32", [256, 256])]
        self.sync(tensors, "flipped", corrupt_rank=3)  # global worker 2: dp1, tp0
        expected = tcp_trainer.checksums(tensors, dp=2, tp=2)
        held = self.held()
        self.assertEqual(sorted(key for key in expected if held[key] != expected[key]),
                         ["dp1:pp0:pcp0:tp0:ep0:w"])
        self.assert_json(self.daemon.post("/weight_checker",
                                          json={"action": "compare", "baseline": expected}),
                         200, {"match": False, "mismatches": ["dp1:pp0:pcp0:tp0:ep0:w"],
                               "ranks": ["dp1:pp0:pcp0:tp0:ep0"]})
        checksum = self.daemon.post("/weight_checker", json={"action": "checksum"}).json()
        self.assertEqual(len(checksum["checksums"]), 4)
        self.assertEqual(len(checksum["ranks"]), 4)

    def test_reset_weights_and_a_level_2_sleep_change_what_the_workers_hold(self):
        tensors = [tcp_trainer.random_tensor("w", "bfloat16", [128, 128])]
        self.sync(tensors, "v1")
        expected = tcp_trainer.checksums(tensors, dp=2, tp=2)
        self.assertEqual(self.held(), expected)
        self.assert_json(self.daemon.post("/weight_checker", json={"action": "reset"}), 200,
                         {"status": "reset"})
        self.assertTrue(all(self.held()[key] != digest for key, digest in expected.items()))
        self.sync(tensors, "v2")
        self.assertEqual(self.held(), expected)
        self.assertEqual(self.daemon.post("/sleep?level=2").status_code, 200)
        self.assertEqual(self.daemon.post("/wake_up").status_code, 200)
        self.assertTrue(all(self.held()[key] != digest for key, digest in expected.items()))

    def vllmctl_sync(self, tensors, version, corrupt_rank=None):
        """weights sync --verify with the trainer's checksums, the bytes sent meanwhile."""
        path = os.path.join(self.workdir, f"{version}.update.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(tcp_trainer.update_info(tensors), handle)
        baseline = os.path.join(self.workdir, f"{version}.checksums.json")
        with open(baseline, "w", encoding="utf-8") as handle:
            json.dump(tcp_trainer.checksums(tensors, dp=2, tp=2), handle)
        sender = self.trainer.send_async(tensors, corrupt_rank)
        result = subprocess.run(
            [harness.binary("VLLMCTL_BIN"), "--server", self.daemon.url, "weights", "sync",
             "--update", path, "--verify", baseline, "--version", version],
            capture_output=True, text=True, timeout=120, env=harness.clean_env())
        sender.join(120)
        return result

    def test_weights_sync_verify_commits_only_what_every_worker_holds(self):
        tensors = [tcp_trainer.random_tensor("model.w", "float32", [512, 512])]
        result = self.vllmctl_sync(tensors, "verified-1")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("checksums match the baseline", result.stdout)
        self.assertEqual(self.daemon.get("/weight_info").json(), {"weight_version": "verified-1"})
        # One flipped byte on its way to one worker: nothing committed, the key named, exit 65.
        result = self.vllmctl_sync(tensors, "verified-2", corrupt_rank=2)
        self.assertEqual(result.returncode, 65, result.stderr)
        self.assertIn("checksums differ on 1 key: dp0:pp0:pcp0:tp1:ep0:model.w", result.stderr)
        self.assertIn("failed at verify; weight version not committed", result.stderr)
        self.assertEqual(self.daemon.get("/weight_info").json(), {"weight_version": "verified-1"})
        self.assertEqual(self.daemon.get("/is_paused").json(), {"is_paused": False})

    def test_bytes_that_do_not_match_update_info_fail_the_update(self):
        tensors = [tcp_trainer.random_tensor("w", "float32", [64, 64])]
        wrong = [tcp_trainer.Tensor("w", "float32", [64, 64], b"\0" * 100)]
        self.assertEqual(self.daemon.post("/start_weight_update").status_code, 200)
        sender = self.trainer.send_async(wrong)
        response = self.daemon.post("/update_weights",
                                    json={"update_info": tcp_trainer.update_info(tensors)},
                                    timeout=120)
        sender.join(120)
        self.assertEqual(response.status_code, 500, response.text)
        self.assertIn("the trainer sent 100 bytes where update_info's dtype and shape say 16384",
                      response.json()["error"]["message"])


if __name__ == "__main__":
    unittest.main()
