"""weights sync: the whole lifecycle in one command, and what happens when a step fails:
generation is resumed, the version is not committed, the failed step is named, and the exit
code is that step's."""

import json
import os
import pty
import subprocess
import threading
import time

import requests

from ctl_harness import CtlTestCase
from harness import NCCL_INIT_INFO, binary, call_names, clean_env, update_info

QUERIES = ("get_weight_version", "is_scheduler_paused")


class SyncTest(CtlTestCase):
    def setUp(self):
        super().setUp()
        self.write("init.json", NCCL_INIT_INFO)
        self.write("a.json", update_info("a"))
        self.write("b.json", [update_info("b")])

    def engine_calls(self, engine):
        return call_names(call for call in engine.calls()
                          if call["method"] not in QUERIES)

    def assert_resumed_and_unversioned(self, daemon, version="default"):
        self.assertEqual(daemon.get("/is_paused").json(), {"is_paused": False})
        self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": version})

    def test_sync_runs_every_step_in_order(self):
        daemon, engine = self.start_external()
        result = self.assert_ok(self.ctl("weights", "sync", "--init", "init.json", "--update",
                                         "a.json", "--update", "b.json", "--version", "step-7"))
        self.assertEqual(result.stdout.splitlines(), [
            "weight transfer initialized (init.json)",
            "generation paused (mode keep)",
            "weight update started",
            "weights updated (1/2: a.json)",
            "weights updated (2/2: b.json)",
            "weight update finished (version step-7)",
            "generation resumed",
        ])
        self.assertEqual(self.engine_calls(engine), [
            "init_weight_transfer_engine", "pause_scheduler", "start_weight_update",
            "update_weights", "update_weights", "finish_weight_update", "set_weight_version",
            "resume_scheduler"])
        self.assert_resumed_and_unversioned(daemon, "step-7")

    def test_sync_json_prints_one_document_for_the_sync(self):
        daemon = self.start_daemon()
        result = self.assert_ok(self.ctl("-o", "json", "weights", "sync", "--init", "init.json",
                                         "--update", "a.json", "--version", "v1"))
        document = json.loads(result.stdout)
        self.assertEqual((document["ok"], document["exit_code"], document["version"],
                          document["committed"]), (True, 0, "v1", 1))
        self.assertGreater(document["seconds"], 0)
        (server,) = document["servers"]
        self.assertEqual((server["server"], server["ok"], server["committed"]),
                         (self.server, True, True))
        self.assertEqual([(step["step"], step["response"]) for step in server["steps"]], [
            ("init (init.json)", {"message": "Weight transfer initialized"}),
            ("pause (mode keep)", {"status": "paused"}),
            ("start", {"message": "Weight update started"}),
            ("update (1/1: a.json)", {"message": "Weights updated"}),
            ("finish (version v1)", {"message": "Weight update finished"}),
            ("resume", {"status": "resumed"})])
        self.assertTrue(all(step["ok"] and step["exit_code"] == 0 and step["seconds"] >= 0
                            for step in server["steps"]))
        self.assert_resumed_and_unversioned(daemon, "v1")
        # Repeatable: the next step's sync works on the same session state.
        self.assert_ok(self.ctl("-q", "weights", "sync", "--init", "init.json", "--update",
                                "b.json", "--version", "v2"))
        self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "v2"})

    def generate_in_thread(self, daemon, max_tokens, engine):
        """A rollout in flight: a plain generation of `max_tokens` at the engine's pace,
        returned once the engine has it."""
        answer = {}

        def run():
            answer["response"] = requests.post(
                daemon.url + "/inference/v1/generate", timeout=60,
                json={"token_ids": [4], "sampling_params": {"max_tokens": max_tokens, "seed": 7,
                                                            "ignore_eos": True}})
        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 10
        while not any(call["method"] == "ADD" for call in engine.calls()):
            self.assertLess(time.monotonic(), deadline, "the engine never got the request")
            time.sleep(0.02)
        return thread, answer

    def pause_modes(self, engine):
        return [call["args"][0] for call in engine.calls() if call["method"] == "pause_scheduler"]

    def test_by_default_rollouts_in_flight_freeze_across_the_sync_and_finish(self):
        # 200 tokens at 20 ms a step: the request outlives the sync by seconds.
        daemon, engine = self.start_external("--step-ms", "20")
        thread, answer = self.generate_in_thread(daemon, 200, engine)
        result = self.assert_ok(self.ctl("weights", "sync", "--init", "init.json", "--update",
                                         "a.json", "--version", "v2"))
        self.assertIn("generation paused (mode keep)", result.stdout.splitlines())
        self.assertTrue(thread.is_alive(), "the rollout ended during the sync")
        thread.join(30)
        choice = answer["response"].json()["choices"][0]
        self.assertEqual((choice["finish_reason"], len(choice["token_ids"])), ("length", 200))
        self.assertEqual(self.pause_modes(engine), ["keep"])
        self.assert_resumed_and_unversioned(daemon, "v2")

    def test_pause_mode_abort_ends_rollouts_in_flight_with_their_tokens(self):
        daemon, engine = self.start_external("--step-ms", "20")
        thread, answer = self.generate_in_thread(daemon, 200, engine)
        time.sleep(0.2)  # some tokens
        result = self.assert_ok(self.ctl("weights", "sync", "--pause-mode", "abort", "--init",
                                         "init.json", "--update", "a.json"))
        self.assertIn("generation paused (mode abort)", result.stdout.splitlines())
        thread.join(30)
        choice = answer["response"].json()["choices"][0]
        self.assertEqual(choice["finish_reason"], "abort")
        self.assertGreater(len(choice["token_ids"]), 0)
        self.assertLess(len(choice["token_ids"]), 200)
        self.assertEqual(self.pause_modes(engine), ["abort"])

    def test_pause_mode_wait_and_refused_combinations(self):
        daemon, engine = self.start_external()
        self.assert_ok(self.ctl("weights", "sync", "--pause-mode", "wait", "--init", "init.json",
                                "--update", "a.json"))
        self.assertEqual(self.pause_modes(engine), ["wait"])
        # Frozen requests cannot sleep through a sync that drops their KV cache; a mode that
        # does not exist, or one with --no-pause, is a usage error. None reaches the server.
        calls = len(engine.calls())
        self.assert_exit(self.ctl("weights", "sync", "--pause-mode", "keep", "--sleep", "1",
                                  "--update", "a.json"), 64, "cannot go with --sleep")
        self.assert_exit(self.ctl("weights", "sync", "--pause-mode", "later", "--update",
                                  "a.json"), 64, "--pause-mode")
        self.assert_exit(self.ctl("weights", "sync", "--pause-mode", "keep", "--no-pause",
                                  "--update", "a.json"), 64, "excludes")
        self.assertEqual(len(engine.calls()), calls)
        self.assert_resumed_and_unversioned(daemon)

    def test_sync_without_version_or_pause(self):
        daemon, engine = self.start_external()
        self.assert_ok(self.ctl("weights", "sync", "--no-pause", "--init", "init.json",
                                "--update", "a.json"))
        self.assertEqual(self.engine_calls(engine), [
            "init_weight_transfer_engine", "start_weight_update", "update_weights",
            "finish_weight_update"])
        self.assert_resumed_and_unversioned(daemon)

    def test_init_once_then_sync_every_step_without_it(self):
        daemon, engine = self.start_external()
        self.assert_ok(self.ctl("weights", "init", "--info", "init.json"))
        for step in ("step-1", "step-2"):
            result = self.assert_ok(self.ctl("weights", "sync", "--update", "a.json",
                                             "--version", step))
            self.assertEqual(result.stdout.splitlines()[0], "generation paused (mode keep)")
        self.assertEqual(self.engine_calls(engine).count("init_weight_transfer_engine"), 1)
        self.assert_resumed_and_unversioned(daemon, "step-2")

    def test_the_colocated_order_with_sleep(self):
        daemon, engine = self.start_external()
        self.assert_ok(self.ctl("weights", "init", "--info", "init.json"))
        result = self.assert_ok(self.ctl("weights", "sync", "--sleep", "1", "--update", "a.json",
                                         "--version", "colocated-1"))
        self.assertEqual(result.stdout.splitlines(), [
            "generation paused (mode abort)",
            "sleeping at level 1",
            "engines sleeping (weights)",
            "weight update started",
            "weights updated (1/1: a.json)",
            "weight update finished (version colocated-1)",
            "engines awake (kv_cache)",
            "prefix cache reset (success: true)",
            "generation resumed",
        ])
        calls = [call for call in engine.calls() if call["method"] not in QUERIES][1:]
        self.assertEqual([(call["worker_method"] or call["method"], call["args"])
                          if call["method"] in ("sleep", "wake_up", "reset_prefix_cache")
                          else call["worker_method"] or call["method"] for call in calls], [
            "pause_scheduler", ("sleep", [1, "abort"]), ("wake_up", [["weights"]]),
            "start_weight_update", "update_weights", "finish_weight_update",
            "set_weight_version", ("wake_up", [["kv_cache"]]),
            ("reset_prefix_cache", [True, False]), "resume_scheduler"])
        self.assert_resumed_and_unversioned(daemon, "colocated-1")
        self.assertEqual(daemon.get("/is_sleeping").json(), {"is_sleeping": False})

    def test_a_failed_colocated_sync_wakes_everything_and_resumes(self):
        daemon, engine = self.start_external("--inject-fail", "update_weights")
        self.assert_ok(self.ctl("weights", "init", "--info", "init.json"))
        self.assert_exit(self.ctl("weights", "sync", "--sleep", "2", "--update", "a.json",
                                  "--version", "never"),
                         70, "failed at update (1/1: a.json); weight version not committed; "
                             "engines woken; generation resumed")
        calls = self.engine_calls(engine)
        self.assertEqual(calls[-3:], ["finish_weight_update", "wake_up", "resume_scheduler"])
        self.assertEqual(daemon.get("/is_sleeping").json(), {"is_sleeping": False})
        self.assert_resumed_and_unversioned(daemon)

    def test_a_step_vllmctl_gave_up_on_closes_the_session_so_a_retry_starts(self):
        # The update is answered after 2 s; vllmctl gives up at 1.5 s (exit 75) while vllmd
        # still holds the session open. vllmctl closes it (finish without a version, queued
        # behind the update in vllmd), so the retry the man page recommends can start.
        daemon, engine = self.start_external("--inject-hold", "update_weights=2")
        self.assert_ok(self.ctl("weights", "init", "--info", "init.json"))
        self.assert_exit(self.ctl("--timeout", "1.5", "weights", "sync", "--update", "a.json",
                                  "--version", "lost"),
                         75, "failed at update (1/1: a.json); weight version not committed; "
                             "session closed; generation resumed")
        self.assertEqual(daemon.get("/weight_update_session").json()["open"], False)
        self.assert_ok(self.ctl("weights", "sync", "--update", "b.json", "--version", "retried"))
        self.assert_resumed_and_unversioned(daemon, "retried")

    def test_failed_update_still_resumes_and_commits_nothing(self):
        daemon, engine = self.start_external("--inject-fail", "update_weights")
        self.assert_ok(self.ctl("weights", "set-version", "before"))
        result = self.assert_exit(
            self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json", "--update",
                     "b.json", "--version", "after"),
            70, ["vllmctl: weights sync: update (1/2: a.json): failed to call update_weights",
                 "injected failure",
                 "failed at update (1/2: a.json); weight version not committed; "
                 "generation resumed"])
        self.assertEqual(result.stdout.splitlines()[-1], "generation resumed")
        calls = self.engine_calls(engine)
        # vLLM ends a session whose update failed on that worker; vllmd closes it everywhere
        # (finish without a version), so the next sync can start.
        self.assertEqual(calls[-4:], ["start_weight_update", "update_weights",
                                      "finish_weight_update", "resume_scheduler"])
        self.assertEqual(calls.count("update_weights"), 1)
        self.assert_resumed_and_unversioned(daemon, "before")

    def test_second_update_rejected_by_the_engine(self):
        daemon = self.start_daemon()
        self.write("names-only.json", {"names": ["a"]})  # valid JSON, but not for the engine
        result = self.assert_exit(
            self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json", "--update",
                     "names-only.json", "--version", "never"),
            70, "weights sync: update (2/2: names-only.json): failed to call update_weights")
        self.assertIn("weights updated (1/2: a.json)", result.stdout)
        self.assertNotIn("finished", result.stdout)
        self.assert_resumed_and_unversioned(daemon)
        # The engine abandoned the session, so the next sync starts cleanly.
        self.assert_ok(self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json",
                                "--version", "next"))
        self.assert_resumed_and_unversioned(daemon, "next")

    def test_failed_pause_still_resumes(self):
        daemon, engine = self.start_external("--inject-fail", "pause_scheduler")
        self.assert_exit(self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json",
                                  "--version", "v"),
                         70, ["weights sync: pause (mode keep): ", "failed at pause (mode keep)"])
        self.assertEqual(self.engine_calls(engine), [
            "init_weight_transfer_engine", "pause_scheduler", "resume_scheduler"])
        self.assert_resumed_and_unversioned(daemon)

    def test_a_failed_resume_is_reported_and_exits_non_zero(self):
        # Everything else went through, so the version stands; but generation may still be
        # paused, and a training job must not read that as success.
        daemon, engine = self.start_external("--inject-fail", "resume_scheduler")
        self.assert_exit(self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json",
                                  "--version", "v"),
                         70, ["weights sync: resume: failed to call resume_scheduler",
                              "failed at resume; weight version committed; "
                              "generation may still be paused"])
        self.assertEqual(self.engine_calls(engine)[-2:], ["set_weight_version",
                                                          "resume_scheduler"])
        self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "v"})
        self.assertEqual(daemon.get("/is_paused").json(), {"is_paused": True})

    def test_failed_finish_commits_nothing(self):
        daemon, engine = self.start_external("--inject-fail", "finish_weight_update")
        self.assert_exit(self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json",
                                  "--version", "v"),
                         70, "failed at finish (version v)")
        calls = self.engine_calls(engine)
        self.assertNotIn("set_weight_version", calls)
        self.assertEqual(calls[-1], "resume_scheduler")
        self.assert_resumed_and_unversioned(daemon)

    def test_failed_init_does_not_pause(self):
        daemon, engine = self.start_external("--inject-fail", "init_weight_transfer_engine")
        self.assert_exit(self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json"),
                         70, "failed at init (init.json); generation was not paused")
        self.assertEqual(self.engine_calls(engine), ["init_weight_transfer_engine"])
        self.assert_resumed_and_unversioned(daemon)

    def test_bad_local_file_fails_before_any_call(self):
        daemon, engine = self.start_external()
        self.write("bad.json", "[1]")
        self.assert_exit(self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json",
                                  "--update", "bad.json"),
                         65, ["weights sync: bad.json", "update_info"])
        self.assert_exit(self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json",
                                  "--update", "gone.json"), 66, "gone.json")
        self.assertEqual(self.engine_calls(engine), [])
        self.assert_resumed_and_unversioned(daemon)

    def test_update_from_stdin(self):
        daemon = self.start_daemon()
        with open(f"{self.workdir}/b.json", "rb") as handle:
            self.assert_ok(self.ctl("weights", "sync", "--init", "init.json", "--update", "a.json",
                                    "--update", "-", "--version", "s", stdin=handle))
        self.assert_resumed_and_unversioned(daemon, "s")

    def test_progress_is_shown_on_a_terminal_only(self):
        self.start_daemon()
        argv = [binary("VLLMCTL_BIN"), "--server", self.server, "weights", "sync", "--init",
                "init.json", "--update", "a.json", "--update", "b.json"]
        leader, follower = pty.openpty()
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=follower, cwd=self.workdir, env=clean_env())
        os.close(follower)
        terminal = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not chunk:
                break
            terminal += chunk
        os.close(leader)
        self.assertEqual(process.wait(timeout=60), 0, terminal)
        process.stdout.close()
        text = terminal.decode()
        for label in ("init.json", "1/2: a.json", "2/2: b.json"):
            self.assertIn(f"vllmctl: sent {label} (", text)
        self.assertIn("waiting for the server", text)
        # Not on a pipe.
        piped = self.assert_ok(self.ctl("weights", "sync", "--init", "init.json", "--update",
                                        "a.json"))
        self.assertEqual(piped.stderr, "")
