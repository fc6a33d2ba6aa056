"""Shared harness of the Python integration suites (daemon/ and vllmctl/): real `vllmd` and
`vllm-ref-engine` processes on 127.0.0.1, driven over HTTP.

CTest puts this directory on PYTHONPATH, so the suites `import harness`; vllmctl/ctl_harness.py
adds only what is specific to running the vllmctl binary. Binary paths come from VLLMD_BIN and
VLLM_REF_ENGINE_BIN (and VLLMCTL_BIN for vllmctl; CTest sets them). Every process a test starts
is registered with the test case and killed and reaped by pid when the test ends, whatever
happened; children also get SIGKILL from the kernel if the test runner itself dies
(PR_SET_PDEATHSIG), so nothing outlives a test. Each test gets its own temporary directory
(port file, engine records, logs), removed afterwards.
"""

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import requests

from ports import free_port  # noqa: F401  (tests take it from here)

HOST = "127.0.0.1"

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    # Runs in the child between fork and exec: SIGKILL it when the test runner dies.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def binary(variable):
    path = os.environ.get(variable)
    if not path:
        # Not a skip: a misconfigured run must not pass silently.
        raise RuntimeError(f"{variable} is not set (ctest sets it; or export it by hand)")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{variable}={path} is not an executable")
    return path


def vllmd_bin():
    return binary("VLLMD_BIN")


def engine_bin():
    return binary("VLLM_REF_ENGINE_BIN")


def clean_env(extra=None):
    """The environment without any variable that would configure vllmd or vllmctl."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("VLLMD_", "VLLM_", "VLLMCTL_"))
    }
    env.update(extra or {})
    return env


def wait_until(predicate, timeout, interval=0.02, message="condition"):
    """Polls `predicate` until it returns a truthy value (returned) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)


class Process:
    """One child process with its output in a log file."""

    def __init__(self, name, argv, log_path, env=None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env if env is not None else clean_env(),
            preexec_fn=die_with_parent,
        )
        self.pid = self.popen.pid

    def alive(self):
        return self.popen.poll() is None

    def kill(self, sig=signal.SIGKILL):
        """Sends `sig` by pid (if still running) and reaps the process."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait()
        self._log.close()

    def freeze(self):
        """SIGSTOP, and returns once every thread is stopped.

        kill() only queues the stop: on a busy machine the process runs on, and can answer a
        request sent after kill() returned, until the scheduler gets to it."""
        os.kill(self.pid, signal.SIGSTOP)

        def every_thread_stopped():
            for task in os.listdir(f"/proc/{self.pid}/task"):
                try:
                    with open(f"/proc/{self.pid}/task/{task}/stat", encoding="ascii") as stat:
                        state = stat.read().rsplit(")", 1)[1].split()[0]
                except FileNotFoundError:
                    continue  # a thread that just exited
                if state not in ("T", "t"):
                    return False
            return True

        wait_until(every_thread_stopped, 10, interval=0.001, message=f"{self.name} stopped")

    def thaw(self):
        """SIGCONT, if the process still runs."""
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)

    def stop(self):
        """SIGTERM, then SIGKILL after a short grace period; always reaped."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.popen.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill(signal.SIGKILL)

    def log(self):
        try:
            with open(self.log_path, "rb") as handle:
                return handle.read().decode("utf-8", "replace")
        except OSError:
            return ""


class Daemon(Process):
    """A running vllmd, listening on a port it picked itself (--port 0 --port-file)."""

    def __init__(self, workdir, args, env=None, name="vllmd"):
        self.port_file = os.path.join(workdir, f"{name}.port")
        argv = [vllmd_bin(), *args, "--port", "0", "--port-file", self.port_file]
        super().__init__(name, argv, os.path.join(workdir, f"{name}.log"), env)
        self.port = None
        self.url = None

    def wait_listening(self, timeout=20):
        self.port = self._wait_for_port(timeout)
        self.url = f"http://{HOST}:{self.port}"
        return self

    def _wait_for_port(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(self.port_file, encoding="ascii") as handle:
                    text = handle.read()
                if text.endswith("\n") and text.strip().isdigit():
                    return int(text)
            except FileNotFoundError:
                pass
            if not self.alive():
                raise RuntimeError(
                    f"vllmd exited with {self.popen.returncode} before listening:\n{self.log()}")
            time.sleep(0.02)
        raise RuntimeError(f"vllmd did not write {self.port_file} in {timeout} s:\n{self.log()}")

    # HTTP helpers: plain `requests` calls, a new connection each, short timeouts.
    def get(self, path, **kwargs):
        kwargs.setdefault("timeout", 30)
        return requests.get(self.url + path, **kwargs)

    def post(self, path, **kwargs):
        kwargs.setdefault("timeout", 30)
        return requests.post(self.url + path, **kwargs)

    def metric(self, name):
        """The value of an unlabelled sample in GET /metrics."""
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"no metric {name}")

    def wait_no_pending_calls(self, timeout=5):
        wait_until(lambda: self.metric("vllmd_engine_calls_pending") == 0, timeout,
                   message="no engine call left pending")

    def health_status(self):
        try:
            return self.get("/health", timeout=5).status_code
        except requests.RequestException:
            return None

    def wait_healthy(self, timeout=20):
        wait_until(lambda: self.health_status() == 200, timeout,
                   message=f"GET /health -> 200 (log:\n{self.log()})")

    def wait_unhealthy(self, timeout=10):
        wait_until(lambda: self.health_status() == 503, timeout, message="GET /health -> 503")


class Engine(Process):
    """A vllm-ref-engine process standing in for a headless `vllm serve`."""

    def __init__(self, workdir, handshake, rank=0, dp=1, tp=1, backend="nccl", extra=(),
                 record=True, name=None):
        name = name or f"engine{rank}"
        self.record_path = os.path.join(workdir, f"{name}.record.jsonl") if record else None
        argv = [engine_bin(), "--handshake", handshake, "--rank", str(rank), "--dp", str(dp),
                "--tp", str(tp), "--backend", backend, *extra]
        if self.record_path:
            argv += ["--record", self.record_path]
        # Several incarnations of one rank (restarts) get distinct logs.
        log_path = os.path.join(workdir, f"{name}.{time.monotonic_ns()}.log")
        super().__init__(name, argv, log_path)

    def calls(self):
        return read_record(self.record_path)


def read_record(path):
    """The calls a --record file holds, as dicts (method, worker_method, args, args_hex).

    Only complete lines are returned: the engine may be writing one right now."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return []
    lines = text.split("\n")
    return [json.loads(line) for line in lines[:-1] if line.strip()]


def wire(calls):
    """(method, args) pairs of recorded calls, for comparisons."""
    return [(call["method"], call["args"]) for call in calls]


def call_names(calls):
    """worker_method for collective_rpc calls, the method otherwise."""
    return [call["worker_method"] or call["method"] for call in calls]


def rpc(worker_method, kwargs=None):
    """The collective_rpc args vllmd must send (docs/engine-protocol.md §5.1)."""
    return ("collective_rpc", [worker_method, None, [], kwargs if kwargs is not None else {}])


# A valid NCCL init_info for the reference engine (which checks the dataclass fields).
NCCL_INIT_INFO = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1,
                  "world_size": 2}


def greedy(daemon, prompt, tokens):
    """POST /inference/v1/generate greedy with logprobs, through EOS: (token ids, logprobs)."""
    response = daemon.post("/inference/v1/generate", json={
        "token_ids": prompt,
        "sampling_params": {"max_tokens": tokens, "temperature": 0, "logprobs": 0,
                            "ignore_eos": True}}, timeout=60)
    if response.status_code != 200:
        raise AssertionError(f"generate: {response.status_code} {response.text}")
    choice = response.json()["choices"][0]
    return choice["token_ids"], [item["logprob"] for item in choice["logprobs"]["content"]]


def update_info(*names):
    names = list(names) or ["model.layers.0.weight"]
    return {"names": names, "dtype_names": ["bfloat16"] * len(names),
            "shapes": [[4, 4]] * len(names)}


class NotifySocket:
    """A datagram socket collecting sd_notify messages, with their arrival times."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.1)
        self.messages = []  # (monotonic time, {key: value})
        self._stop = False
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self):
        while not self._stop:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def first(self, key, timeout=20):
        found = []

        def seen():
            found[:] = [(t, f) for t, f in self.messages if key in f]
            return bool(found)

        wait_until(seen, timeout, message=f"sd_notify {key}")
        return found[0]

    def values(self, key):
        return [fields[key] for _, fields in self.messages if key in fields]

    def close(self):
        self._stop = True
        self._thread.join()
        self.sock.close()


SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


class DaemonTestCase(unittest.TestCase):
    """Gives each test a temporary directory and kills every process it started."""

    workdir_prefix = "vllmd-it-"

    def setUp(self):
        super().setUp()
        self.workdir = tempfile.mkdtemp(prefix=self.workdir_prefix)
        self.addCleanup(shutil.rmtree, self.workdir, True)
        self._processes = []
        # Registered after rmtree, so it runs before it (cleanups run last-in first-out).
        self.addCleanup(self._kill_all)

    def _kill_all(self):
        # Latest first (engines before their daemon); each killed and reaped by pid, and one
        # failure does not spare the others.
        errors = []
        for process in reversed(self._processes):
            try:
                process.stop() if isinstance(process, Daemon) else process.kill()
            except Exception as error:  # pragma: no cover - reported below
                errors.append(f"{process.name} ({process.pid}): {error!r}")
                try:
                    os.kill(process.pid, signal.SIGKILL)
                    process.popen.wait(timeout=10)
                except Exception:
                    pass
        if errors:
            raise RuntimeError("cleanup failed: " + "; ".join(errors))
        # Under ASan+UBSan (CI), a report in any process's log fails the test that ran it.
        for process in self._processes:
            log = process.log()
            for marker in SANITIZER_MARKERS:
                if marker in log:
                    raise AssertionError(f"{process.name}: sanitizer report:\n{log[-4000:]}")

    def _track(self, process):
        self._processes.append(process)
        return process

    def launch_daemon(self, args, env=None, name="vllmd"):
        """vllmd with exactly `args` (plus its port flags), listening."""
        # Tracked before waiting, so a daemon that never listens is still killed.
        return self._track(Daemon(self.workdir, args, env, name)).wait_listening()

    def start_daemon(self, args, env=None, name="vllmd"):
        # Subclasses may redefine start_daemon with their own defaults; start_external below
        # calls launch_daemon, which they leave alone.
        return self.launch_daemon(args, env, name)

    def start_engine(self, handshake, **kwargs):
        return self._track(Engine(self.workdir, handshake, **kwargs))

    def start_external(self, dp=1, engine_extra=None, daemon_args=(), record=True,
                       backend="nccl", tp=1, name=None):
        """vllmd in external mode with `dp` reference engines attached and healthy.

        engine_extra maps a rank to extra engine flags; `name` tells several daemons' files
        (and their engines') apart."""
        handshake = f"tcp://{HOST}:{free_port()}"
        daemon = self.launch_daemon(
            ["--dev-mode", "--engine", "external", "--handshake-address", handshake,
             "--data-parallel-size", str(dp), *daemon_args], name=name or "vllmd")
        engines = [
            self.start_engine(handshake, rank=rank, dp=dp, tp=tp, backend=backend,
                              extra=(engine_extra or {}).get(rank, ()), record=record,
                              name=f"{name}-engine{rank}" if name else None)
            for rank in range(dp)
        ]

        def healthy():
            for engine in engines:
                if not engine.alive():
                    raise RuntimeError(f"{engine.name} exited with {engine.popen.returncode}:\n"
                                       f"{engine.log()}")
            return daemon.health_status() == 200

        try:
            wait_until(healthy, 20, message="GET /health -> 200")
        except AssertionError as error:
            # The logs as they are now, not as they were when the wait began.
            logs = "".join(f"\n--- {p.name} log:\n{p.log()}" for p in [daemon, *engines])
            raise AssertionError(f"{error}{logs}") from None
        return daemon, engines, handshake

    def write_config(self, text, name="vllmd.toml"):
        """Writes a vllmd TOML file in the test's directory; returns its path."""
        path = os.path.join(self.workdir, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def hup_and_wait_for(self, daemon, line):
        """Sends SIGHUP and waits for one more occurrence of `line` in the daemon's log."""
        before = daemon.log().count(line)
        daemon.popen.send_signal(signal.SIGHUP)
        wait_until(lambda: daemon.log().count(line) > before, 10, message=line)

    def assert_json(self, response, status, body):
        """The response has this status and exactly this JSON body."""
        self.assertEqual(response.status_code, status, response.text)
        self.assertEqual(response.json(), body)

    def assert_error(self, response, status, code, param=None, message=None, type_=None,
                     message_prefix=None):
        """An error in the OpenAI shape {"error": {message, type, param, code}}."""
        self.assertEqual(response.status_code, status, response.text)
        self.assertTrue(response.headers.get("Content-Type", "").startswith("application/json"),
                        response.headers)
        body = response.json()
        self.assertEqual(set(body), {"error"}, body)
        error = body["error"]
        self.assertEqual(set(error), {"message", "type", "param", "code"}, body)
        self.assertIsInstance(error["message"], str)
        self.assertEqual(error["code"], code, body)
        self.assertEqual(error["param"], param, body)
        if type_ is None:
            type_ = "invalid_request_error" if status < 500 else "server_error"
        self.assertEqual(error["type"], type_, body)
        if message is not None:
            self.assertEqual(error["message"], message, body)
        if message_prefix is not None:
            self.assertTrue(error["message"].startswith(message_prefix), body)
        return error
