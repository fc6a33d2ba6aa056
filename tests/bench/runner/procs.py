"""Processes and plain HTTP: every process is tracked, stopped by pid, and dies with the
runner (PR_SET_PDEATHSIG), so nothing outlives a run."""

import ctypes
import http.client
import json
import os
import signal
import subprocess
import sys

from runner.common import HOST

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "integration", "support"))
from ports import free_port  # noqa: E402,F401  (re-exported to the scenarios)

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def die_with_parent():
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def clean_env(extra=None):
    """The environment without anything that would configure vllmd, the baseline or systemd."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VLLMD_", "VLLM_", "VLLMCTL_")) and k != "NOTIFY_SOCKET"}
    env.update(extra or {})
    return env


class Process:
    running = []  # every live Process, so an interrupted run still stops them all

    def __init__(self, name, argv, log_path, env=None, stdout=None):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else self._log, stderr=self._log,
            env=env if env is not None else clean_env(), preexec_fn=die_with_parent)
        self.pid = self.popen.pid
        Process.running.append(self)

    def alive(self):
        return self.popen.poll() is None

    def stop(self, grace=5.0):
        """SIGTERM, SIGKILL after `grace` seconds; always reaped."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.popen.wait(timeout=grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait()
        self._log.close()
        if self in Process.running:
            Process.running.remove(self)

    def log_tail(self, lines=15):
        try:
            with open(self.log_path, "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def stop_all():
    for process in reversed(list(Process.running)):
        try:
            process.stop(grace=2.0)
        except Exception as error:  # keep stopping the others
            print(f"cannot stop {process.name} ({process.pid}): {error!r}", file=sys.stderr)


def http_call(port, method, path, body=None, timeout=30):
    """One request on a fresh connection: (status, body text)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        headers = {}
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            headers["Content-Type"] = "application/json"
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def health_status(port, timeout=1.0):
    try:
        return http_call(port, "GET", "/health", timeout=timeout)[0]
    except (OSError, http.client.HTTPException):
        return None


def read_proc_status(pid):
    """VmRSS and VmHWM (peak RSS) of a process in bytes, and its Threads count, from
    /proc/PID/status."""
    values = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
            elif key == "Threads":
                values[key] = int(rest.split()[0])
    return values
