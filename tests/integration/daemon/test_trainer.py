"""A trainer written exactly like vLLM's HTTPVLLMWeightSyncClient (requests, 300 s timeout,
raise_for_status, no body at all for start and a version-less finish) runs whole weight-sync
lifecycles against vllmd in embedded mode: no engine flags, the in-process reference engine."""

import threading
import unittest

import requests

import harness


class WeightSyncClient:
    """The HTTP calls of vLLM's HTTPVLLMWeightSyncClient, as it makes them."""

    def __init__(self, base_url, timeout=300):
        self.base_url = base_url
        self.timeout = timeout

    def _post(self, path, body=None):
        if body is None:
            response = requests.post(f"{self.base_url}{path}", timeout=self.timeout)
        else:
            response = requests.post(f"{self.base_url}{path}", json=body, timeout=self.timeout)
        response.raise_for_status()
        return response.json()

    def _get(self, path, params=None):
        response = requests.get(f"{self.base_url}{path}", params=params, timeout=self.timeout)
        response.raise_for_status()
        return response

    def health(self):
        return self._get("/health").status_code == 200

    def get_world_size(self, include_dp=True):
        params = None if include_dp else {"include_dp": "false"}
        return self._get("/get_world_size", params).json()["world_size"]

    def init_weight_transfer_engine(self, init_info):
        return self._post("/init_weight_transfer_engine", {"init_info": init_info})

    def pause(self, mode="abort", clear_cache=True):
        return self._post(f"/pause?mode={mode}&clear_cache={str(clear_cache).lower()}")

    def resume(self):
        return self._post("/resume")

    def is_paused(self):
        return self._get("/is_paused").json()["is_paused"]

    def start_weight_update(self):
        return self._post("/start_weight_update")  # no body at all

    def update_weights(self, update_info):
        return self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version=None):
        if weight_version is None:
            return self._post("/finish_weight_update")  # no body at all
        return self._post("/finish_weight_update", {"weight_version": weight_version})

    def get_weight_version(self):
        return self._get("/weight_info").json()["weight_version"]


class TrainerTest(harness.DaemonTestCase):

    def setUp(self):
        super().setUp()
        self.daemon = self.start_daemon(["--dev-mode"])  # embedded: no engine flags
        self.client = WeightSyncClient(self.daemon.url)
        harness.wait_until(self._healthy, 20, message="the embedded engine to be healthy")

    def _healthy(self):
        try:
            return self.client.health()
        except requests.RequestException:
            return False

    def test_trainer_lifecycle(self):
        self.assertTrue(self.client.health())
        world_size = self.client.get_world_size()
        self.assertEqual(world_size, 1)
        self.assertEqual(self.client.get_world_size(include_dp=False), 1)

        # NCCL: the trainer is rank 0 of a group of W+1 and issues init from a side thread,
        # because the call blocks until the trainer joins the rendezvous.
        init_info = {"master_address": harness.HOST, "master_port": harness.free_port(),
                     "rank_offset": 1, "world_size": world_size + 1}
        outcome = {}

        def init():
            try:
                outcome["result"] = self.client.init_weight_transfer_engine(init_info)
            except Exception as error:  # reported by the main thread
                outcome["error"] = error

        side = threading.Thread(target=init, daemon=True)
        side.start()
        side.join(timeout=60)
        self.assertFalse(side.is_alive(), "init_weight_transfer_engine did not return")
        self.assertNotIn("error", outcome, outcome)
        self.assertEqual(outcome["result"], {"message": "Weight transfer initialized"})

        for step in (1, 2):
            with self.subTest(step=step):
                self.assertEqual(self.client.pause(), {"status": "paused"})
                self.assertTrue(self.client.is_paused())
                self.assertEqual(self.client.start_weight_update(),
                                 {"message": "Weight update started"})
                for chunk in range(3):
                    self.assertEqual(
                        self.client.update_weights(
                            harness.update_info(f"layers.{chunk}.q_proj.weight",
                                                f"layers.{chunk}.k_proj.weight")),
                        {"message": "Weights updated"})
                self.assertEqual(self.client.finish_weight_update(f"step-{step}"),
                                 {"message": "Weight update finished"})
                self.assertEqual(self.client.resume(), {"status": "resumed"})
                self.assertFalse(self.client.is_paused())
                self.assertEqual(self.client.get_weight_version(), f"step-{step}")

        # A version-less finish keeps the version.
        self.assertEqual(self.client.start_weight_update(), {"message": "Weight update started"})
        self.assertEqual(self.client.update_weights([harness.update_info()]),
                         {"message": "Weights updated"})
        self.assertEqual(self.client.finish_weight_update(), {"message": "Weight update finished"})
        self.assertEqual(self.client.get_weight_version(), "step-2")

    def test_engine_failures_raise_for_status(self):
        # finish without start: the engine refuses, the trainer's raise_for_status raises.
        with self.assertRaises(requests.HTTPError) as raised:
            self.client.finish_weight_update("step-1")
        self.assertEqual(raised.exception.response.status_code, 500)
        self.assertIn("finish_weight_update called without a matching start_weight_update",
                      raised.exception.response.json()["error"]["message"])
        # A rejected payload is a 400, also raised.
        with self.assertRaises(requests.HTTPError) as raised:
            self.client.update_weights("not an object")
        self.assertEqual(raised.exception.response.status_code, 400)
        self.assertEqual(self.client.get_weight_version(), "default")


if __name__ == "__main__":
    unittest.main()
