#!/usr/bin/python3
"""Many requests each waiting on an engine call, and what that costs vllmd.

N connections (default 2,000) each send `POST /pause?mode=wait`; the reference engine holds
every pause_scheduler reply for --hold seconds while it goes on serving (--inject-hold, like
vLLM's pause with mode=wait, which answers once running requests drained). While all N wait,
GET /health is driven in a closed loop on one connection (http_load) and vllmd's thread count
is read from /proc. Printed: threads before/during/after, /health p50/p99, and how many of
the N answered 200 once released.

    /usr/bin/python3 tests/bench/held_calls.py --build-dir build-release
"""

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from runner.procs import Process, clean_env, free_port, health_status, http_call  # noqa: E402

HOST = "127.0.0.1"
REQUEST = b"POST /pause?mode=wait HTTP/1.1\r\nHost: bench\r\nContent-Length: 0\r\n\r\n"


def threads_of(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise RuntimeError("no Threads line")


def metric(port, name):
    status, text = http_call(port, "GET", "/metrics", timeout=5)
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError(f"no metric {name} (status {status})")


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def open_waiting(port, count):
    """`count` connections, each with its request sent."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((HOST, port))
        sock.sendall(REQUEST)
        sockets.append(sock)
    return sockets


def collect(sockets, timeout):
    """How many connections got a 200 (their first status line), within `timeout`."""
    ok = 0
    deadline = time.monotonic() + timeout
    for sock in sockets:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            ok += data.startswith(b"HTTP/1.1 200 ")
        except OSError:
            pass
        sock.close()
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", default="build-release")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--hold", type=float, default=10.0, help="seconds each reply is held")
    parser.add_argument("--health-seconds", type=float, default=3.0)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # vllmd inherits it
    if hard < 2 * args.connections + 256:
        sys.exit(f"RLIMIT_NOFILE {hard} is too low for {args.connections} connections")

    build = os.path.abspath(args.build_dir)
    workdir = tempfile.mkdtemp(prefix="vllmd-held-")
    handshake = f"tcp://{HOST}:{free_port()}"
    port_file = os.path.join(workdir, "port")
    vllmd = Process("vllmd", [f"{build}/daemon/vllmd", "--dev-mode", "--engine", "external",
                              "--handshake-address", handshake, "--port", "0", "--port-file",
                              port_file, "--log-level", "warning"],
                    os.path.join(workdir, "vllmd.log"))
    engine = Process("engine", [f"{build}/cmd/vllm-ref-engine", "--handshake", handshake,
                                "--log-level", "warning", "--inject-hold",
                                f"pause_scheduler={args.hold:g}"],
                     os.path.join(workdir, "engine.log"))
    try:
        wait_for(lambda: os.path.exists(port_file) and open(port_file).read().endswith("\n"),
                 20, "the port file")
        port = int(open(port_file).read())
        wait_for(lambda: health_status(port) == 200, 20, "GET /health -> 200")
        idle_threads = threads_of(vllmd.pid)

        began = time.monotonic()
        sockets = open_waiting(port, args.connections)
        try:
            wait_for(lambda: metric(port, "vllmd_engine_calls_pending") >= args.connections,
                     args.hold / 2, f"{args.connections} engine calls pending")
        except RuntimeError:  # a server that cannot hold them all: measured as it is
            print(f"  only {metric(port, 'vllmd_engine_calls_pending'):.0f} engine calls "
                  f"pending after {args.hold / 2:g} s", file=sys.stderr)
        setup = time.monotonic() - began
        waiting_threads = threads_of(vllmd.pid)
        busy = metric(port, "vllmd_http_connections_busy")
        load = subprocess.run(
            [f"{build}/tests/bench/http_load", "--port", str(port), "-c", "1", "-d",
             str(args.health_seconds), "-w", "0.2", "-r", "GET /health"],
            check=True, capture_output=True, text=True, timeout=args.health_seconds + 30)
        health = json.loads(load.stdout.strip().splitlines()[-1])
        still_waiting = metric(port, "vllmd_engine_calls_pending")
        answered = collect(sockets, args.hold + 30)
        after_threads = threads_of(vllmd.pid)
        figures = {
            "connections": args.connections, "hold_s": args.hold, "setup_s": round(setup, 2),
            "threads_idle": idle_threads, "threads_waiting": waiting_threads,
            "threads_after": after_threads, "busy_connections": busy,
            "calls_pending_after_health": still_waiting,
            "health_requests": health.get("requests"), "health_rps": health.get("rps"),
            "health_p50_ms": health["latency_ms"]["p50"], "health_p99_ms": health["latency_ms"]["p99"],
            "answered_200": answered,
        }
        print(f"{args.connections} requests waiting on held engine calls ({args.hold:g} s hold, "
              f"sent and pending in {setup:.2f} s)")
        print(f"  vllmd threads: idle {idle_threads}, while waiting {waiting_threads}, "
              f"after {after_threads}")
        print(f"  connections being handled: {busy:.0f}; engine calls still pending after the "
              f"/health run: {still_waiting:.0f}")
        print(f"  GET /health (1 connection, closed loop, {args.health_seconds:g} s): "
              f"{health.get('requests')} requests, p50 {health['latency_ms']['p50']:.3f} ms, "
              f"p99 {health['latency_ms']['p99']:.3f} ms")
        print(f"  answered 200 once released: {answered} of {args.connections}")
        if still_waiting < args.connections:
            print(f"  (only {still_waiting:.0f} were waiting on the engine)")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(figures, handle, indent=1)
    finally:
        engine.stop()
        vllmd.stop()


if __name__ == "__main__":
    main()
