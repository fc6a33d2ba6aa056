#!/usr/bin/python3
"""Real bytes through the whole path: examples/tcp_trainer.py pushes tensors into reference
engines on the tcp backend (DP x TP workers), through vllmd and through the FastAPI baseline.

    /usr/bin/python3 tests/bench/real_bytes.py --build-dir build-release [--megabytes 64]
        [--steps 5] [--dp 2] [--tp 2] [--servers vllmd,baseline]

Per step, for each server: the sync (pause, start, update with the bytes, finish with a
version, resume), the update alone (POST /update_weights until every worker holds the bytes),
and the check (POST /weight_checker compare against the trainer's SHA-256). Prints the median
of --steps steps in ms, the update's rate in MB/s of bytes received by all workers together,
and the update's time over the trainer's own send to the same workers (the send runs inside the
update: the ratio is what the control plane adds around the bytes). The baseline serves no
/weight_checker: its check column is empty. Builds nothing; starts every process itself on 127.0.0.1 with
ports picked at run time and stops each by pid (PR_SET_PDEATHSIG covers a crash).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

import tcp_trainer  # noqa: E402
from runner.common import BASELINE_SERVER, HOST, PYTHON  # noqa: E402
from runner.procs import Process, free_port, health_status, http_call, stop_all  # noqa: E402


def start_server(server, build_dir, workdir, dp, tp):
    """The server (external engine mode) and its DP engines of TP workers each, healthy."""
    handshake = f"tcp://{HOST}:{free_port()}"
    port = free_port()
    if server == "vllmd":
        argv = [os.path.join(build_dir, "daemon", "vllmd"), "--dev-mode", "--engine", "external",
                "--handshake-address", handshake, "--data-parallel-size", str(dp), "--host",
                HOST, "--port", str(port), "--log-level", "warning"]
    else:
        argv = [PYTHON, BASELINE_SERVER, "--host", HOST, "--port", str(port),
                "--handshake-address", handshake, "--data-parallel-size", str(dp), "--dev-mode",
                "--log-level", "warning"]
    Process(server, argv, os.path.join(workdir, f"{server}.log"))
    for rank in range(dp):
        Process(f"{server}-engine{rank}",
                [os.path.join(build_dir, "cmd", "vllm-ref-engine"), "--handshake", handshake,
                 "--rank", str(rank), "--dp", str(dp), "--tp", str(tp), "--backend", "tcp",
                 "--log-level", "warning"],
                os.path.join(workdir, f"{server}.engine{rank}.log"))
    deadline = time.monotonic() + 60
    while health_status(port) != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server} not healthy in 60 s (logs in {workdir})")
        time.sleep(0.05)
    return port


def post(port, path, body=None):
    status, text = http_call(port, "POST", path, body, timeout=600)
    if status != 200:
        raise RuntimeError(f"POST {path}: {status} {text}")
    return json.loads(text) if text else None


def measure(port, dp, tp, megabytes, steps, check):
    """Per-step timings in ms: sync, update, send, and check (when `check`: the baseline
    serves no /weight_checker)."""
    workers = json.loads(http_call(port, "GET", "/get_world_size")[1])["world_size"]
    trainer = tcp_trainer.TcpTrainer(workers)
    init = threading.Thread(target=post, args=(port, "/init_weight_transfer_engine",
                                               {"init_info": trainer.init_info()}))
    init.start()
    trainer.accept()
    init.join()
    side = max(1, int((megabytes * 2**20 / 4) ** 0.5))
    figures = {"sync": [], "update": [], "send": [], "check": []}
    for step in range(steps):
        tensors = [tcp_trainer.random_tensor("model.w", "float32", [side, side])]
        sent = {}

        def send():
            started = time.perf_counter()
            trainer.send(tensors)
            sent["ms"] = (time.perf_counter() - started) * 1000

        began = time.perf_counter()
        post(port, "/pause")
        post(port, "/start_weight_update")
        sender = threading.Thread(target=send)
        updating = time.perf_counter()
        sender.start()
        post(port, "/update_weights", {"update_info": tcp_trainer.update_info(tensors)})
        updated = time.perf_counter()
        sender.join()
        post(port, "/finish_weight_update", {"weight_version": f"step-{step}"})
        post(port, "/resume")
        ended = time.perf_counter()
        if check:
            baseline = tcp_trainer.checksums(tensors, dp=dp, tp=tp)
            compare = post(port, "/weight_checker", {"action": "compare", "baseline": baseline})
            if not compare["match"]:
                raise RuntimeError(f"checksums differ: {compare['mismatches']}")
        checked = time.perf_counter()
        figures["sync"].append((ended - began) * 1000)
        figures["update"].append((updated - updating) * 1000)
        figures["send"].append(sent["ms"])
        if check:
            figures["check"].append((checked - ended) * 1000)
    trainer.close()
    bytes_per_step = len(tensors[0].data) * workers
    return figures, bytes_per_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--megabytes", type=float, default=64, help="tensor MiB per step")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--servers", default="vllmd,baseline")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="vllmd-bench-bytes-") as workdir:
        try:
            for server in args.servers.split(","):
                port = start_server(server, args.build_dir, workdir, args.dp, args.tp)
                figures, total = measure(port, args.dp, args.tp, args.megabytes, args.steps,
                                         check=server == "vllmd")
                rows.append((server, {k: statistics.median(v) if v else None
                                      for k, v in figures.items()}, total))
                stop_all()
        finally:
            stop_all()
    print(f"real bytes: {args.megabytes:g} MiB per step to {args.dp}x{args.tp} workers, "
          f"median of {args.steps} steps")
    print(f"{'server':10} {'sync ms':>9} {'update ms':>10} {'send ms':>9} {'MB/s':>8} "
          f"{'update/send':>12} {'check ms':>9}")
    for server, median, total in rows:
        rate = total / 1e6 / (median["update"] / 1000)
        check = f"{median['check']:9.1f}" if median["check"] is not None else f"{'-':>9}"
        print(f"{server:10} {median['sync']:9.1f} {median['update']:10.1f} "
              f"{median['send']:9.1f} {rate:8.0f} {median['update'] / median['send']:12.2f} "
              f"{check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
