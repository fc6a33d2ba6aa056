"""weights sync on several servers (--server repeated, --servers-file): every server finishes
without a version, and the version is set on all of them only when every one finished; one
failing server commits nothing anywhere, is named, and its exit code is the command's. And -o
json: one document for the whole sync."""

import json

from test_wire import FakeServer
from ctl_harness import CtlTestCase
from harness import NCCL_INIT_INFO, call_names, update_info

QUERIES = ("get_weight_version", "is_scheduler_paused")
NCCL_INIT_BYTES = json.dumps(NCCL_INIT_INFO).encode()


class FleetTest(CtlTestCase):
    def setUp(self):
        super().setUp()
        self.write("init.json", NCCL_INIT_INFO)
        with open(self.write("a.json", update_info("a")), "rb") as handle:
            self.update_bytes = handle.read()

    def start_fleet(self, failing=None):
        """Three external-mode daemons with one engine each; `failing` (an index) gets an
        engine whose finish_weight_update fails."""
        fleet = []
        for index in range(3):
            extra = ("--inject-fail", "finish_weight_update") if index == failing else ()
            fleet.append(self.start_external(*extra, name=f"vllmd{index}"))
        return fleet

    def sync(self, fleet, *args):
        servers = [arg for daemon, _ in fleet for arg in ("--server", daemon.url)]
        return self.ctl(*servers, "weights", "sync", "--init", "init.json", "--update", "a.json",
                        *args, server=False)

    def engine_calls(self, engine):
        return call_names(call for call in engine.calls() if call["method"] not in QUERIES)

    def test_one_failing_finish_commits_the_version_nowhere(self):
        fleet = self.start_fleet(failing=1)
        failing = fleet[1][0].url
        result = self.assert_exit(self.sync(fleet, "--version", "fleet-1"), 70, [
            f"vllmctl: {failing}: weights sync: failed at finish; weight version not committed",
            "version fleet-1 committed on 0 of 3 servers"])
        for daemon, engine in fleet:
            self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "default"})
            self.assertEqual(daemon.get("/is_paused").json(), {"is_paused": False})
            self.assertEqual(daemon.get("/weight_update_session").json()["open"], False)
            calls = self.engine_calls(engine)
            self.assertNotIn("set_weight_version", calls)
            self.assertEqual(calls[-1], "resume_scheduler")
        # Every server's lines are labelled; the summary says what each one holds.
        self.assertIn(f"{fleet[0][0].url}: weight update finished", result.stdout)
        self.assertIn(f"{fleet[0][0].url}: updated; weight version not committed: another "
                      "server failed", result.stdout)
        self.assertIn(f"{failing}: failed at finish", result.stdout)

    def test_all_finishing_commits_the_version_everywhere(self):
        fleet = self.start_fleet()
        result = self.assert_ok(self.sync(fleet, "--version", "fleet-2"))
        for daemon, engine in fleet:
            self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "fleet-2"})
            self.assertEqual(self.engine_calls(engine), [
                "init_weight_transfer_engine", "pause_scheduler", "start_weight_update", "update_weights",
                "finish_weight_update", "set_weight_version", "resume_scheduler"])
            self.assertIn(f"{daemon.url}: version fleet-2 committed", result.stdout)

    def test_json_prints_one_document_for_the_whole_fleet(self):
        fleet = self.start_fleet(failing=2)
        result = self.assert_exit(self.sync(fleet, "-o", "json", "--version", "fleet-3"), 70)
        document = json.loads(result.stdout)  # one document, not one per call
        self.assertEqual((document["ok"], document["exit_code"], document["version"],
                          document["committed"]), (False, 70, "fleet-3", 0))
        self.assertEqual([server["server"] for server in document["servers"]],
                         [daemon.url for daemon, _ in fleet])
        good, failed = document["servers"][0], document["servers"][2]
        self.assertEqual([step["step"] for step in good["steps"]], [
            "init (init.json)", "pause (mode keep)", "start", "update (1/1: a.json)", "finish",
            "resume"])
        self.assertTrue(all(step["ok"] and step["seconds"] >= 0 for step in good["steps"]))
        self.assertEqual(good["steps"][4]["response"], {"message": "Weight update finished"})
        self.assertEqual((failed["ok"], failed["exit_code"], failed["committed"]),
                         (False, 70, False))
        finish = failed["steps"][4]
        self.assertEqual((finish["step"], finish["ok"]), ("finish", False))
        self.assertIn("injected failure in finish_weight_update", finish["error"])
        self.assertTrue(failed["outcome"].startswith("failed at finish"))

    def test_a_fleet_with_a_vllm_api_server_in_it(self):
        # vLLM's own API server has the same routes (and no /weight_update_session): a fake
        # one answering as vLLM does stands beside a vllmd.
        replies = {"/pause": {"status": "paused"}, "/resume": {"status": "resumed"},
                   "/init_weight_transfer_engine": {"message": "Weight transfer initialized"},
                   "/start_weight_update": {"message": "Weight update started"},
                   "/update_weights": {"message": "Weights updated"},
                   "/finish_weight_update": {"message": "Weight update finished"},
                   "/update_weight_version": {"message": "Weight version updated"}}
        vllm = FakeServer(lambda method, path: (200, json.dumps(replies[path.split("?")[0]])))
        self.addCleanup(vllm.close)
        daemon, _ = self.start_external(name="vllmd0")
        result = self.assert_ok(self.ctl("--server", daemon.url, "--server", vllm.url,
                                         "weights", "sync", "--init", "init.json", "--update",
                                         "a.json", "--version", "mixed-1", server=False))
        self.assertIn(f"{vllm.url}: version mixed-1 committed", result.stdout)
        self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "mixed-1"})
        self.assertEqual([(request["path"], request["body"]) for request in vllm.requests], [
            ("/init_weight_transfer_engine", b'{"init_info":' + NCCL_INIT_BYTES + b"}"),
            ("/pause?mode=keep", b""), ("/start_weight_update", b""),
            ("/update_weights", b'{"update_info":' + self.update_bytes + b"}"),
            ("/finish_weight_update", b""),
            ("/update_weight_version", b'{"new_version":"mixed-1"}'), ("/resume", b"")])

    def test_servers_file_and_repeated_server(self):
        fleet = self.start_fleet()[:2]
        self.write("servers", f"# the fleet\n\n  {fleet[1][0].url}  \n")
        self.assert_ok(self.ctl("--server", fleet[0][0].url, "weights", "sync", "--init",
                                "init.json", "--update", "a.json", "--servers-file", "servers",
                                "--version", "listed", server=False))
        for daemon, _ in fleet:
            self.assertEqual(daemon.get("/weight_info").json(), {"weight_version": "listed"})

    def test_fleet_mistakes_are_usage_errors_before_any_call(self):
        fleet = self.start_fleet()[:2]
        urls = [daemon.url for daemon, _ in fleet]
        self.assert_exit(self.ctl("--server", urls[0], "--server", urls[1], "status",
                                  server=False),
                         64, "--server: given 2 times; only weights sync runs on several servers")
        self.assert_exit(self.ctl("--server", urls[0], "--server", urls[0], "weights", "sync",
                                  "--update", "a.json", server=False),
                         64, f"--server: {urls[0]} is named twice")
        self.write("empty", "# nobody\n")
        self.assert_exit(self.ctl("weights", "sync", "--update", "a.json", "--servers-file",
                                  "empty", server=False), 64, "empty: names no server")
        self.assert_exit(self.ctl("weights", "sync", "--update", "a.json", "--servers-file",
                                  "missing", server=False), 66, "missing: cannot read")
        for _, engine in fleet:
            self.assertEqual(self.engine_calls(engine), [])

