"""vllmd's command line and configuration file (docs/product.md §3): a bad config exits 78 with one
line naming the key, --print-config shows what was given, --version exits 0, a bad flag 64."""

import os
import shutil
import subprocess
import tempfile
import tomllib
import unittest

import harness

EX_USAGE = 64
EX_CONFIG = 78


class ConfigTest(unittest.TestCase):

    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="vllmd-it-config-")
        self.addCleanup(shutil.rmtree, self.workdir, True)

    def write(self, name, text):
        path = os.path.join(self.workdir, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def run_vllmd(self, *args, env=None):
        # These invocations exit at once; run() kills and reaps the child on a timeout.
        return subprocess.run([harness.vllmd_bin(), *args], capture_output=True, text=True,
                              env=env if env is not None else harness.clean_env(), timeout=30,
                              preexec_fn=harness.die_with_parent)

    def assert_one_line(self, result, *needles):
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, f"expected one line on stderr, got {result.stderr!r}")
        for needle in needles:
            self.assertIn(needle, lines[0])

    def test_bad_config_files_exit_78_with_one_line_naming_the_key(self):
        cases = [
            ("unknown key", "[server]\nport = 8000\nbogus_key = 1\n", "server.bogus_key"),
            ("unknown section key", "[engine]\nmodee = \"external\"\n", "engine.modee"),
            ("wrong type (string for int)", "[server]\nport = \"eighty\"\n", "server.port"),
            ("wrong type (int for bool)", "[server]\ndev_mode = 1\n", "server.dev_mode"),
            ("wrong type (string for float)", "[engine]\ncall_timeout = \"10s\"\n",
             "engine.call_timeout"),
            ("out of range", "[server]\nport = 70000\n", "server.port"),
            ("bad enum", "[engine]\nmode = \"sideways\"\n", "engine.mode"),
        ]
        for index, (what, text, key) in enumerate(cases):
            with self.subTest(what):
                path = self.write(f"bad{index}.toml", text)
                result = self.run_vllmd("--check-config", "--config", path)
                self.assertEqual(result.returncode, EX_CONFIG, result)
                self.assert_one_line(result, key)
                # Running for real fails the same way (and does not start serving).
                result = self.run_vllmd("--config", path, "--port", "0")
                self.assertEqual(result.returncode, EX_CONFIG, result)
                self.assert_one_line(result, key)

    def test_toml_syntax_error_exits_78_with_one_line(self):
        path = self.write("broken.toml", "[server\nport = 8000\n")
        result = self.run_vllmd("--check-config", "--config", path)
        self.assertEqual(result.returncode, EX_CONFIG, result)
        self.assert_one_line(result, "broken.toml")

    def test_missing_config_file_exits_78(self):
        result = self.run_vllmd("--check-config", "--config",
                                os.path.join(self.workdir, "absent.toml"))
        self.assertEqual(result.returncode, EX_CONFIG, result)
        self.assert_one_line(result, "absent.toml")

    def test_good_config_checks_ok(self):
        path = self.write("good.toml", "[server]\nport = 9000\ndev_mode = true\n\n"
                                       "[engine]\nmode = \"embedded\"\n")
        result = self.run_vllmd("--check-config", "--config", path)
        self.assertEqual(result.returncode, 0, result)
        self.assertEqual(result.stderr, "")

    def test_print_config_shows_the_flags_given(self):
        empty = self.write("empty.toml", "")
        handshake = "tcp://127.0.0.1:45678"
        result = self.run_vllmd("--config", empty, "--print-config", "--host", "127.0.0.2",
                                "--port", "9123", "--dev-mode", "--engine", "external",
                                "--handshake-address", handshake, "--data-parallel-size", "3",
                                "--max-body-bytes", "4096", "--call-timeout", "12.5",
                                "--log-level", "debug")
        self.assertEqual(result.returncode, 0, result)
        config = tomllib.loads(result.stdout)
        self.assertEqual(config["server"]["host"], "127.0.0.2")
        self.assertEqual(config["server"]["port"], 9123)
        self.assertIs(config["server"]["dev_mode"], True)
        self.assertEqual(config["server"]["max_body_bytes"], 4096)
        self.assertEqual(config["engine"]["mode"], "external")
        self.assertEqual(config["engine"]["handshake_address"], handshake)
        self.assertEqual(config["engine"]["data_parallel_size"], 3)
        self.assertEqual(config["engine"]["call_timeout"], 12.5)
        self.assertEqual(config["log"]["level"], "debug")

    def test_print_config_precedence_flags_over_env_over_file(self):
        path = self.write("file.toml", "[server]\nport = 7001\nhost = \"127.0.0.3\"\n\n"
                                       "[log]\nlevel = \"warning\"\n")
        env = harness.clean_env({"VLLMD_PORT": "7002", "VLLMD_LOG_LEVEL": "error"})
        result = self.run_vllmd("--config", path, "--print-config", "--port", "7003", env=env)
        self.assertEqual(result.returncode, 0, result)
        config = tomllib.loads(result.stdout)
        self.assertEqual(config["server"]["port"], 7003)          # flag
        self.assertEqual(config["log"]["level"], "error")         # env over file
        self.assertEqual(config["server"]["host"], "127.0.0.3")   # file over default

    def test_print_config_round_trips_through_check_config(self):
        empty = self.write("empty.toml", "")
        printed = self.run_vllmd("--config", empty, "--print-config", "--port", "9124",
                                 "--dev-mode")
        self.assertEqual(printed.returncode, 0, printed)
        path = self.write("printed.toml", printed.stdout)
        result = self.run_vllmd("--check-config", "--config", path)
        self.assertEqual(result.returncode, 0, result)

    def test_version_exits_0(self):
        result = self.run_vllmd("--version")
        self.assertEqual(result.returncode, 0, result)
        self.assertRegex(result.stdout, r"^vllmd \d+\.\d+\.\d+")

    def test_bad_flag_exits_64(self):
        for args in (["--no-such-flag"], ["--port"], ["--port", "1", "stray-argument"]):
            with self.subTest(args=args):
                result = self.run_vllmd(*args)
                self.assertEqual(result.returncode, EX_USAGE, result)
                self.assertNotEqual(result.stderr.strip(), "")


if __name__ == "__main__":
    unittest.main()
