"""A server under test (vllmd or the baseline) with its engines, and the run's context: the
programs in the build directory and how to call them."""

import json
import os
import subprocess
import time

from runner.common import BASELINE_SERVER, HOST, PYTHON, Settings, log
from runner.procs import Process, die_with_parent, clean_env, free_port, health_status, http_call

class Rig:
    """vllmd (external engine mode) or the baseline, plus `dp` vllm-ref-engine processes."""

    def __init__(self, ctx, server, backend="nccl", engine_extra=(), dp=1,
                 baseline_script=BASELINE_SERVER, env_extra=None):
        self.ctx = ctx
        self.server = server
        self.handshake = f"tcp://{HOST}:{free_port()}"
        tag = f"{server}-{backend}-{ctx.next_id()}"
        if server == "vllmd":
            port_file = os.path.join(ctx.workdir, f"{tag}.port")
            argv = [ctx.bin("vllmd"), "--dev-mode", "--engine", "external",
                    "--handshake-address", self.handshake, "--data-parallel-size", str(dp),
                    "--host", HOST, "--port", "0", "--port-file", port_file,
                    "--log-level", "warning", *ctx.args.vllmd_arg]
            self.port = None
        else:
            self.port = free_port()
            port_file = None
            argv = [PYTHON, baseline_script, "--host", HOST, "--port", str(self.port),
                    "--handshake-address", self.handshake, "--data-parallel-size", str(dp),
                    "--dev-mode", "--log-level", "warning", *ctx.args.baseline_arg]
        self.process = Process(server, argv, os.path.join(ctx.workdir, f"{tag}.log"),
                               env=clean_env(env_extra))
        self.engines = []
        try:
            for rank in range(dp):
                self.engines.append(Process(
                    f"engine{rank}",
                    [ctx.bin("vllm-ref-engine"), "--handshake", self.handshake, "--rank",
                     str(rank), "--dp", str(dp), "--tp", "1", "--backend", backend,
                     "--log-level", "warning", *engine_extra],
                    os.path.join(ctx.workdir, f"{tag}.engine{rank}.log")))
            if port_file:
                self.port = self._wait_port_file(port_file, 30)
            self._wait_healthy(60)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self):
        return self.process.pid

    def _check_alive(self):
        for process in [self.process, *self.engines]:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n"
                                   f"{process.log_tail()}")

    def _wait_port_file(self, path, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(path, encoding="ascii") as handle:
                    text = handle.read()
                if text.endswith("\n") and text.strip().isdigit():
                    return int(text)
            except FileNotFoundError:
                pass
            self._check_alive()
            time.sleep(0.01)
        raise RuntimeError(f"{self.server} wrote no port file in {timeout} s:\n"
                           f"{self.process.log_tail()}")

    def _wait_healthy(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if health_status(self.port) == 200:
                return
            self._check_alive()
            time.sleep(0.02)
        raise RuntimeError(f"{self.server}: GET /health never answered 200 in {timeout} s:\n"
                           f"{self.process.log_tail()}")

    def post_ok(self, path, body=None):
        status, text = http_call(self.port, "POST", path, body)
        if status != 200:
            raise RuntimeError(f"{self.server}: POST {path} -> {status}: {text[:300]}")

    def stop(self):
        # Engines first: calls still blocked in them then fail at once and the server's
        # SIGTERM drain is quick.
        for engine in self.engines:
            engine.stop()
        self.process.stop()


def start_rig(ctx, server, **kwargs):
    """A Rig, trying twice: a port probed free can be taken by someone else before use."""
    try:
        return Rig(ctx, server, **kwargs)
    except RuntimeError as error:
        log(f"{server} did not start ({str(error).splitlines()[0]}); trying once more")
        return Rig(ctx, server, **kwargs)


class Context:
    def __init__(self, args, workdir):
        self.args = args
        self.workdir = workdir
        self.settings = Settings(args.quick)
        self._id = 0
        self.payload_files = {}  # kind -> (path, bytes)
        self.errors = []

    def fail(self, what, error):
        """Records a failed step; the run goes on with the next one."""
        self.errors.append(f"{what}: {error}")
        log(f"FAILED {what}: {error}")

    def next_id(self):
        self._id += 1
        return self._id

    def bin(self, name):
        paths = {"vllmd": "daemon/vllmd", "vllm-ref-engine": "cmd/vllm-ref-engine",
                 "http_load": "tests/bench/http_load", "make_payload": "tests/bench/make_payload",
                 "json_floor": "tests/bench/json_floor", "sse_load": "tests/bench/sse_load",
                 "sse_floor": "tests/bench/sse_floor"}
        return os.path.join(self.args.build_dir, paths[name])

    def run_json(self, argv, timeout):
        """Runs one of the C++ programs and returns the JSON line it printed."""
        done = subprocess.run(argv, capture_output=True, timeout=timeout, env=clean_env(),
                              preexec_fn=die_with_parent)
        if done.returncode != 0:
            raise RuntimeError(f"{os.path.basename(argv[0])} exited with {done.returncode}: "
                               f"{done.stderr.decode('utf-8', 'replace').strip()[:500]}")
        lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
        return json.loads(lines[-1])

    def load(self, port, requests, connections=1, duration=None, warmup=None, iterations=0,
             label=""):
        settings = self.settings
        duration = settings.load_seconds if duration is None else duration
        warmup = settings.load_warmup if warmup is None else warmup
        argv = [self.bin("http_load"), "--port", str(port), "--connections", str(connections),
                "--duration", str(duration), "--warmup", str(warmup),
                "--iterations", str(iterations), "--label", label]
        for request in requests:
            argv += ["--request", request]
        return self.run_json(argv, timeout=duration + warmup + 60)

    def load_async(self, port, requests, connections, duration, iterations, label):
        """http_load in the background; returns the Process (its JSON line goes to a file)."""
        out_path = os.path.join(self.workdir, f"load-{self.next_id()}.json")
        argv = [self.bin("http_load"), "--port", str(port), "--connections", str(connections),
                "--duration", str(duration), "--iterations", str(iterations), "--label", label]
        for request in requests:
            argv += ["--request", request]
        out = open(out_path, "wb")
        process = Process("http_load", argv, os.path.join(self.workdir, "http_load.log"),
                          stdout=out)
        out.close()  # the child has its own copy
        process.out_path = out_path
        return process


def read_load_output(process, timeout):
    process.popen.wait(timeout=timeout)
    code = process.popen.returncode
    process.stop()
    with open(process.out_path, encoding="utf-8", errors="replace") as handle:
        lines = handle.read().strip().splitlines()
    if code != 0 or not lines:
        raise RuntimeError(f"http_load exited with {code}: {process.log_tail()}")
    return json.loads(lines[-1])
