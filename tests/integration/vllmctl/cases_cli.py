"""The command line itself: help, usage errors (64), bad client configuration (78), an
unreachable daemon (69), and the bash completion script."""

import os
import subprocess

from ctl_harness import CtlTestCase
from harness import free_port

COMPLETION_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                               "cmd", "vllmctl", "vllmctl.bash-completion")


class HelpTest(CtlTestCase):
    def test_help_lists_every_exit_code_and_variable(self):
        result = self.assert_ok(self.ctl("--help", server=False))
        for code in ("0", "64", "65", "66", "69", "70", "75", "77", "78"):
            self.assertRegex(result.stdout, rf"(?m)^\s+{code}\s+\S", code)
        for variable in ("VLLMCTL_SERVER", "VLLMCTL_TOKEN", "VLLMCTL_TOKEN_FILE"):
            self.assertIn(variable, result.stdout)
        for command in ("weights", "world-size", "pause", "resume", "status", "health",
                        "reload", "completion"):
            self.assertIn(command, result.stdout)

    def test_subcommand_help_exits_0_and_names_routes(self):
        result = self.assert_ok(self.ctl("weights", "--help", server=False))
        for text in ("init", "start", "update", "finish", "info", "set-version", "sync",
                     "POST /init_weight_transfer_engine", "GET /weight_info"):
            self.assertIn(text, result.stdout)
        self.assert_ok(self.ctl("weights", "sync", "-h", server=False))


class UsageTest(CtlTestCase):
    def test_usage_errors_exit_64(self):
        cases = [
            [],
            ["--bogus", "health"],
            ["frobnicate"],
            ["weights"],
            ["weights", "init"],
            ["weights", "update"],
            ["weights", "set-version"],
            ["weights", "sync", "--update", "u.json"],
            ["pause", "--mode", "later"],
            ["--timeout", "soon", "health"],
            ["--timeout", "-1", "health"],
            ["health", "extra"],
            ["completion", "zsh"],
        ]
        for args in cases:
            with self.subTest(args=args):
                result = self.assert_exit(self.ctl(*args, server=False), 64)
                self.assertTrue(result.stderr.strip())
                self.assertEqual(result.stdout, "")


class ConfigTest(CtlTestCase):
    def test_bad_client_configuration_exits_78(self):
        missing = os.path.join(self.workdir, "no-such-token")
        empty = self.write("empty-token", "\n")
        cases = [
            (["--server", "ftp://127.0.0.1:1"], {}, "--server"),
            (["--server", "127.0.0.1:8000"], {}, "--server"),
            (["--server", "https://127.0.0.1:8000", "--cacert", "/nonexistent.pem"], {},
             "--cacert"),
            (["--server", "http://127.0.0.1:8000", "--cacert", "/etc/hostname"], {}, "--cacert"),
            (["--server", "http://:8000"], {}, "--server"),
            ([], {"VLLMCTL_SERVER": "not a url"}, "--server"),
            (["-o", "yaml"], {}, "-o"),
            (["--token-file", missing], {}, "token file"),
            (["--token-file", self.workdir], {}, "token file"),
            (["--token-file", empty], {}, "empty"),
            ([], {"VLLMCTL_TOKEN_FILE": missing}, "VLLMCTL_TOKEN_FILE"),
            ([], {"VLLMCTL_TOKEN": "a", "VLLMCTL_TOKEN_FILE": empty}, "both"),
        ]
        for args, env, text in cases:
            with self.subTest(args=args, env=env):
                result = self.ctl(*args, "health", env=env, server=False)
                self.assert_exit(result, 78, text)
                self.assertEqual(result.stdout, "")


class UnreachableTest(CtlTestCase):
    def test_connect_failure_exits_69(self):
        self.server = f"http://127.0.0.1:{free_port()}"  # nothing listens there any more
        for args in (["health"], ["status"], ["weights", "info"], ["pause"], ["weights", "start"]):
            with self.subTest(args=args):
                self.assert_exit(self.ctl(*args), 69, "cannot connect")

    def test_only_gets_are_retried(self):
        self.server = f"http://127.0.0.1:{free_port()}"
        result = self.assert_exit(self.ctl("-v", "weights", "info"), 69, "after 4 attempts")
        self.assertEqual(result.stderr.count("> GET"), 4)
        self.assertIn("retrying in 0.2 s", result.stderr)
        self.assertIn("retrying in 0.8 s", result.stderr)
        result = self.assert_exit(self.ctl("-v", "resume"), 69)
        self.assertEqual(result.stderr.count("> POST"), 1)
        self.assertNotIn("retrying", result.stderr)

    def test_default_server_comes_from_the_environment(self):
        url = f"http://127.0.0.1:{free_port()}"
        result = self.ctl("health", env={"VLLMCTL_SERVER": url}, server=False)
        self.assert_exit(result, 69, url)


class CompletionTest(CtlTestCase):
    def test_completion_prints_the_shipped_file(self):
        result = self.assert_ok(self.ctl("completion", "bash", server=False))
        with open(COMPLETION_FILE, encoding="utf-8") as handle:
            self.assertEqual(result.stdout, handle.read())
        check = subprocess.run(["bash", "-n"], input=result.stdout, text=True,
                               capture_output=True)
        self.assertEqual(check.returncode, 0, check.stderr)

    def complete(self, *words):
        """COMPREPLY for a command line whose last word is being completed."""
        script = self.write("completion.bash", self.ctl("completion", "bash", server=False).stdout)
        line = " ".join(f"'{word}'" for word in words)
        program = (f"source '{script}'; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
                   "_vllmctl; printf '%s\\n' \"${COMPREPLY[@]}\"")
        result = subprocess.run(["bash", "-c", program], capture_output=True, text=True,
                                cwd=self.workdir)
        self.assertEqual(result.returncode, 0, result.stderr)
        return sorted(word for word in result.stdout.split("\n") if word)

    def test_completion_completes_commands_and_flags(self):
        self.assertEqual(self.complete("vllmctl", ""),
                         sorted(["weights", "world-size", "pause", "resume", "status", "health",
                                 "reload", "completion"]))
        self.assertEqual(self.complete("vllmctl", "weights", "s"),
                         ["set-version", "start", "sync"])
        self.assertEqual(self.complete("vllmctl", "--server", "http://x", "weights", "sync", "--"),
                         sorted(["--init", "--update", "--version", "--no-pause", "--server",
                                 "--token-file", "--cacert", "--session", "--timeout", "--output",
                                 "--quiet", "--verbose", "--help"]))
        self.assertEqual(self.complete("vllmctl", "pause", "--mode", ""),
                         ["abort", "keep", "wait"])
        self.assertEqual(self.complete("vllmctl", "-o", "j"), ["json"])
        self.assertEqual(self.complete("vllmctl", "completion", ""), ["bash"])
