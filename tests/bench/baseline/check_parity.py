#!/usr/bin/python3
"""Parity self-check for the benchmark baseline (server.py) against vllmd.

Starts, on free 127.0.0.1 ports, the baseline with its own `vllm-ref-engine`(s) and vllmd in
external mode with another set, sends both the same request sequence and asserts the same
status codes and JSON bodies; it also compares what each engine received on the wire (method
and msgpack args, byte for byte). Phases:

  1. DP=1: the trainer lifecycle (init -> start -> update -> finish+version -> weight_info),
     pause/resume, validation errors (400), engine-state errors (500), 404/405.
  2. DP=2, rank 1 failing set_weight_version: fan-out, per-rank error messages, "commit only
     after finish", version disagreement.
  3. Engine death: the DP=1 engines are killed; /health and engine routes answer 503.
  4. A slow engine and a 1 s call timeout: 504, the engine counted dead, then alive again
     when its late reply arrives.

Every process is started by this script, tracked by pid, and killed and reaped at the end
whatever happens (and gets SIGKILL if this script dies: PR_SET_PDEATHSIG).

    /usr/bin/python3 tests/bench/baseline/check_parity.py [--build-dir build-baseline]
        [--http auto|httptools|h11]

Exit status 0 when everything matches, 1 on a difference, 2 on a setup failure.
"""

import argparse
import concurrent.futures
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "integration", "support"))
from ports import free_port  # noqa: E402

HOST = "127.0.0.1"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
PYTHON = "/usr/bin/python3"

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("VLLMD_", "VLLM_", "VLLMCTL_"))}


class Processes:
    """Every child, by pid; stop_all() kills and reaps each one."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.children = []  # (name, Popen, log path)

    def start(self, name, argv):
        log_path = os.path.join(self.workdir, f"{name}.log")
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, env=clean_env(),
                                     preexec_fn=_die_with_parent)
        self.children.append((name, popen, log_path))
        return popen

    def kill(self, popen, sig=signal.SIGKILL):
        if popen.poll() is None:
            try:
                os.kill(popen.pid, sig)
            except ProcessLookupError:
                pass
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(popen.pid, signal.SIGKILL)
            popen.wait()

    def stop_all(self):
        for _name, popen, _log in reversed(self.children):
            self.kill(popen, signal.SIGTERM)  # a graceful stop first; SIGKILL after 5 s
        still = [(n, p.pid) for n, p, _ in self.children if p.poll() is None]
        if still:
            raise RuntimeError(f"processes left running: {still}")

    def log_of(self, name):
        for child_name, _popen, path in self.children:
            if child_name == name:
                with open(path, "rb") as handle:
                    return handle.read().decode("utf-8", "replace")
        return ""


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def health(url):
    try:
        return requests.get(url + "/health", timeout=5).status_code
    except requests.RequestException:
        return None


def read_record(path):
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines[:-1] if line.strip()]


class Setup:
    """The baseline and vllmd, each with `dp` reference engines of its own."""

    def __init__(self, procs, args, tag, dp, engine_extra=None, server_extra=()):
        self.procs, self.tag, self.dp = procs, tag, dp
        engine_extra = engine_extra or {}
        work = procs.workdir

        # The baseline: HTTP and handshake ports found by binding port 0.
        b_port, b_hs = free_port(), free_port()
        b_handshake = f"tcp://{HOST}:{b_hs}"
        self.baseline = procs.start(f"{tag}-baseline", [
            PYTHON, os.path.join(HERE, "server.py"), "--host", HOST, "--port", str(b_port),
            "--handshake-address", b_handshake, "--data-parallel-size", str(dp), "--dev-mode",
            "--log-level", "warning", "--http", args.http, *server_extra])
        self.baseline_url = f"http://{HOST}:{b_port}"

        # vllmd: external mode, its own port picked with --port 0 --port-file.
        v_handshake = f"tcp://{HOST}:{free_port()}"
        port_file = os.path.join(work, f"{tag}-vllmd.port")
        self.vllmd = procs.start(f"{tag}-vllmd", [
            args.vllmd, "--host", HOST, "--port", "0", "--port-file", port_file, "--dev-mode",
            "--engine", "external", "--handshake-address", v_handshake,
            "--data-parallel-size", str(dp), "--log-level", "warning", *server_extra])

        self.records = {"baseline": [], "vllmd": []}
        self.engines = {"baseline": [], "vllmd": []}
        for side, handshake in (("baseline", b_handshake), ("vllmd", v_handshake)):
            for rank in range(dp):
                record = os.path.join(work, f"{tag}-{side}-engine{rank}.jsonl")
                self.records[side].append(record)
                self.engines[side].append(procs.start(f"{tag}-{side}-engine{rank}", [
                    args.engine, "--handshake", handshake, "--rank", str(rank), "--dp", str(dp),
                    "--backend", "nccl", "--record", record, "--log-level", "warning",
                    *engine_extra.get(rank, ())]))

        def port_written():
            try:
                with open(port_file, encoding="ascii") as handle:
                    text = handle.read()
                return text.endswith("\n") and text.strip().isdigit()
            except FileNotFoundError:
                return False

        self._wait(port_written, "vllmd's port file")
        with open(port_file, encoding="ascii") as handle:
            self.vllmd_url = f"http://{HOST}:{int(handle.read())}"
        self._wait(lambda: health(self.vllmd_url) == 200, "vllmd /health -> 200")
        self._wait(lambda: health(self.baseline_url) == 200, "baseline /health -> 200")

    def _wait(self, predicate, what):
        def check():
            for name, popen in self.all_processes():
                if popen.poll() is not None:
                    raise RuntimeError(f"{name} exited with {popen.returncode}:\n"
                                       f"{self.procs.log_of(name)}")
            return predicate()
        wait_until(check, 30, what)

    def all_processes(self):
        yield f"{self.tag}-baseline", self.baseline
        yield f"{self.tag}-vllmd", self.vllmd
        for side in ("baseline", "vllmd"):
            for rank, popen in enumerate(self.engines[side]):
                yield f"{self.tag}-{side}-engine{rank}", popen


class Checker:
    def __init__(self):
        self.steps = 0
        self.differences = []

    def compare(self, setup, label, method, path, loose=False, **kwargs):
        """Sends one request to both servers; records a difference unless they agree.

        loose: error messages may differ (status, type, code and param must not)."""
        self.steps += 1
        answers = {}
        for side, url in (("baseline", setup.baseline_url), ("vllmd", setup.vllmd_url)):
            response = requests.request(method, url + path, timeout=60, **kwargs)
            try:
                body = response.json() if response.content else None
            except ValueError:
                body = ("<not JSON>", response.text[:200])
            answers[side] = (response.status_code, body)
        if loose:
            for side, (code, body) in list(answers.items()):
                if isinstance(body, dict) and isinstance(body.get("error"), dict):
                    answers[side] = (code, {"error": dict(body["error"], message="<any>")})
        same = answers["baseline"] == answers["vllmd"]
        status, body = answers["vllmd"]
        shown = json.dumps(body)
        print(f"  {'ok  ' if same else 'DIFF'} {label:<44} {method:<4} {path:<40} {status} "
              f"{shown if len(shown) < 110 else shown[:107] + '...'}")
        if not same:
            print(f"       baseline: {answers['baseline']}\n       vllmd:    {answers['vllmd']}")
            self.differences.append((setup.tag, label, answers))
        return answers["vllmd"]

    def compare_wire(self, setup):
        """What each engine of the baseline received equals what vllmd's received."""
        for rank in range(setup.dp):
            got = {side: read_record(setup.records[side][rank]) for side in setup.records}
            self.steps += 1
            b = [(c["method"], c["args_hex"]) for c in got["baseline"]]
            v = [(c["method"], c["args_hex"]) for c in got["vllmd"]]
            if b == v:
                print(f"  ok   engine rank {rank} received the same {len(v)} UTILITY calls, "
                      "args byte for byte")
                continue
            print(f"  DIFF engine rank {rank}: the wire calls differ")
            for i in range(max(len(b), len(v))):
                cb = got["baseline"][i] if i < len(b) else None
                cv = got["vllmd"][i] if i < len(v) else None
                if cb is None or cv is None or cb["args_hex"] != cv["args_hex"]:
                    print(f"       call {i}: baseline {cb and (cb['method'], cb['args'])}\n"
                          f"               vllmd    {cv and (cv['method'], cv['args'])}")
            self.differences.append((setup.tag, f"wire rank {rank}", None))


NCCL_INIT = {"init_info": {"master_address": "127.0.0.1", "master_port": 29500,
                           "rank_offset": 1, "world_size": 2}}


def update_info(*names):
    names = list(names) or ["model.layers.0.self_attn.qkv_proj.weight"]
    return {"names": names, "dtype_names": ["bfloat16"] * len(names),
            "shapes": [[4096, 4096]] * len(names)}


JSON = {"Content-Type": "application/json"}


def phase_lifecycle(c, s):
    print("phase 1: DP=1 lifecycle, pause/resume and errors")
    c.compare(s, "health", "GET", "/health")
    c.compare(s, "world size", "GET", "/get_world_size")
    c.compare(s, "world size without DP", "GET", "/get_world_size?include_dp=false")
    c.compare(s, "world size, bad include_dp", "GET", "/get_world_size?include_dp=maybe")
    c.compare(s, "initial version", "GET", "/weight_info")
    c.compare(s, "is_paused", "GET", "/is_paused")
    c.compare(s, "pause (default abort)", "POST", "/pause")
    c.compare(s, "is_paused after pause", "GET", "/is_paused")
    c.compare(s, "resume", "POST", "/resume")
    c.compare(s, "pause mode=wait, keep cache", "POST", "/pause?mode=wait&clear_cache=false")
    c.compare(s, "resume", "POST", "/resume")
    c.compare(s, "pause, bad mode", "POST", "/pause?mode=later")
    c.compare(s, "pause, bad clear_cache", "POST", "/pause?clear_cache=perhaps")
    c.compare(s, "update before start", "POST", "/update_weights",
              json={"update_info": update_info()})
    c.compare(s, "finish without start", "POST", "/finish_weight_update")
    c.compare(s, "init: malformed JSON", "POST", "/init_weight_transfer_engine",
              data=b'{"init_info": {', headers=JSON)
    c.compare(s, "init: empty body", "POST", "/init_weight_transfer_engine", headers=JSON)
    c.compare(s, "init: body is an array", "POST", "/init_weight_transfer_engine", json=[1])
    c.compare(s, "init: init_info missing", "POST", "/init_weight_transfer_engine", json={})
    c.compare(s, "init: init_info is a list", "POST", "/init_weight_transfer_engine",
              json={"init_info": [1, 2]})
    c.compare(s, "init (NCCL)", "POST", "/init_weight_transfer_engine", json=NCCL_INIT)
    c.compare(s, "pause", "POST", "/pause?mode=keep")
    c.compare(s, "start", "POST", "/start_weight_update")
    c.compare(s, "start again while active", "POST", "/start_weight_update")
    c.compare(s, "update: update_info is a string", "POST", "/update_weights",
              json={"update_info": "x"})
    c.compare(s, "update: list with a non-object", "POST", "/update_weights",
              json={"update_info": [update_info(), 3]})
    c.compare(s, "update (object)", "POST", "/update_weights",
              json={"update_info": update_info("a.weight", "b.weight")})
    c.compare(s, "update (per-worker list)", "POST", "/update_weights",
              json={"update_info": [update_info("c.weight")]})
    c.compare(s, "update: ints, floats, unicode kept", "POST", "/update_weights",
              json={"update_info": dict(update_info("é.weight"), extra=[0, -1, 2 ** 63,
                                                                        -2 ** 63, 1.5, None])})
    c.compare(s, "update: integer beyond 64 bits (loose)", "POST", "/update_weights",
              loose=True, data=b'{"update_info": {"names": [], "x": 18446744073709551616}}',
              headers=JSON)
    c.compare(s, "finish: version not a string", "POST", "/finish_weight_update",
              json={"weight_version": 42})
    c.compare(s, "finish with version", "POST", "/finish_weight_update",
              json={"weight_version": "step-1"})
    c.compare(s, "version after finish", "GET", "/weight_info")
    c.compare(s, "resume", "POST", "/resume")
    c.compare(s, "start", "POST", "/start_weight_update", data=b"ignored body")
    c.compare(s, "update: unequal lengths (engine error)", "POST", "/update_weights",
              json={"update_info": {"names": ["a"], "dtype_names": [], "shapes": [[1]]}})
    c.compare(s, "finish after a failed update", "POST", "/finish_weight_update",
              json={"weight_version": "step-2"})
    c.compare(s, "version unchanged by a failed finish", "GET", "/weight_info")
    c.compare(s, "start", "POST", "/start_weight_update")
    c.compare(s, "finish, body {}", "POST", "/finish_weight_update", json={})
    c.compare(s, "start draft", "POST", "/start_draft_weight_update")
    c.compare(s, "finish, version null", "POST", "/finish_weight_update",
              json={"weight_version": None})
    c.compare(s, "set version: missing", "POST", "/update_weight_version", json={})
    c.compare(s, "set version", "POST", "/update_weight_version", json={"new_version": "v9"})
    c.compare(s, "version after set", "GET", "/weight_info")
    c.compare(s, "unknown path", "GET", "/v1/models")
    c.compare(s, "trailing slash", "GET", "/health/")
    c.compare(s, "wrong method", "GET", "/start_weight_update")
    c.compare(s, "wrong method", "POST", "/weight_info")

    c.compare_wire(s)

    # Concurrent read-only calls: each matched to its own reply. The engines' call counts may
    # differ here: while another call is in flight vllmd answers /weight_info and /is_paused
    # from what the engines last told it, where the baseline (like vLLM) always asks them.
    before = {side: len(read_record(s.records[side][0])) for side in s.records}

    def both(path):
        return [requests.get(url + path, timeout=30) for url in (s.baseline_url, s.vllmd_url)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(both, ["/weight_info", "/is_paused", "/get_world_size"] * 20))
    c.steps += 1
    mismatched = [(b.status_code, b.text, v.status_code, v.text) for b, v in results
                  if (b.status_code, b.json()) != (v.status_code, v.json())]
    print(f"  {'ok  ' if not mismatched else 'DIFF'} 60 concurrent read-only calls on each server")
    if mismatched:
        c.differences.append((s.tag, "concurrent", mismatched[:3]))
    reached = {side: len(read_record(s.records[side][0])) - before[side] for side in s.records}
    print(f"       (engine calls they caused: baseline {reached['baseline']}, "
          f"vllmd {reached['vllmd']} -- the rest vllmd answered from its known state)")


def phase_data_parallel(c, s):
    print("phase 2: DP=2, engine rank 1 fails set_weight_version")
    c.compare(s, "health", "GET", "/health")
    c.compare(s, "world size (TP x DP)", "GET", "/get_world_size")
    c.compare(s, "world size without DP", "GET", "/get_world_size?include_dp=0")
    c.compare(s, "init", "POST", "/init_weight_transfer_engine", json=NCCL_INIT)
    c.compare(s, "start", "POST", "/start_weight_update")
    c.compare(s, "update (one entry per worker)", "POST", "/update_weights",
              json={"update_info": [update_info("a"), update_info("b")]})
    c.compare(s, "finish + version: set_weight_version fails", "POST", "/finish_weight_update",
              json={"weight_version": "step-7"})
    c.compare(s, "engines now disagree", "GET", "/weight_info")
    c.compare(s, "set version: rank 1 fails", "POST", "/update_weight_version",
              json={"new_version": "x"})
    c.compare(s, "start", "POST", "/start_weight_update")
    c.compare(s, "start again: both ranks fail", "POST", "/start_weight_update")
    c.compare(s, "finish without version", "POST", "/finish_weight_update")
    c.compare(s, "pause", "POST", "/pause")
    c.compare(s, "is_paused", "GET", "/is_paused")
    c.compare(s, "resume", "POST", "/resume")
    c.compare_wire(s)


def phase_engine_death(c, s):
    print("phase 3: the DP=1 engines are killed")
    for side in ("baseline", "vllmd"):
        s.procs.kill(s.engines[side][0])
    for name, url in (("baseline", s.baseline_url), ("vllmd", s.vllmd_url)):
        wait_until(lambda url=url: health(url) == 503, 15, f"{name} /health -> 503")
    c.compare(s, "health with a dead engine", "GET", "/health")
    c.compare(s, "version with a dead engine", "GET", "/weight_info")
    c.compare(s, "start with a dead engine", "POST", "/start_weight_update")
    c.compare(s, "world size with a dead engine", "GET", "/get_world_size")


def phase_timeout(c, s):
    print("phase 4: --call-timeout 1, the engine takes 2.5 s to start an update")
    c.compare(s, "start: the engine is too slow", "POST", "/start_weight_update")
    c.compare(s, "health: dead by timeout", "GET", "/health")
    for name, url in (("baseline", s.baseline_url), ("vllmd", s.vllmd_url)):
        wait_until(lambda url=url: health(url) == 200, 15, f"{name} /health -> 200 again")
    c.compare(s, "health after the late reply", "GET", "/health")
    c.compare(s, "init", "POST", "/init_weight_transfer_engine", json=NCCL_INIT)
    c.compare(s, "update: the late start opened a session", "POST", "/update_weights",
              json={"update_info": update_info()})
    c.compare(s, "finish with version", "POST", "/finish_weight_update",
              json={"weight_version": "late"})
    c.compare(s, "version", "GET", "/weight_info")
    c.compare_wire(s)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", default=os.path.join(REPO, "build-baseline"))
    parser.add_argument("--vllmd", help="vllmd binary (default BUILD/daemon/vllmd)")
    parser.add_argument("--engine", help="vllm-ref-engine (default BUILD/cmd/vllm-ref-engine)")
    parser.add_argument("--http", default="auto", choices=["auto", "httptools", "h11"],
                        help="the baseline's HTTP implementation")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    args.vllmd = args.vllmd or os.path.join(args.build_dir, "daemon", "vllmd")
    args.engine = args.engine or os.path.join(args.build_dir, "cmd", "vllm-ref-engine")
    for binary in (args.vllmd, args.engine):
        if not os.access(binary, os.X_OK):
            print(f"not an executable: {binary} (build it first)", file=sys.stderr)
            return 2

    workdir = tempfile.mkdtemp(prefix="baseline-parity-")
    procs = Processes(workdir)
    checker = Checker()
    status = 0
    try:
        single = Setup(procs, args, "dp1", 1)
        phase_lifecycle(checker, single)
        dual = Setup(procs, args, "dp2", 2, {1: ["--inject-fail", "set_weight_version"]})
        phase_data_parallel(checker, dual)
        phase_engine_death(checker, single)
        slow = Setup(procs, args, "slow", 1, {0: ["--inject-delay", "start_weight_update=2.5"]},
                     ["--call-timeout", "1"])
        phase_timeout(checker, slow)
    except Exception as error:  # noqa: BLE001 - report, then clean up
        print(f"setup failure: {error!r}", file=sys.stderr)
        status = 2
    finally:
        procs.stop_all()
        pids = ", ".join(f"{name}={popen.pid}" for name, popen, _ in procs.children)
        print(f"stopped and reaped {len(procs.children)} processes ({pids})")
        if args.keep_logs or status:
            print(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if status:
        return status
    print(f"{checker.steps} checks, {len(checker.differences)} difference(s)")
    return 1 if checker.differences else 0


if __name__ == "__main__":
    sys.exit(main())
