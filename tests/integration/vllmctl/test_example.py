"""examples/rl_sync.sh: the training-loop script, run for real."""

import json
import os
import subprocess

from test_wire import FakeServer, error
from ctl_harness import CtlTestCase
from harness import binary, call_names, clean_env, free_port

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples",
                      "rl_sync.sh")


class ExampleTest(CtlTestCase):
    def run_script(self, steps, **env):
        env = clean_env({"VLLMCTL": binary("VLLMCTL_BIN"), "VLLMCTL_SERVER": self.server,
                         "RETRY_DELAY": "0.1", **env})
        return subprocess.run(["bash", SCRIPT, str(steps)], env=env, capture_output=True,
                              text=True, timeout=120, cwd=self.workdir)

    def test_syncs_every_step(self):
        daemon, engine = self.start_external()
        result = self.assert_ok(self.run_script(3))
        self.assertIn("step 3: weights synced; serving step-3", result.stderr)
        names = call_names(engine.calls())
        self.assertEqual(names.count("init_weight_transfer_engine"), 1,
                         "the job initializes once, not every step")
        self.assertEqual(names.count("finish_weight_update"), 3)
        self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "step-3"})
        self.assertEqual(daemon.get("/is_paused").json(), {"is_paused": False})

    def test_gives_up_on_an_unreachable_daemon(self):
        self.server = f"http://127.0.0.1:{free_port()}"
        result = self.assert_exit(self.run_script(1, MAX_ATTEMPTS="2"), 69,
                                  "health check: exit code 69 after 2 attempts; giving up")
        self.assertIn("retrying in 0.1 s", result.stderr)

    def test_stops_at_an_engine_failure(self):
        daemon, engine = self.start_external("--inject-fail", "update_weights")
        result = self.assert_exit(self.run_script(3), 70,
                                  "step 1: sync: exit code 70; stopping")
        self.assertNotIn("retrying", result.stderr)
        self.assertEqual(call_names(engine.calls()).count("start_weight_update"), 1)
        self.assertEqual(daemon.get("/is_paused").json(), {"is_paused": False})

    def test_retries_a_sync_that_found_the_engine_unavailable(self):
        pauses = []

        def respond(method, path):
            if path.split("?")[0] == "/pause":
                pauses.append(path)
                if len(pauses) == 1:
                    return 503, error("engine rank 0 is dead")
                return 200, '{"status":"paused"}'
            replies = {"/get_world_size": {"world_size": 2}, "/resume": {"status": "resumed"},
                       "/weight_info": {"weight_version": "step-1"}}
            return 200, json.dumps(replies.get(path, {"message": "ok"}))

        fake = FakeServer(respond)
        self.addCleanup(fake.close)
        self.server = fake.url
        result = self.assert_ok(self.run_script(1))
        self.assertIn("step 1: sync: exit code 69 (attempt 1 of 5); retrying in 0.1 s",
                      result.stderr)
        paths = [request["path"].split("?")[0] for request in fake.requests]
        # Init once; the sync's first attempt: pause (503), resume; the second: the whole sync.
        self.assertEqual(paths[paths.index("/init_weight_transfer_engine"):], [
            "/init_weight_transfer_engine", "/pause", "/resume",
            "/pause", "/start_weight_update", "/update_weights",
            "/finish_weight_update", "/resume", "/weight_info"])
        init = json.loads(fake.requests[paths.index("/init_weight_transfer_engine")]["body"])
        self.assertEqual(init["init_info"]["world_size"], 3)
