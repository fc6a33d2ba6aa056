#!/usr/bin/python3
"""Two or more vllmd builds head to head on one scenario, the order reversed every round.

On a shared VM the build measured second in a back-to-back pair is often the slower one
(docs/performance.md, "Before and after the event-driven core"), so this compares fairly:
round 1 runs the builds in the order given, round 2 in reverse, and so on. Every measurement
starts its own vllmd with one vllm-ref-engine taken from --build-dir, so the engine is the
same for every build.

Scenarios:
  update:KIND      start/update/finish sequences with a make_payload body (nccl-30b,
                   ipc-30b, ipc-235b); the figure is the update's p50 per round
  weight_info:N    GET /weight_info on N keep-alive connections for --seconds; req/s, p50
                   and p99 per round

Example:
  /usr/bin/python3 tests/bench/compare_builds.py --build-dir build-release \\
      --vllmd old=/tmp/old/build-release/daemon/vllmd --vllmd new=build-release/daemon/vllmd \\
      --scenario update:nccl-30b --rounds 8 --iterations 100
"""

import argparse
import itertools
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from runner.common import FINISH_BODY, IPC_INIT, NCCL_INIT, PAYLOADS  # noqa: E402
from runner.procs import stop_all  # noqa: E402
from runner.rig import Context, start_rig  # noqa: E402


class BuildContext(Context):
    """The runner's context with one vllmd binary swapped in; the rest from --build-dir."""

    ids = itertools.count(1)  # shared, so no two builds' rigs share a port or log file

    def __init__(self, args, workdir, vllmd):
        super().__init__(args, workdir)
        self.vllmd = vllmd

    def next_id(self):
        return next(BuildContext.ids)

    def bin(self, name):
        return self.vllmd if name == "vllmd" else super().bin(name)


def measure_update(ctx, kind, path, iterations):
    backend = next(backend for name, backend, _ in PAYLOADS if name == kind)
    rig = start_rig(ctx, "vllmd", backend=backend)
    try:
        rig.post_ok("/init_weight_transfer_engine", NCCL_INIT if backend == "nccl" else IPC_INIT)
        result = ctx.load(rig.port, ["POST /start_weight_update", f"POST /update_weights @{path}",
                                     f"POST /finish_weight_update {FINISH_BODY}"],
                          connections=1, duration=600, warmup=0, iterations=iterations)
        return {"update p50 ms": result["steps"][1]["latency_ms"]["p50"]}
    finally:
        rig.stop()


def measure_weight_info(ctx, connections, seconds):
    rig = start_rig(ctx, "vllmd", backend="nccl")
    try:
        result = ctx.load(rig.port, ["GET /weight_info"], connections=connections,
                          duration=seconds, warmup=0.5)
        latency = result["steps"][0]["latency_ms"]
        return {"req/s": result["rps"], "p50 ms": latency["p50"], "p99 ms": latency["p99"]}
    finally:
        rig.stop()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", required=True,
                        help="build with vllm-ref-engine, http_load and make_payload")
    parser.add_argument("--vllmd", action="append", required=True, metavar="LABEL=PATH",
                        help="a vllmd binary to compare (two or more)")
    parser.add_argument("--scenario", required=True, help="update:KIND or weight_info:N")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=100, help="sequences per update round")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a weight_info round")
    args = parser.parse_args(argv)
    args.builds = [tuple(item.split("=", 1)) for item in args.vllmd]
    if len(args.builds) < 2 or any(len(build) != 2 for build in args.builds):
        parser.error("give at least two --vllmd LABEL=PATH")
    args.kind, _, args.parameter = args.scenario.partition(":")
    if args.kind not in ("update", "weight_info") or not args.parameter:
        parser.error("--scenario is update:KIND or weight_info:N")
    args.quick, args.vllmd_arg = False, []  # what the runner's Context reads
    return args


def run(args, workdir):
    contexts = {label: BuildContext(args, workdir, path) for label, path in args.builds}
    if args.kind == "update":
        body = os.path.join(workdir, f"{args.parameter}.json")
        next(iter(contexts.values())).run_json(
            [os.path.join(args.build_dir, "tests/bench/make_payload"), args.parameter, body], 120)
        measure = lambda ctx: measure_update(ctx, args.parameter, body, args.iterations)  # noqa: E731
    else:
        measure = lambda ctx: measure_weight_info(ctx, int(args.parameter), args.seconds)  # noqa: E731
    figures = {label: [] for label in contexts}
    order = list(contexts)
    for number in range(args.rounds):
        for label in order if number % 2 == 0 else reversed(order):
            figures[label].append(measure(contexts[label]))
        print(f"round {number + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    return figures


def figure(value):
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


def report(args, figures):
    first = args.builds[0][0]
    print(f"{args.scenario}: {args.rounds} rounds, the order of the builds reversed every round")
    for metric in next(iter(figures.values()))[0]:
        higher_is_better = metric.endswith("/s")
        print(f"\n{metric}: median of the rounds, change against {first} (+ is better), "
              "each round")
        base = statistics.median(round_[metric] for round_ in figures[first])
        for label, rounds in figures.items():
            values = [round_[metric] for round_ in rounds]
            median = statistics.median(values)
            better = median / base - 1 if higher_is_better else base / median - 1
            each = " ".join(figure(value) for value in values)
            print(f"  {label:<12} {figure(median):>9}  {better * 100:+6.1f}%  {each}")


def main(argv):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vllmd-compare-") as workdir:
        try:
            report(args, run(args, workdir))
        finally:
            stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
