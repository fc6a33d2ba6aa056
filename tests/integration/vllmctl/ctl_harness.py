"""What the vllmctl integration tests add to the shared harness (tests/integration/support/
harness.py, on PYTHONPATH): running the real `vllmctl` binary (VLLMCTL_BIN) against this test's
vllmd, asserting on its exit code and output, and writing its input files.
"""

import json
import os
import subprocess

from harness import HOST, DaemonTestCase, binary, clean_env, die_with_parent


class CtlTestCase(DaemonTestCase):
    """The shared per-test directory and process bookkeeping, and a vllmctl runner."""

    workdir_prefix = "vllmctl-it-"

    def setUp(self):
        super().setUp()
        self.server = f"http://{HOST}:9"  # until a daemon is started

    def start_daemon(self, *args, name="vllmd"):
        """vllmd in dev mode with the embedded engine (unless args say otherwise), healthy."""
        daemon = self.launch_daemon(["--dev-mode", *args], name=name)
        if "external" not in args:
            daemon.wait_healthy()
        self.server = daemon.url
        return daemon

    def start_external(self, *engine_args, daemon_args=(), name=None):
        """vllmd in external mode with one vllm-ref-engine (recording its calls) attached;
        `name` tells several daemons apart."""
        daemon, (engine,), _ = super().start_external(engine_extra={0: engine_args},
                                                      daemon_args=daemon_args, name=name)
        self.server = daemon.url
        return daemon, engine

    def write(self, name, content):
        """A file in the test directory: JSON-encoded unless already str/bytes."""
        path = os.path.join(self.workdir, name)
        if not isinstance(content, (str, bytes)):
            content = json.dumps(content)
        with open(path, "wb") as handle:
            handle.write(content.encode() if isinstance(content, str) else content)
        return path

    def ctl(self, *args, env=None, stdin=None, input=None, server=True, timeout=120):
        """Runs vllmctl (against this test's daemon unless server=False); CompletedProcess."""
        argv = [binary("VLLMCTL_BIN")]
        if server:
            argv += ["--server", self.server]
        argv += list(args)
        if stdin is None and input is None:
            stdin = subprocess.DEVNULL
        return subprocess.run(argv, env=clean_env(env), stdin=stdin, input=input,
                              capture_output=True, text=True, timeout=timeout,
                              cwd=self.workdir, preexec_fn=die_with_parent)

    def assert_ok(self, result):
        self.assertEqual(result.returncode, 0,
                         f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
        return result

    def assert_exit(self, result, code, stderr_has=()):
        self.assertEqual(result.returncode, code,
                         f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
        for text in ([stderr_has] if isinstance(stderr_has, str) else stderr_has):
            self.assertIn(text, result.stderr)
        return result

    def json_lines(self, result):
        """-o json output: one JSON document per line."""
        return [json.loads(line) for line in result.stdout.splitlines()]
