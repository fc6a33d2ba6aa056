"""Every command against a real vllmd with its embedded engine, in text and json output."""

import json
import os
import pty
import subprocess

from ctl_harness import CtlTestCase
from harness import NCCL_INIT_INFO, free_port, update_info


class CommandsTest(CtlTestCase):
    def setUp(self):
        super().setUp()
        self.daemon = self.start_daemon()
        self.init = self.write("init.json", NCCL_INIT_INFO)
        self.chunk1 = self.write("chunk1.json", update_info("a", "b"))
        self.chunk2 = self.write("chunk2.json", [update_info("c")])  # per-worker list

    def version(self):
        return self.daemon.get("/weight_info").json()["weight_version"]

    def paused(self):
        return self.daemon.get("/is_paused").json()["is_paused"]

    def test_health(self):
        self.assertEqual(self.assert_ok(self.ctl("health")).stdout, "healthy\n")
        self.assertEqual(self.json_lines(self.assert_ok(self.ctl("-o", "json", "health"))),
                         [{"healthy": True}])

    def test_status_text_and_json(self):
        text = self.assert_ok(self.ctl("status")).stdout
        self.assertRegex(text, r"(?m)^health\s+ok$")
        self.assertRegex(text, r"(?m)^engines\s+all ready$")
        self.assertRegex(text, r"(?m)^world size\s+1$")
        self.assertRegex(text, r"(?m)^paused\s+no$")
        self.assertRegex(text, r"(?m)^weight version\s+default$")
        self.assertRegex(text, r"(?m)^session\s+none$")
        self.assertIn(self.server, text)
        self.assert_ok(self.ctl("pause"))
        self.assert_ok(self.ctl("weights", "set-version", "step-3"))
        status = self.json_lines(self.assert_ok(self.ctl("-o", "json", "status")))
        self.assertEqual(status, [{"server": self.server, "healthy": True,
                                   "engines": "all ready", "world_size": 1, "is_paused": True,
                                   "weight_version": "step-3",
                                   "session": {"open": False, "version_current": True}}])
        # A session spread over commands, owned by its id: another client cannot finish it.
        self.assert_ok(self.ctl("--session", "job-7", "weights", "start"))
        self.assertRegex(self.assert_ok(self.ctl("status")).stdout,
                         r"(?m)^session\s+open, owned, [0-9.]+ s old, 0 update\(s\)$")
        refused = self.ctl("weights", "finish")
        self.assertEqual(refused.returncode, 75, refused.stderr)
        self.assertIn("owned by another client", refused.stderr)
        self.assert_ok(self.ctl("weights", "finish", env={"VLLMCTL_SESSION": "job-7"}))

    def test_lifecycle_text(self):
        self.assertEqual(self.assert_ok(self.ctl("weights", "init", "--info", "init.json")).stdout,
                         "weight transfer initialized (init.json)\n")
        self.assertEqual(self.assert_ok(self.ctl("weights", "start")).stdout,
                         "weight update started\n")
        result = self.assert_ok(self.ctl("weights", "update", "--info", "chunk1.json",
                                         "--info", self.chunk2))
        self.assertEqual(result.stdout, "weights updated (1/2: chunk1.json)\n"
                                        f"weights updated (2/2: {self.chunk2})\n")
        self.assertEqual(
            self.assert_ok(self.ctl("weights", "finish", "--version", "step-1")).stdout,
            "weight update finished (version step-1)\n")
        self.assertEqual(self.assert_ok(self.ctl("weights", "info")).stdout, "step-1\n")
        self.assertEqual(self.version(), "step-1")

    def test_lifecycle_json(self):
        def one(*args):
            documents = self.json_lines(self.assert_ok(self.ctl("-o", "json", *args)))
            self.assertEqual(len(documents), 1, documents)
            return documents[0]

        self.assertEqual(one("weights", "init", "--info", self.init),
                         {"message": "Weight transfer initialized"})
        self.assertEqual(one("weights", "start"), {"message": "Weight update started"})
        self.assertEqual(
            self.json_lines(self.assert_ok(self.ctl("-o", "json", "weights", "update", "--info",
                                                    self.chunk1, "--info", self.chunk2))),
            [{"message": "Weights updated"}] * 2)
        self.assertEqual(one("weights", "finish"), {"message": "Weight update finished"})
        self.assertEqual(self.version(), "default")  # no version given: none committed
        self.assertEqual(one("weights", "set-version", "v2"),
                         {"success": True, "new_version": "v2"})
        self.assertEqual(one("weights", "info"), {"weight_version": "v2"})
        self.assertEqual(one("world-size"), {"world_size": 1})
        self.assertEqual(one("world-size", "--no-dp"), {"world_size": 1})
        self.assertEqual(one("pause", "--mode", "wait"), {"status": "paused"})
        self.assertEqual(one("resume"), {"status": "resumed"})

    def test_global_flags_after_the_command(self):
        result = self.assert_ok(self.ctl("weights", "info", "-o", "json"))
        self.assertEqual(self.json_lines(result), [{"weight_version": "default"}])

    def test_start_draft_and_finish_without_version(self):
        self.assertEqual(self.assert_ok(self.ctl("weights", "start", "--draft")).stdout,
                         "draft weight update started\n")
        self.assertEqual(self.assert_ok(self.ctl("weights", "finish")).stdout,
                         "weight update finished\n")
        self.assertEqual(self.version(), "default")

    def test_set_version_and_world_size_text(self):
        self.assertEqual(self.assert_ok(self.ctl("weights", "set-version", "x y")).stdout,
                         "weight version set to x y\n")
        self.assertEqual(self.version(), "x y")
        self.assertEqual(self.assert_ok(self.ctl("world-size")).stdout, "1\n")
        self.assertEqual(self.assert_ok(self.ctl("world-size", "--no-dp")).stdout, "1\n")

    def test_pause_and_resume(self):
        for mode in ("abort", "wait", "keep"):
            with self.subTest(mode=mode):
                self.assertEqual(
                    self.assert_ok(self.ctl("pause", "--mode", mode, "--keep-cache")).stdout,
                    "generation paused\n")
                self.assertTrue(self.paused())
                self.assertEqual(self.assert_ok(self.ctl("resume")).stdout,
                                 "generation resumed\n")
                self.assertFalse(self.paused())
        self.assert_ok(self.ctl("pause"))
        self.assertTrue(self.paused())

    def test_cache_reset(self):
        self.assertEqual(self.assert_ok(self.ctl("cache", "reset")).stdout,
                         "prefix cache reset (success: true)\n")
        self.assertEqual(
            self.assert_ok(self.ctl("cache", "reset", "--running-requests", "--external")).stdout,
            "prefix cache reset (success: true)\n")
        self.assertEqual(self.assert_ok(self.ctl("cache", "reset", "--mm")).stdout,
                         "multi-modal cache reset\n")
        self.assertEqual(self.assert_ok(self.ctl("cache", "reset", "--encoder")).stdout,
                         "encoder cache reset\n")
        self.assertEqual(self.json_lines(self.assert_ok(self.ctl("-o", "json", "cache", "reset"))),
                         [{"success": True}])
        self.assertEqual(
            self.json_lines(self.assert_ok(self.ctl("-o", "json", "cache", "reset", "--mm"))),
            [{}])
        # One cache per call: a variant with another variant or with the prefix flags is a
        # usage error, not a call that silently drops a flag.
        for args in (["--mm", "--encoder"], ["--mm", "--running-requests"],
                     ["--encoder", "--external"]):
            with self.subTest(args=args):
                self.assertEqual(self.ctl("cache", "reset", *args).returncode, 64)

    def test_sleep_and_wake_up(self):
        self.assertEqual(self.assert_ok(self.ctl("sleep", "--level", "2")).stdout,
                         "sleeping at level 2\n")
        self.assertEqual(self.assert_ok(self.ctl("is-sleeping")).stdout, "true\n")
        # While the weights sleep, vllmd refuses an update: exit 75, vllmd's reason on stderr.
        self.assert_exit(self.ctl("weights", "start"), 75, ["asleep", "wake_up"])
        self.assertEqual(self.assert_ok(self.ctl("wake-up", "--tags", "weights")).stdout,
                         "engines sleeping\n")
        self.assert_ok(self.ctl("weights", "start"))
        self.assert_ok(self.ctl("weights", "finish"))
        self.assertEqual(
            self.json_lines(self.assert_ok(self.ctl("-o", "json", "wake-up", "--tags",
                                                    "kv_cache"))),
            [{"status": "awake", "tags_woken": ["kv_cache"]}])
        self.assertEqual(self.assert_ok(self.ctl("is-sleeping")).stdout, "false\n")
        self.assert_ok(self.ctl("pause"))
        self.assertEqual(self.assert_ok(self.ctl("cache", "release")).stdout,
                         "KV cache memory released\n")
        self.assertEqual(self.assert_ok(self.ctl("wake-up")).stdout, "engines awake\n")
        # Values outside the table's choices never reach vllmd.
        for args in (["sleep", "--level", "3"], ["sleep", "--mode", "later"],
                     ["wake-up", "--tags", "weight"]):
            with self.subTest(args=args):
                self.assertEqual(self.ctl(*args).returncode, 64)

    def test_version_names_client_and_server(self):
        lines = self.assert_ok(self.ctl("version")).stdout.splitlines()
        self.assertEqual(len(lines), 2, lines)
        self.assertRegex(lines[0], r"^vllmctl \d+\.\d+\.\d+$")
        self.assertRegex(lines[1], r"^server \d+\.\d+\.\d+")
        [document] = self.json_lines(self.assert_ok(self.ctl("-o", "json", "version")))
        self.assertEqual(document["vllmctl"], lines[0].split()[1])
        self.assertIn("version", document["server"])
        unreachable = self.ctl("--server", f"http://127.0.0.1:{free_port()}", "version",
                               server=False)
        self.assert_exit(unreachable, 69)
        self.assertEqual(unreachable.stdout, lines[0] + "\n")

    def test_rpc_and_server_info(self):
        result = self.assert_ok(self.ctl("rpc", "echo_args_kwargs", "--args", '["a", 1]',
                                         "--kwargs", '{"k": 2.0}', "--rpc-timeout", "30"))
        self.assertEqual(json.loads(result.stdout),
                         [{"args": ["a", 1], "kwargs": {"k": 2.0}, "total_items": 3}])
        # Bad JSON is the server's 400: exit 65, nothing ran.
        self.assert_exit(self.ctl("rpc", "echo_args_kwargs", "--args", "[oops"), 65)
        self.assert_exit(self.ctl("rpc", "load_model"), 70, ["load_model"])
        self.assertIn("[server]", self.assert_ok(self.ctl("server-info")).stdout)
        [document] = self.json_lines(self.assert_ok(self.ctl("-o", "json", "server-info",
                                                             "--config-format", "json")))
        self.assertEqual(document["vllm_config"]["server"]["dev_mode"], True)
        self.assertEqual(document["engines"][0]["state"], "ready")

    def test_info_from_stdin(self):
        with open(self.init, "rb") as handle:
            result = self.assert_ok(self.ctl("weights", "init", "--info", "-", stdin=handle))
        self.assertEqual(result.stdout, "weight transfer initialized (stdin)\n")
        self.assert_ok(self.ctl("weights", "start"))
        result = self.ctl("weights", "update", "--info", "-",
                          input=json.dumps(update_info("x")))
        self.assertEqual(self.assert_ok(result).stdout, "weights updated (stdin)\n")
        self.assert_ok(self.ctl("weights", "finish", "--version", "from-stdin"))
        self.assertEqual(self.version(), "from-stdin")

    def test_terminal_stdin_is_refused(self):
        leader, follower = pty.openpty()
        try:
            result = self.ctl("weights", "init", "--info", "-", stdin=follower)
        finally:
            os.close(leader)
            os.close(follower)
        self.assert_exit(result, 64, ["terminal", "init_info"])

    def test_quiet_prints_nothing(self):
        for args in (["health"], ["status"], ["weights", "init", "--info", self.init],
                     ["weights", "info"], ["-o", "json", "world-size"]):
            with self.subTest(args=args):
                result = self.assert_ok(self.ctl("-q", *args))
                self.assertEqual((result.stdout, result.stderr), ("", ""))

    def test_verbose_traces_requests_on_stderr(self):
        result = self.assert_ok(self.ctl("-v", "weights", "init", "--info", "init.json"))
        self.assertEqual(result.stdout, "weight transfer initialized (init.json)\n")
        self.assertIn(f"> POST {self.server}/init_weight_transfer_engine", result.stderr)
        self.assertIn("< 200", result.stderr)

    def test_large_update_file(self):
        names = [f"model.layers.{i}.mlp.experts.weight" for i in range(200_000)]
        path = self.write("large.json", update_info(*names))
        self.assertGreater(os.path.getsize(path), 8 << 20)
        self.assert_ok(self.ctl("weights", "init", "--info", self.init))
        self.assert_ok(self.ctl("weights", "start"))
        self.assertEqual(self.assert_ok(self.ctl("weights", "update", "--info", path)).stdout,
                         f"weights updated ({path})\n")
        self.assert_ok(self.ctl("weights", "finish", "--version", "big"))
        self.assertEqual(self.version(), "big")

    def test_token_is_sent_when_auth_is_off(self):
        # A configured token does not hurt a daemon without API keys.
        self.assert_ok(self.ctl("weights", "info", env={"VLLMCTL_TOKEN": "unused"}))


class CompletionCommandTest(CtlTestCase):
    def test_completion_needs_no_server(self):
        result = self.ctl("completion", "bash", server=False,
                          env={"VLLMCTL_SERVER": "not even a url"})
        self.assertIn("complete -F _vllmctl vllmctl", self.assert_ok(result).stdout)
        self.assertEqual(subprocess.run(["bash", "-n"], input=result.stdout, text=True).returncode,
                         0)
