"""The command line itself: help, usage errors (64), bad client configuration (78), an
unreachable daemon (69), and the shell completion generated from it (bash, zsh, fish), checked
against what --help lists."""

import os
import shutil
import subprocess

from cli_help import flag_names, help_blocks
from ctl_harness import CtlTestCase
from harness import free_port


class HelpTest(CtlTestCase):
    def test_help_lists_every_exit_code_and_variable(self):
        result = self.assert_ok(self.ctl("--help", server=False))
        for code in ("0", "64", "65", "66", "69", "70", "75", "77", "78"):
            self.assertRegex(result.stdout, rf"(?m)^\s+{code}\s+\S", code)
        for variable in ("VLLMCTL_SERVER", "VLLMCTL_TOKEN", "VLLMCTL_TOKEN_FILE"):
            self.assertIn(variable, result.stdout)
        for command in ("weights", "world-size", "pause", "resume", "status", "health",
                        "reload", "completion", "generate"):
            self.assertIn(command, result.stdout)

    def test_subcommand_help_exits_0_and_names_routes(self):
        result = self.assert_ok(self.ctl("weights", "--help", server=False))
        for text in ("init", "start", "update", "finish", "info", "set-version", "sync",
                     "POST /init_weight_transfer_engine", "GET /weight_info"):
            self.assertIn(text, result.stdout)
        self.assert_ok(self.ctl("weights", "sync", "-h", server=False))
        result = self.assert_ok(self.ctl("generate", "--help", server=False))
        for text in ("--tokens", "--input", "--max-tokens", "--temperature", "--top-p", "--top-k",
                     "--seed", "--logprobs", "--n", "--stream", "POST /inference/v1/generate"):
            self.assertIn(text, result.stdout)


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
            ["weights", "sync", "--init", "i.json"],
            ["weights", "sync", "--update", "u.json", "--sleep", "3"],
            ["weights", "sync", "--update", "u.json", "--sleep", "1", "--no-pause"],
            ["pause", "--mode", "later"],
            ["--timeout", "soon", "health"],
            ["--timeout", "-1", "health"],
            ["health", "extra"],
            ["completion", "tcsh"],
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
    def script(self, shell):
        result = self.assert_ok(self.ctl("completion", shell, server=False))
        return self.write(f"completion.{shell}", result.stdout)

    def help_tree(self):
        """{command words: (subcommands, flags)} from the --help of vllmctl and every command."""
        tree = {}
        pending = [()]
        while pending:
            path = pending.pop()
            blocks = help_blocks(self.assert_ok(self.ctl(*path, "--help", server=False)).stdout)
            subcommands = blocks.get("Subcommands", [])
            tree[path] = (subcommands, flag_names(blocks))
            pending.extend(path + (name,) for name in subcommands)
        return tree

    def bash_complete(self, *words):
        """COMPREPLY for a command line whose last word is being completed."""
        line = " ".join(f"'{word}'" for word in words)
        program = (f"source '{self.script('bash')}'; COMP_WORDS=({line}); "
                   f"COMP_CWORD={len(words) - 1}; _vllmctl; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        result = subprocess.run(["bash", "-c", program], capture_output=True, text=True,
                                cwd=self.workdir)
        self.assertEqual(result.returncode, 0, result.stderr)
        return sorted(word for word in result.stdout.split("\n") if word)

    def fish_complete(self, line):
        fish = shutil.which("fish")
        if fish is None:
            raise RuntimeError("fish is not installed (scripts/deps.sh installs it)")
        result = subprocess.run([fish, "--no-config", "-c",
                                 f"source '{self.script('fish')}'; complete -C '{line}'"],
                                capture_output=True, text=True, cwd=self.workdir)
        self.assertEqual(result.returncode, 0, result.stderr)
        return sorted({entry.split("\t")[0] for entry in result.stdout.splitlines() if entry})

    def test_every_shell_gets_a_script_its_parser_accepts(self):
        for shell, check in (("bash", ["bash", "-n"]), ("zsh", ["zsh", "-n"]),
                             ("fish", ["fish", "--no-execute"])):
            with self.subTest(shell):
                if shutil.which(check[0]) is None:
                    raise RuntimeError(f"{check[0]} is not installed (scripts/deps.sh)")
                result = subprocess.run(check + [self.script(shell)], capture_output=True,
                                        text=True)
                self.assertEqual(result.returncode, 0, result.stderr)

    def test_bash_completes_every_command_and_flag_help_lists_and_nothing_else(self):
        tree = self.help_tree()
        global_flags = set(tree[()][1])
        for path, (subcommands, flags) in tree.items():
            with self.subTest(path=" ".join(path)):
                self.assertTrue(set(subcommands) <= set(self.bash_complete("vllmctl", *path, "")))
                self.assertEqual(set(self.bash_complete("vllmctl", *path, "-")),
                                 set(flags) | global_flags)

    def test_fish_completes_every_command_and_flag_help_lists(self):
        tree = self.help_tree()
        for path, (subcommands, flags) in tree.items():
            line = " ".join(("vllmctl",) + path)
            with self.subTest(path=line):
                self.assertTrue(set(subcommands) <= set(self.fish_complete(line + " ")))
                self.assertTrue(set(flags) <= set(self.fish_complete(line + " -")))

    def test_zsh_script_names_every_command_and_flag_under_its_path(self):
        with open(self.script("zsh"), encoding="utf-8") as handle:
            arms = {}
            for line in handle:
                stripped = line.strip()
                if stripped.startswith('("') and '")' in stripped:
                    arms[stripped[2:stripped.index('")')]] = stripped
        for path, (subcommands, flags) in self.help_tree().items():
            with self.subTest(path=" ".join(path)):
                arm = arms[" ".join(path)]
                for word in subcommands + ([] if not path else flags):
                    if word in ("-h", "--help"):
                        continue  # every command's help flag is the global one
                    self.assertIn(f"'{word}", arm)

    def test_values_complete_as_the_checks_allow(self):
        self.assertEqual(self.bash_complete("vllmctl", "weights", "s"),
                         ["set-version", "start", "sync"])
        self.assertEqual(self.bash_complete("vllmctl", "--server", "http://x", "weights", "sync",
                                            "--"),
                         sorted(["--init", "--update", "--version", "--no-pause", "--pause-mode",
                                 "--sleep",
                                 "--verify", "--servers-file",
                                 "--server",
                                 "--token-file", "--cacert", "--session", "--timeout", "--output",
                                 "--quiet", "--verbose", "--help"]))
        self.assertEqual(self.bash_complete("vllmctl", "pause", "--mode", ""),
                         ["abort", "keep", "wait"])
        self.assertEqual(self.bash_complete("vllmctl", "weights", "sync", "--pause-mode", ""),
                         ["abort", "keep", "wait"])
        self.assertEqual(self.bash_complete("vllmctl", "-o", "j"), ["json"])
        self.assertEqual(self.bash_complete("vllmctl", "completion", ""), ["bash", "fish", "zsh"])
        self.assertEqual(self.bash_complete("vllmctl", "weights", "set-version", ""), [])
        self.write("update-1.json", "{}")
        self.assertEqual(self.bash_complete("vllmctl", "weights", "update", "--info", "upd"),
                         ["update-1.json"])
        self.assertEqual(self.fish_complete("vllmctl pause --mode "), ["abort", "keep", "wait"])
        self.assertEqual(self.fish_complete("vllmctl weights st"), ["start"])