"""Streamed generation (run.py --only generate): vllmd and the asyncio stand-in
(baseline/generate_server.py), each in front of its own vllm-ref-engine, at 1,024 and 4,096
concurrent SSE streams of 256 tokens, driven by sse_load; and the floor, sse_floor: one SSE
event's write to a loopback socket.

Per server and stream count, from one sse_load run:
  - CPU of the frontend process (all its threads; the engine is another process): utime and
    stime from /proc/PID/stat, before the load generator starts and after it ends;
  - VmRSS and the thread count (/proc/PID/status), sampled every 20 ms meanwhile;
  - what sse_load reports: tokens, events, time to first token, the step period clients saw.
The time to first token the frontend adds = client TTFT - one step period (the longest an
engine running steps back to back at that period holds a new request before its first output
goes out), floored at 0: see docs/performance.md for what that bound means."""

import json
import os
import threading
import time

from runner.common import HERE, log
from runner.procs import Process, read_proc_status
from runner.rig import start_rig

GENERATE_SERVER = os.path.join(HERE, "baseline", "generate_server.py")
TOKENS = 256
# Engine step interval (ms) per stream count: the delivered rate stays within what the two
# cores can serve (engine, frontend and load generator share them).
STEP_MS = {1024: 20, 4096: 50}
QUICK_STEP_MS = {128: 20, 512: 50}
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def body(tokens):
    return json.dumps({"token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "stream": True,
                       "sampling_params": {"max_tokens": tokens, "ignore_eos": True,
                                           "temperature": 1.0}}, separators=(",", ":"))


def cpu_seconds(pid):
    """(user, system) CPU seconds of every thread of the process so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS  # utime, stime (fields 14, 15)


def rss_threads(pid):
    values = read_proc_status(pid)
    return values.get("VmRSS", 0), values.get("Threads", 0)


class Sampler(threading.Thread):
    """VmRSS and Threads every `interval` seconds until stopped."""

    def __init__(self, pid, interval=0.02):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            try:
                self.samples.append((time.monotonic(), *rss_threads(self.pid)))
            except OSError:
                return
            self.halt.wait(self.interval)


def settle(pid, seconds=0.5):
    time.sleep(seconds)
    return rss_threads(pid)


def scenario_generate(ctx, server, streams, step_ms, ramp_s):
    """One sse_load run against a fresh rig; the figures as a dict."""
    record_path = os.path.join(ctx.workdir, f"engine-{server}-{streams}.record.jsonl")
    times_path = os.path.join(ctx.workdir, f"sse-{server}-{streams}.times")
    engine_extra = ["--max-num-seqs", str(max(streams, 256)), "--step-ms", str(step_ms),
                    "--tokens-per-step", "1", "--vocab-size", "32000", "--record", record_path]
    rig = start_rig(ctx, server, backend="none", engine_extra=engine_extra,
                    baseline_script=GENERATE_SERVER,
                    env_extra={"VLLMD_MAX_CONNECTIONS": str(streams * 2 + 64)})
    try:
        pid = rig.pid
        idle_rss, idle_threads = settle(pid)
        out_path = os.path.join(ctx.workdir, f"sse-{server}-{streams}.json")
        argv = [ctx.bin("sse_load"), "--port", str(rig.port), "--streams", str(streams),
                "--ramp", str(ramp_s), "--timeout", "90", "--body", body(TOKENS),
                "--times", times_path]
        sampler = Sampler(pid)
        user0, system0 = cpu_seconds(pid)
        sampler.start()
        with open(out_path, "wb") as out:
            load = Process("sse_load", argv, os.path.join(ctx.workdir, "sse_load.log"), stdout=out)
        load.popen.wait(timeout=150)
        code = load.popen.returncode
        load.stop()
        user1, system1 = cpu_seconds(pid)
        sampler.halt.set()
        sampler.join()
        after_rss, after_threads = settle(pid)
        with open(out_path, encoding="utf-8") as handle:
            lines = handle.read().strip().splitlines()
        if code != 0 or not lines:
            raise RuntimeError(f"sse_load exited with {code}: {load.log_tail()}")
        figures = json.loads(lines[-1])
        tokens = figures["tokens"] or 1
        peak_rss = max((s[1] for s in sampler.samples), default=idle_rss)
        threads = [s[2] for s in sampler.samples]
        period_us = figures["period_us"]["p50"]
        figures.update({
            "server": server, "step_ms": step_ms, "idle_rss": idle_rss, "peak_rss": peak_rss,
            "after_rss": after_rss,
            "rss_per_stream": (peak_rss - idle_rss) / streams,
            "threads": {"idle": idle_threads, "min": min(threads, default=0),
                        "max": max(threads, default=0), "after": after_threads},
            "cpu_user_s": user1 - user0, "cpu_system_s": system1 - system0,
            "user_us_per_token": (user1 - user0) * 1e6 / tokens,
            "system_us_per_token": (system1 - system0) * 1e6 / tokens,
            "events_per_token": figures["events"] / tokens,
            "added_ttft_us": {q: max(0.0, figures["ttft_us"][q] - period_us)
                              for q in ("p50", "p90", "p99")},
            "measured_added_ttft_us": measured_added_ttft(record_path, times_path),
            "written_added_ttft_us": measured_added_ttft(record_path, times_path, written=True),
        })
        return figures
    finally:
        rig.stop()


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def measured_added_ttft(record_path, times_path, written=False):
    """What the frontend adds to each request's time to first token, timed on both sides with
    the one CLOCK_MONOTONIC of this machine: (the engine got its ADD - the client sent it) +
    (the client read its first event - the engine sent the step holding it). The engine's
    wait for its next step and the step's own work are left out. Requests are matched by the
    client's X-Request-Id s<N>, which both frontends put in the engine's request id.

    `written`: the first event timed when its bytes reached the client's socket (the kernel's
    receive timestamp) rather than when the client read them, which leaves out the load
    generator's own wait for a CPU while the frontend holds them both."""
    added_at, first_at = {}, {}
    with open(record_path, encoding="utf-8") as handle:
        for line in handle:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("method") == "ADD":
                engine_id = entry["args"][0]
                added_at[engine_id.split("-")[2]] = entry["at"]  # generate-tokens-s<N>-<hex>
            elif entry.get("method") == "FIRST":
                for engine_id in entry["args"]:
                    first_at[engine_id.split("-")[2]] = entry["at"]
    added = []
    with open(times_path, encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            stream, sent = fields[0], fields[1]
            first = fields[3] if written else fields[2]
            if stream in added_at and stream in first_at:
                added.append(((added_at[stream] - float(sent)) +
                              (float(first) - first_at[stream])) * 1e6)
    return {"p50": percentile(added, 0.5), "p90": percentile(added, 0.9),
            "p99": percentile(added, 0.99), "max": percentile(added, 1.0),
            "requests": len(added)}


def scenario_sse_floor(ctx, event_bytes, connections=1, step_ms=0):
    """One event's write: on one connection whose reader keeps up, or over `connections` with
    one event each per step of `step_ms` and a reader asleep in epoll between steps, as the
    frontends write them."""
    if connections == 1:
        writes, rounds = ("100000" if ctx.args.quick else "300000"), "5"
    else:
        writes, rounds = str(connections * (20 if ctx.args.quick else 60)), "3"
    return ctx.run_json([ctx.bin("sse_floor"), "--bytes", str(event_bytes), "--writes", writes,
                         "--rounds", rounds, "--connections", str(connections),
                         "--step-ms", str(step_ms)], timeout=180)


def run_generate(ctx, servers):
    """Every stream count for every server (servers taking turns), then the floor."""
    counts = QUICK_STEP_MS if ctx.args.quick else STEP_MS
    results = {server: {} for server in servers}
    for streams, step_ms in counts.items():
        ramp_s = 1.0 if streams <= 1024 else 2.0
        for server in servers:
            log(f"{server}: generate, {streams} streams of {TOKENS} tokens, engine step "
                f"{step_ms} ms, ramp {ramp_s:g} s")
            try:
                results[server][f"generate/{streams}"] = scenario_generate(
                    ctx, server, streams, step_ms, ramp_s)
            except Exception as error:  # noqa: BLE001 - the other cells still run
                ctx.fail(f"{server} generate {streams}", error)
                results[server][f"generate/{streams}"] = {"error": str(error)}
    # The event size: a one-token event as vllmd writes it, with its chunk framing.
    sample = ('data: {"request_id":"generate-tokens-0123456789abcdef0123456789abcdef",'
              '"choices":[{"index":0,"logprobs":null,"finish_reason":null,"stop_reason":null,'
              '"token_ids":[12345]}],"usage":null}\n\n')
    event_bytes = len(sample) + len(f"{len(sample):x}\r\n\r\n")
    results["floor"] = {}
    floors = [("sse_write", 1, 0)] + [(f"sse_write/{streams}", streams, step_ms)
                                      for streams, step_ms in counts.items()]
    for key, connections, step_ms in floors:
        log(f"floor: one {event_bytes}-byte write to a loopback socket, {connections} "
            f"connection(s), step {step_ms} ms")
        try:
            results["floor"][key] = scenario_sse_floor(ctx, event_bytes, connections, step_ms)
        except Exception as error:  # noqa: BLE001
            ctx.fail(f"sse floor {key}", error)
            results["floor"][key] = {"error": str(error)}
    return results


# ---------------------------------------------------------------------------------------------
# Report


def report_generate(report, results, ctx):
    from runner.report import fmt_ratio  # noqa: PLC0415 - avoids an import cycle

    counts = QUICK_STEP_MS if ctx.args.quick else STEP_MS

    def floor_of(key):
        floor = results.get("floor", {}).get(key)
        return floor if isinstance(floor, dict) and "total_us" in floor else None

    # The floor a frontend is held to: the write pattern it had (its streams, the engine's step).
    def stream_floor_us(streams):
        floor = floor_of(f"sse_write/{streams}")
        return floor["total_us"] if floor else None

    def cell(server, key):
        result = results.get(server, {}).get(key)
        return result if isinstance(result, dict) and "tokens" in result else None

    def num(value, digits=1):
        return "-" if value is None else f"{value:,.{digits}f}"

    for streams, step_ms in counts.items():
        key = f"generate/{streams}"
        v, b = cell("vllmd", key), cell("baseline", key)
        report.section(f"POST /inference/v1/generate, {streams} SSE streams x {TOKENS} tokens "
                       f"(engine step {step_ms} ms); floor = one event write over {streams} "
                       f"connections x events/token")

        def row(label, pick, digits=1, better_high=None, floor_value=None):
            vv = pick(v) if v else None
            bv = pick(b) if b else None
            r = None
            if better_high is not None and vv and bv and vv > 0 and bv > 0:
                r = vv / bv if better_high else bv / vv
            report.row(f"  {label}", num(vv, digits), num(bv, digits),
                       num(floor_value, digits) if floor_value is not None else "-",
                       fmt_ratio(r))

        row("streams done / started", lambda x: x["done"], 0)
        row("tokens/s delivered", lambda x: x["tokens_per_s"], 0, True)
        for server, x in (("vllmd", v), ("baseline", b)):
            if x and (x["done"] != streams or x["error_events"] or x["bad_status"]):
                report.notes.append(
                    f"{server}, {streams} streams: {x['done']} done, {x['unfinished']} "
                    f"unfinished, {x['connect_errors']} connect / {x['io_errors']} I/O errors, "
                    f"{x['bad_status']} non-200, {x['error_events']} error events")
        row("CPU us/token, user", lambda x: x["user_us_per_token"], 2, False)
        row("CPU us/token, kernel", lambda x: x["system_us_per_token"], 2, False)
        floor_us = stream_floor_us(streams)
        floor_v = floor_us * v["events_per_token"] if (floor_us and v) else None
        row("CPU us/token, total", lambda x: x["user_us_per_token"] + x["system_us_per_token"],
            2, False, floor_v)
        row("SSE events/token", lambda x: x["events_per_token"], 3)
        row("client TTFT p50 ms", lambda x: x["ttft_us"]["p50"] / 1e3, 2, False)
        row("client TTFT p99 ms", lambda x: x["ttft_us"]["p99"] / 1e3, 2, False)
        row("step period seen, ms (p50)", lambda x: x["period_us"]["p50"] / 1e3, 2)
        row("added TTFT p50 ms", lambda x: x["added_ttft_us"]["p50"] / 1e3, 2)
        row("added TTFT p99 ms", lambda x: x["added_ttft_us"]["p99"] / 1e3, 2)
        row("added TTFT, engine-timed p50 ms",
            lambda x: (x["measured_added_ttft_us"]["p50"] or 0) / 1e3, 2)
        row("added TTFT, engine-timed p99 ms",
            lambda x: (x["measured_added_ttft_us"]["p99"] or 0) / 1e3, 2)
        row("  ... to socket arrival, p50 ms",
            lambda x: (x["written_added_ttft_us"]["p50"] or 0) / 1e3, 2)
        row("  ... to socket arrival, p99 ms",
            lambda x: (x["written_added_ttft_us"]["p99"] or 0) / 1e3, 2)
        row("RSS growth per stream, KiB", lambda x: x["rss_per_stream"] / 1024, 1, False)
        row("idle RSS, MB", lambda x: x["idle_rss"] / 1e6, 1, False)
        for server, x in (("vllmd", v), ("baseline", b)):
            if x:
                t = x["threads"]
                report.notes.append(
                    f"{server}, {streams} streams: threads idle {t['idle']}, during "
                    f"{t['min']}-{t['max']}, after {t['after']}; CPU {x['cpu_user_s']:.2f} s user "
                    f"+ {x['cpu_system_s']:.2f} s kernel for {x['tokens']:,} tokens in "
                    f"{x['events']:,} events over {x['window_s']:.2f} s; max events per stream "
                    f"{x['max_events_per_stream']} (tokens per stream {TOKENS})")

    for key in ["sse_write"] + [f"sse_write/{streams}" for streams in counts]:
        floor = floor_of(key)
        if not floor:
            continue
        pattern = ("one connection, its reader awake" if floor["connections"] == 1 else
                   f"{floor['connections']} connections, one event each per {floor['step_ms']:g} "
                   f"ms step, the reader asleep in epoll between steps")
        report.notes.append(
            f"floor: one {floor['bytes']}-byte write to a loopback socket ({pattern}) costs the "
            f"writer {floor['total_us']:.2f} us ({floor['user_us']:.2f} user + "
            f"{floor['system_us']:.2f} kernel), median of {floor['rounds']} rounds of "
            f"{floor['writes']:,} (rounds {floor['min_total_us']:.2f}-"
            f"{floor['max_total_us']:.2f} us)")

    # Targets, at the larger stream count for CPU and RSS, at the smaller one for TTFT.
    def target(text, met, detail):
        report.targets.append((text, met, detail))

    small, large = min(counts), max(counts)
    for streams in (small, large):
        key = f"generate/{streams}"
        v, b = cell("vllmd", key), cell("baseline", key)
        if not v:
            target(f"generate at {streams} streams", None, "no vllmd figure")
            continue
        if b:
            r = b["user_us_per_token"] / v["user_us_per_token"] if v["user_us_per_token"] else None
            target(f"user CPU/token >= 10x below the stand-in's ({streams} streams)",
                   None if r is None else r >= 10,
                   f"{v['user_us_per_token']:.2f} vs {b['user_us_per_token']:.2f} us = "
                   f"{fmt_ratio(r)}")
        total = v["user_us_per_token"] + v["system_us_per_token"]
        floor_us = stream_floor_us(streams)
        if floor_us:
            f = floor_us * v["events_per_token"]
            target(f"total CPU/token <= 1.5x the floor for its events ({streams} streams)",
                   total <= 1.5 * f,
                   f"{total:.2f} us = {total / f:.2f}x the floor's {f:.2f} us "
                   f"({v['events_per_token']:.3f} events/token x {floor_us:.2f} us)")
        if streams == small:
            measured = v["measured_added_ttft_us"]
            p99 = (measured["p99"] or 0) / 1e3
            written = (v["written_added_ttft_us"]["p99"] or 0) / 1e3
            target(f"added TTFT p99 < 2 ms ({streams} streams)",
                   p99 < 2 if measured["requests"] else None,
                   f"{p99:.2f} ms, engine-timed over {measured['requests']} requests "
                   f"({written:.2f} ms to the first event's arrival in the client's socket; "
                   f"the bound client p99 - step period: "
                   f"{v['added_ttft_us']['p99'] / 1e3:.2f} ms)")
        kib = v["rss_per_stream"] / 1024
        target(f"RSS < 32 KiB per open stream ({streams} streams)", kib < 32,
               f"{kib:.1f} KiB ({(v['peak_rss'] - v['idle_rss']) / 1e6:.1f} MB over "
               f"{v['idle_rss'] / 1e6:.1f} MB idle)")
        t = v["threads"]
        target(f"thread count flat ({streams} streams)",
               t["min"] == t["max"] == t["idle"] == t["after"],
               f"idle {t['idle']}, during {t['min']}-{t['max']}, after {t['after']}")
        events_ok = v["streams_with_more_events_than_tokens"] == 0
        target(f"never more than one event per stream per step ({streams} streams)", events_ok,
               f"max {v['max_events_per_stream']} events for {TOKENS} tokens (1 token/step); "
               f"{v['events_per_token']:.3f} events/token")
