#!/usr/bin/python3
"""The benchmark suite in one command: vllmd against the FastAPI baseline and the JSON floor.

    /usr/bin/python3 tests/bench/run.py --build-dir build [--quick]

It builds nothing: build first (`cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release &&
ninja -C build`). It starts every process itself on 127.0.0.1 with ports picked at run time,
stops each one by pid when done (children also die with it: PR_SET_PDEATHSIG), and prints one
table -- scenario | vllmd | baseline | floor | ratio -- then one line per target (met / NOT
met) and notes. Progress goes to stderr, the report to stdout. docs/performance.md explains
how to read it; the parts live in runner/ (common, procs, rig, scenarios, report).

Scenarios, each against vllmd (external engine mode, one `vllm-ref-engine` process) and
against tests/bench/baseline/server.py (FastAPI + uvicorn, the same engine):
  weight_info  GET /weight_info at 1, 16 and 64 keep-alive connections (http_load), both
               servers up at once and taking turns, median of 3 rounds;
  pairs        POST /start_weight_update + POST /finish_weight_update {"weight_version"} at
               1, 16 and 64 connections, likewise;
  update       POST /update_weights end to end (median of several start/update/finish
               sequences) and the server's peak RSS (VmHWM), for three generated bodies;
  health       GET /health while 8 POST /update_weights are blocked (the engine delays each
               update by 10 s: --inject-delay);
  startup      spawn to READY=1 (sd_notify) and to the first 200 on /health, vllmd with its
               embedded engine; spawn (server and engine together) to /health 200 in
               external mode, for both servers;
  floor        one simdjson pass over each update body (json_floor);
  generate     POST /inference/v1/generate streamed (SSE) at 1,024 and 4,096 concurrent
               streams of 256 tokens (sse_load), against vllmd and against
               baseline/generate_server.py (asyncio + pyzmq + msgpack, one output-handler
               task, as vLLM's AsyncLLM), each with its own engine; CPU per token (user,
               kernel), events per token, added time to first token, RSS per stream, threads;
               and its floor: one SSE event's write to a loopback socket (sse_floor).
Exit status: 0 when every step ran (targets met or not), 1 when a step failed, 130 on ^C.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree

from runner.generate import report_generate, run_generate  # noqa: E402
from runner.common import (BASELINE_SERVER, GROUPS, PAYLOADS, REPO,  # noqa: E402
                           SERVERS, START, log)
from runner.procs import stop_all  # noqa: E402
from runner.report import build_report  # noqa: E402
from runner.rig import Context  # noqa: E402
from runner.scenarios import (scenario_floor, scenario_health_blocked,  # noqa: E402
                              scenario_startup, scenario_throughput, scenario_update)


def machine_lines(ctx):
    lines = []
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "unknown"
    try:
        mem = next(int(line.split()[1]) for line in open("/proc/meminfo")
                   if line.startswith("MemTotal")) * 1024
    except (OSError, StopIteration):
        mem = 0
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = ["?"] * 3
    try:
        rev = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = "?"
    try:
        version = subprocess.run([ctx.bin("vllmd"), "--version"], capture_output=True,
                                 text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        version = "?"
    lines.append(f"date     {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    lines.append(f"machine  {os.cpu_count()} cores, {model}, {mem / 2**30:.1f} GiB RAM, "
                 f"{platform.system()} {platform.release()}")
    lines.append(f"load     {' '.join(load)} (1/5/15 min, at the start)")
    lines.append(f"source   {rev}; {version}; build dir {ctx.args.build_dir}")
    lines.append(f"mode     {'quick (smoke run: figures are indicative only)' if ctx.args.quick else 'full'}")
    return lines


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Benchmark vllmd against the FastAPI baseline and the simdjson floor.",
        epilog="Example: /usr/bin/python3 tests/bench/run.py --build-dir build")
    parser.add_argument("--build-dir", default=os.environ.get("VLLMD_BUILD_DIR",
                                                              os.path.join(REPO, "build")),
                        help="CMake build directory with vllmd, vllm-ref-engine and "
                             "tests/bench/* (default: $VLLMD_BUILD_DIR or ./build)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (seconds)")
    parser.add_argument("--only", default=",".join(GROUPS),
                        help=f"comma-separated scenario groups (default: all of {','.join(GROUPS)})")
    parser.add_argument("--servers", default=",".join(SERVERS),
                        help="comma-separated: vllmd,baseline (default both)")
    parser.add_argument("--json", metavar="FILE", help="also write every raw figure here")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, bodies) and print its path")
    parser.add_argument("--vllmd-arg", action="append", default=[], metavar="ARG",
                        help="extra vllmd argument, e.g. --vllmd-arg=--log-level=error "
                             "(repeatable)")
    parser.add_argument("--baseline-arg", action="append", default=[], metavar="ARG",
                        help="extra baseline server argument (repeatable)")
    args = parser.parse_args(argv)
    args.build_dir = os.path.abspath(args.build_dir)
    return args


def check_binaries(ctx, servers):
    needed = ["vllmd", "vllm-ref-engine", "http_load", "make_payload"]
    missing = [n for n in needed if not os.access(ctx.bin(n), os.X_OK)]
    if missing:
        sys.exit(f"run.py: missing in {ctx.args.build_dir}: {', '.join(missing)}\n"
                 f"build first: cmake -S {REPO} -B {ctx.args.build_dir} -G Ninja "
                 f"-DCMAKE_BUILD_TYPE=Release && ninja -C {ctx.args.build_dir}")
    notes = []
    if "generate" in ctx.groups:
        lacking = [n for n in ("sse_load", "sse_floor") if not os.access(ctx.bin(n), os.X_OK)]
        if lacking:
            sys.exit(f"run.py: missing in {ctx.args.build_dir}: {', '.join(lacking)}")
    if "floor" in ctx.groups and not os.access(ctx.bin("json_floor"), os.X_OK):
        ctx.groups.remove("floor")
        notes.append("json_floor was not built (libsimdjson-dev missing?): no floor figures")
    if "baseline" in servers and not os.path.exists(BASELINE_SERVER):
        servers.remove("baseline")
        notes.append(f"{BASELINE_SERVER} not found: vllmd only")
    return notes


def main(argv):
    args = parse_args(argv)
    servers = [s for s in args.servers.split(",") if s]
    groups = [g for g in args.only.split(",") if g]
    for name in servers:
        if name not in SERVERS:
            sys.exit(f"run.py: unknown server '{name}' (expected {','.join(SERVERS)})")
    for name in groups:
        if name not in GROUPS:
            sys.exit(f"run.py: unknown scenario group '{name}' (expected {','.join(GROUPS)})")
    ctx = Context(args, None)
    ctx.groups = groups
    setup_notes = check_binaries(ctx, servers)  # may exit: nothing to clean up yet
    workdir = ctx.workdir = tempfile.mkdtemp(prefix="vllmd-bench-")
    for note in setup_notes:
        log(note)
    header = machine_lines(ctx)

    # SIGTERM/SIGHUP end the run like ^C does: through the finally below.
    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)

    results = {server: {} for server in servers}
    results["floor"] = {}
    errors = ctx.errors

    def attempt(what, function, *call_args):
        try:
            return function(*call_args)
        except KeyboardInterrupt:
            raise
        except Exception as error:  # noqa: BLE001 - reported, and the run goes on
            ctx.fail(what, error)
            return {"error": str(error)}

    try:
        if "update" in groups or "floor" in groups:
            for kind, _, _ in PAYLOADS:
                path = os.path.join(workdir, f"{kind}.json")
                made = ctx.run_json([ctx.bin("make_payload"), kind, path], timeout=120)
                ctx.payload_files[kind] = (path, made["bytes"])
            log("bodies: " + ", ".join(f"{k} {b / 1e6:.2f} MB"
                                       for k, (_, b) in ctx.payload_files.items()))
        # Servers alternate within each group, so a change in the machine's load hits both.
        if "weight_info" in groups or "pairs" in groups:
            throughput = attempt("throughput", scenario_throughput, ctx, servers, groups)
            for server in servers:
                results[server].update(throughput.get(server, {}))
        if "update" in groups:
            for kind, backend, _ in PAYLOADS:
                for server in servers:
                    results[server][f"update/{kind}"] = attempt(
                        f"{server} update {kind}", scenario_update, ctx, server, kind, backend)
        if "floor" in groups:
            for kind, _, _ in PAYLOADS:
                results["floor"][kind] = attempt(f"floor {kind}", scenario_floor, ctx, kind)
        if "health" in groups:
            for server in servers:
                results[server]["health"] = attempt(f"{server} health", scenario_health_blocked,
                                                    ctx, server)
        if "startup" in groups:
            for server in servers:
                results[server]["startup"] = attempt(f"{server} startup", scenario_startup,
                                                     ctx, server)
        if "generate" in groups:
            generated = run_generate(ctx, servers)
            for server in servers:
                results[server].update(generated.get(server, {}))
            results["floor"].update(generated.get("floor", {}))
    except KeyboardInterrupt:
        log("interrupted: stopping every process")
        stop_all()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        return 130
    finally:
        stop_all()

    elapsed = time.monotonic() - START
    report = build_report(results, ctx, servers)
    if "generate" in groups:
        report_generate(report, results, ctx)
    out = sys.stdout
    print("vllmd benchmark (tests/bench/run.py)", file=out)
    for line in header:
        print("  " + line, file=out)
    print(f"  command  /usr/bin/python3 tests/bench/run.py {' '.join(argv)}".rstrip(), file=out)
    print(file=out)
    print("ratio = how many times better vllmd is than the baseline (rates: vllmd/baseline; "
          "times, latencies, RSS: baseline/vllmd). '!' = see the notes.", file=out)
    report.print(out)
    print("\nTargets:", file=out)
    if not report.targets:
        print("  (none in the scenarios run)", file=out)
    for text, met, detail in report.targets:
        verdict = ("n/a" if met == "n/a" else "met" if met is True else
                   "NOT met" if met is False else "not checked")
        print(f"  [{verdict:^11}] {text}: {detail}", file=out)
    notes = setup_notes + report.notes + [f"error: {e}" for e in errors]
    if notes:
        print("\nNotes:", file=out)
        for note in notes:
            print(f"  - {note}", file=out)
    print(f"\ntotal {elapsed:.0f} s", file=out)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"header": header, "settings": vars(ctx.settings), "results": results,
                       "errors": errors, "elapsed_s": elapsed,
                       "payloads": {k: b for k, (_, b) in ctx.payload_files.items()}},
                      handle, indent=1)
    if args.keep:
        print(f"work directory kept: {workdir}", file=out)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
