"""Harness for the vllmctl integration tests: the real `vllmctl` binary against a real `vllmd`
(embedded reference engine, or external mode with `vllm-ref-engine` processes), on 127.0.0.1.

Binary paths come from VLLMCTL_BIN, VLLMD_BIN and VLLM_REF_ENGINE_BIN (CTest sets them). Every
process a test starts is killed and reaped by pid when the test ends; children also die with the
test runner (PR_SET_PDEATHSIG). Ports come from port 0 (vllmd's --port-file) or from a bind to
port 0 on loopback (engine handshake). Each test has its own temporary directory.
"""

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

import requests

HOST = "127.0.0.1"
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def binary(variable):
    path = os.environ.get(variable)
    if not path:
        raise unittest.SkipTest(f"{variable} is not set (run through ctest)")
    return path


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def clean_env(extra=None):
    """The environment without anything that configures vllmd or vllmctl."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("VLLMD_", "VLLM_", "VLLMCTL_"))}
    env.update(extra or {})
    return env


def wait_until(predicate, timeout, message):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(0.02)


def read_record(path):
    """The calls an engine's --record file holds (complete lines only)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines[:-1] if line.strip()]


def call_names(calls):
    """worker_method for collective_rpc calls, the method otherwise."""
    return [call["worker_method"] or call["method"] for call in calls]


# The reference engine checks NCCL init_info's dataclass fields and update_info's lists.
INIT_INFO = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
             "world_size": 2}


def update_info(*names):
    names = list(names) or ["model.layers.0.weight"]
    return {"names": names, "dtype_names": ["bfloat16"] * len(names),
            "shapes": [[4, 4]] * len(names)}


class Process:
    def __init__(self, argv, log_path, env=None):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, env=env or clean_env(),
                                      preexec_fn=_die_with_parent)
        self.pid = self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def kill(self):
        """SIGTERM, SIGKILL after a grace period; always reaped."""
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            if self.popen.poll() is not None:
                break
            try:
                os.kill(self.pid, sig)
                self.popen.wait(timeout=grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.popen.wait()
        self._log.close()

    def log(self):
        with open(self.log_path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")


class Daemon(Process):
    def __init__(self, workdir, args, name):
        port_file = os.path.join(workdir, f"{name}.port")
        super().__init__([binary("VLLMD_BIN"), *args, "--port", "0", "--port-file", port_file],
                         os.path.join(workdir, f"{name}.log"))
        self.port_file = port_file
        self.url = None

    def wait_listening(self, timeout=20):
        def port():
            if not self.alive():
                raise RuntimeError(f"vllmd exited with {self.popen.returncode}:\n{self.log()}")
            try:
                with open(self.port_file, encoding="ascii") as handle:
                    text = handle.read()
            except FileNotFoundError:
                return None
            return int(text) if text.endswith("\n") and text.strip().isdigit() else None

        self.url = f"http://{HOST}:{wait_until(port, timeout, 'the port file')}"
        return self

    def get(self, path, **kwargs):
        kwargs.setdefault("timeout", 30)
        return requests.get(self.url + path, **kwargs)

    def health(self):
        try:
            return self.get("/health", timeout=5).status_code
        except requests.RequestException:
            return None

    def wait_healthy(self, timeout=20):
        wait_until(lambda: self.health() == 200, timeout, f"/health 200:\n{self.log()}")
        return self


class CtlTestCase(unittest.TestCase):
    """A temporary directory and process bookkeeping per test, and a vllmctl runner."""

    def setUp(self):
        super().setUp()
        self.workdir = tempfile.mkdtemp(prefix="vllmctl-it-")
        self.addCleanup(shutil.rmtree, self.workdir, True)
        self._processes = []
        self.addCleanup(self._kill_all)  # runs before rmtree (cleanups are LIFO)
        self.server = f"http://{HOST}:9"  # until a daemon is started

    def _kill_all(self):
        for process in reversed(self._processes):  # engines before their daemon
            process.kill()

    def start_daemon(self, *args, name="vllmd"):
        """vllmd in dev mode with the embedded engine (unless args say otherwise), healthy."""
        daemon = Daemon(self.workdir, ["--dev-mode", *args], name)
        self._processes.append(daemon)
        daemon.wait_listening()
        if "external" not in args:
            daemon.wait_healthy()
        self.server = daemon.url
        return daemon

    def start_external(self, *engine_args, daemon_args=()):
        """vllmd in external mode with one vllm-ref-engine (recording its calls) attached."""
        handshake = f"tcp://{HOST}:{free_port()}"
        daemon = self.start_daemon("--engine", "external", "--handshake-address", handshake,
                                   *daemon_args)
        record = os.path.join(self.workdir, "engine.record.jsonl")
        engine = Process([binary("VLLM_REF_ENGINE_BIN"), "--handshake", handshake,
                          "--record", record, *engine_args],
                         os.path.join(self.workdir, "engine.log"))
        self._processes.append(engine)
        daemon.wait_healthy()
        engine.record = record
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
                              cwd=self.workdir, preexec_fn=_die_with_parent)

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
