"""The report: one table (scenario | vllmd | baseline | floor | ratio), the targets, notes."""

import re

from runner.common import CONNECTIONS, PAYLOADS, SERVERS

def fmt_rate(value):
    return "-" if value is None else f"{value:,.0f}"


def fmt_ms(value):
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:,.0f}"


def fmt_mb(value):
    return "-" if value is None else f"{value / 1e6:.1f} MB"


def fmt_ratio(value):
    return "-" if value is None else f"{value:.1f}x" if value < 100 else f"{value:,.0f}x"


def ratio(better_high, vllmd, baseline):
    """How many times better vllmd is (>1: vllmd better), or None."""
    if vllmd is None or baseline is None or vllmd <= 0 or baseline <= 0:
        return None
    return vllmd / baseline if better_high else baseline / vllmd


def error_gist(first_error):
    """'500 {"error":{"message":"failed to call X: ... failed: reason"...' -> '500: reason'."""
    status, _, body = first_error.partition(" ")
    match = re.search(r'"message":"((?:[^"\\]|\\.)*)', body)
    message = match.group(1) if match else body
    return f"{status} {message.rsplit('failed: ', 1)[-1][:120]}"


def update_ms(result):
    """The median update time, only when every update of the run succeeded."""
    if not isinstance(result, dict) or "update_p50_ms" not in result:
        return None
    if not result["update_requests"] or result["update_ok"] != result["update_requests"]:
        return None
    return result["update_p50_ms"]


def own_ms(result):
    """The server's own share of an update (Server-Timing: after the body arrived, before the
    engine call; JSON parsing and re-encoding, validation), median of the timed updates."""
    timing = result.get("timing_ms") if isinstance(result, dict) else None
    return timing.get("own") if timing else None


class Report:
    def __init__(self):
        self.rows = []     # (scenario, vllmd, baseline, floor, ratio)
        self.notes = []
        self.targets = []  # (text, met: True/False/None, detail)

    def row(self, scenario, vllmd="-", baseline="-", floor="-", ratio_text="-"):
        self.rows.append((scenario, vllmd, baseline, floor, ratio_text))

    def section(self, title):
        self.rows.append((title, None, None, None, None))

    def print(self, out):
        header = ("scenario", "vllmd", "baseline", "floor", "ratio")
        data = [r for r in self.rows if r[1] is not None]
        widths = [max(len(str(r[i])) for r in [header, *data]) for i in range(5)]
        total = sum(widths) + 2 * 4

        def line(cells):
            text = cells[0].ljust(widths[0])
            for i in range(1, 5):
                text += "  " + str(cells[i]).rjust(widths[i])
            return text.rstrip()

        print(line(header), file=out)
        print("-" * total, file=out)
        for r in self.rows:
            print(r[0] if r[1] is None else line(r), file=out)
        print("-" * total, file=out)


def load_cells(result, per="rps"):
    """(rate, p50, p99, flags) of an http_load result; flags mark what a reader must know.
    `per`: "rps" for requests, "sequences_per_s" for pairs."""
    if not isinstance(result, dict) or "rps" not in result:
        return None, None, None, "ERR"
    flags = []
    if result["non_2xx"]:
        flags.append(f"{result['non_2xx']} non-2xx")
    errors = sum(result["errors"].values())
    if errors:
        flags.append(f"{errors} socket errors")
    if result["stalled_connections"]:
        flags.append(f"{result['stalled_connections']}/{result['connections']} connections "
                     f"never got a response in the window")
    rounds = result.get("rounds_" + per, [])
    if len(rounds) > 1 and min(rounds) < 0.75 * max(rounds):
        unit = "req/s" if per == "rps" else "pairs/s"
        flags.append("rounds varied " + " / ".join(f"{r:,.0f}" for r in rounds) + f" {unit}")
    return (result[per], result["latency_ms"]["p50"], result["latency_ms"]["p99"],
            "; ".join(flags))


def build_report(results, ctx, servers):
    report = Report()
    get = lambda server, key: results.get(server, {}).get(key)  # noqa: E731

    def flagged(text, server, scenario, flag):
        if flag:
            report.notes.append(f"{server}, {scenario}: {flag}")
            return text + " !"
        return text

    # 1. Throughput and latency.
    for group, title, unit in [("weight_info", "GET /weight_info", "req/s"),
                               ("pairs", "start+finish pairs", "pairs/s")]:
        if group not in ctx.groups:
            continue
        rounds = ctx.settings.load_rounds
        report.section(f"{title} (closed loop, keep-alive; " +
                       (f"median of {rounds} rounds of " if rounds > 1 else "") +
                       f"{ctx.settings.load_seconds:g} s after a {ctx.settings.load_warmup:g} s "
                       f"warm-up)")
        for connections in CONNECTIONS:
            key = f"{group}/{connections}"
            cells = {}
            for server in SERVERS:
                result = get(server, key)
                if result is None:
                    cells[server] = None
                    continue
                rate, p50, p99, flag = load_cells(
                    result, "sequences_per_s" if group == "pairs" else "rps")
                if group == "pairs" and rate is not None:
                    ok = result["sequences_ok"]
                    if result["non_2xx"]:
                        first = "; ".join(f"{step['request'].split(' {')[0]}: "
                                          f"{error_gist(step['first_error'])}"
                                          for step in result["steps"] if step.get("first_error"))
                        flag = "; ".join(x for x in [
                            flag, f"{ok}/{result['sequences']} pairs both 2xx (status "
                            f"{result['status']})", first] if x)
                cells[server] = (rate, p50, p99, flag)
            scenario = f"  {connections:>2} conn: {unit}"
            texts = {}
            for server in SERVERS:
                c = cells.get(server)
                texts[server] = ("-" if c is None else
                                 flagged(fmt_rate(c[0]), server, f"{group} c={connections}", c[3]))
            rate_ratio = ratio(True, *(cells[s][0] if cells.get(s) else None for s in SERVERS))
            report.row(scenario, texts["vllmd"], texts["baseline"], "-", fmt_ratio(rate_ratio))
            if group == "pairs":
                ok_rates = {}
                for server in SERVERS:
                    result = get(server, key)
                    ok_rates[server] = (result["sequences_ok"] / result["window_s"]
                                        if isinstance(result, dict) and "window_s" in result
                                        else None)
                # No ratio: with several connections, which pairs both succeed depends on how
                # each server orders contending calls, not on its speed.
                report.row(f"  {connections:>2} conn: pairs/s with both 2xx",
                           fmt_rate(ok_rates["vllmd"]), fmt_rate(ok_rates["baseline"]), "-",
                           "-" if connections > 1 else
                           fmt_ratio(ratio(True, ok_rates["vllmd"], ok_rates["baseline"])))
            for label, index in [("p50 ms", 1), ("p99 ms", 2)]:
                values = {s: cells[s][index] if cells.get(s) else None for s in SERVERS}
                texts = {}
                for server in SERVERS:
                    result = get(server, key)
                    # Percentiles cover answered requests only: stalled connections are absent.
                    stalled = isinstance(result, dict) and result.get("stalled_connections")
                    texts[server] = fmt_ms(values[server]) + (" !" if stalled else "")
                report.row(f"  {connections:>2} conn: {label}" +
                           (" per request" if group == "pairs" else ""),
                           texts["vllmd"], texts["baseline"], "-",
                           fmt_ratio(ratio(False, values["vllmd"], values["baseline"])))

    # 2. Updates and peak RSS.
    if "update" in ctx.groups or "floor" in ctx.groups:
        report.section(f"POST /update_weights end to end (median of "
                       f"{ctx.settings.update_iterations}); floor = one simdjson pass")
        for kind, _, description in PAYLOADS:
            size = ctx.payload_files.get(kind, (None, None))[1]
            floor = results.get("floor", {}).get(kind)
            floor_ms = floor["floor_s"] * 1e3 if isinstance(floor, dict) else None
            values = {}
            for server in SERVERS:
                result = get(server, f"update/{kind}")
                value = update_ms(result)
                if isinstance(result, dict) and "update_p50_ms" in result and value is None:
                    report.notes.append(f"{server}, update {kind}: {result['update_ok']}/"
                                        f"{result['update_requests']} updates 2xx; first error: "
                                        f"{result['first_error']}")
                values[server] = value
                if server == "vllmd" and value and result.get("engine_mean_ms") is not None:
                    mean, engine = result["update_mean_ms"], result["engine_mean_ms"]
                    report.notes.append(
                        f"vllmd, update {kind}: on average {engine:.1f} ms of {mean:.1f} ms were "
                        f"the engine call (ZeroMQ send, the engine's decode and checks, reply; "
                        f"vllmd's /metrics), {mean - engine:.1f} ms vllmd's own (HTTP read, "
                        f"JSON to msgpack, routing)")
            size_text = f"{size / 1e6:.1f} MB" if size else "?"
            report.row(f"  {kind} ({size_text}, {description}): ms", fmt_ms(values["vllmd"]),
                       fmt_ms(values["baseline"]), fmt_ms(floor_ms),
                       fmt_ratio(ratio(False, values["vllmd"], values["baseline"])))
            own = {server: own_ms(get(server, f"update/{kind}")) for server in SERVERS}
            report.row("      forwarding: the server's own work, ms", fmt_ms(own["vllmd"]),
                       fmt_ms(own["baseline"]), fmt_ms(floor_ms),
                       fmt_ratio(ratio(False, own["vllmd"], own["baseline"])))
        if "update" in ctx.groups:
            report.section("Server peak RSS (VmHWM) over those updates; floor column: body size")
            idle = {}
            for server in SERVERS:
                result = get(server, f"update/{PAYLOADS[0][0]}")
                idle[server] = result.get("idle_rss") if isinstance(result, dict) else None
            report.row("  idle RSS (after start-up)", fmt_mb(idle["vllmd"]), fmt_mb(idle["baseline"]),
                       "-", fmt_ratio(ratio(False, idle["vllmd"], idle["baseline"])))
            for kind, _, _ in PAYLOADS:
                size = ctx.payload_files.get(kind, (None, None))[1]
                values = {}
                for server in SERVERS:
                    result = get(server, f"update/{kind}")
                    values[server] = result.get("peak_rss") if isinstance(result, dict) else None
                report.row(f"  {kind}: peak RSS", fmt_mb(values["vllmd"]),
                           fmt_mb(values["baseline"]), fmt_mb(size) + " body",
                           fmt_ratio(ratio(False, values["vllmd"], values["baseline"])))

    # 3. /health while updates block.
    if "health" in ctx.groups:
        report.section(f"GET /health, 1 connection, while 8 updates are blocked "
                       f"({ctx.settings.block_seconds:g} s each in the engine)")
        cells = {}
        for server in SERVERS:
            result = get(server, "health")
            if not isinstance(result, dict):
                cells[server] = None
                continue
            rate, p50, p99, flag = load_cells(result["health"])
            updates = result["updates"]
            in_flight = updates["unfinished"]
            if in_flight + updates["requests"] < 8 or updates["requests"] > 1:
                flag = "; ".join(x for x in [flag, f"only {in_flight} updates still blocked at "
                                             f"the end (status {updates['status']})"] if x)
            cells[server] = (rate, p50, p99, flag)
            report.notes.append(f"{server}, health while blocked: {in_flight} of 8 updates were "
                                f"still in flight when the window closed "
                                f"({updates['requests']} returned, status {updates['status']})")
        for label, index in [("req/s", 0), ("p50 ms", 1), ("p99 ms", 2)]:
            texts = {}
            for server in SERVERS:
                c = cells.get(server)
                value = None if c is None else c[index]
                text = fmt_rate(value) if index == 0 else fmt_ms(value)
                texts[server] = flagged(text, server, "health while blocked",
                                        c[3] if c and index == 2 else "")
            values = [cells[s][index] if cells.get(s) else None for s in SERVERS]
            report.row(f"  {label}", texts["vllmd"], texts["baseline"], "-",
                       fmt_ratio(ratio(index == 0, *values)))

    # 4. Start-up.
    if "startup" in ctx.groups:
        report.section(f"Start-up, spawn to ready (median of {ctx.settings.startup_runs})")
        v = get("vllmd", "startup") or {}
        b = get("baseline", "startup") or {}
        ms = lambda s: None if s is None else s * 1e3  # noqa: E731
        embedded = v.get("embedded", {})
        report.row("  embedded engine: READY=1 ms", fmt_ms(ms(embedded.get("ready_s"))),
                   "n/a", "-", "-")
        report.row("  embedded engine: /health 200 ms", fmt_ms(ms(embedded.get("health_s"))),
                   "n/a", "-", "-")
        vx, bx = v.get("external", {}), b.get("external", {})
        report.row("  external engine: READY=1 ms", fmt_ms(ms(vx.get("ready_s"))), "n/a", "-",
                   "-")
        report.row("  external engine: /health 200 ms", fmt_ms(ms(vx.get("health_s"))),
                   fmt_ms(ms(bx.get("health_s"))), "-",
                   fmt_ratio(ratio(False, vx.get("health_s"), bx.get("health_s"))))
        for server, modes in (("vllmd", v), ("baseline", b)):
            for mode, figures in modes.items():
                if not isinstance(figures, dict) or "samples" not in figures:
                    continue
                samples = ", ".join(
                    (f"{ready * 1e3:.0f}/" if ready is not None else "") + f"{health * 1e3:.0f}"
                    for ready, health in figures["samples"])
                what = "READY=1/health" if server == "vllmd" else "health"
                report.notes.append(f"{server}, start-up {mode}: {what} ms per run: {samples}")

    # Targets.
    def target(text, met, detail):
        report.targets.append((text, met, detail))

    has_baseline = "baseline" in servers
    wi = {s: get(s, "weight_info/16") for s in SERVERS}
    if "weight_info" in ctx.groups:
        v_rate = wi["vllmd"]["rps"] if isinstance(wi["vllmd"], dict) else None
        b_rate = wi["baseline"]["rps"] if isinstance(wi["baseline"], dict) else None
        r = ratio(True, v_rate, b_rate)
        target(">= 10x the baseline's req/s on /weight_info at 16 connections",
               None if r is None else r >= 10,
               f"{fmt_ratio(r)} ({fmt_rate(v_rate)} vs {fmt_rate(b_rate)} req/s)"
               if r is not None else "no baseline figure")
        p99 = wi["vllmd"]["latency_ms"]["p99"] if isinstance(wi["vllmd"], dict) else None
        target("p99 < 1 ms on /weight_info at 16 connections",
               None if p99 is None else p99 < 1.0,
               f"p99 {fmt_ms(p99)} ms" if p99 is not None else "no vllmd figure")
    big = PAYLOADS[-1][0]
    vu = get("vllmd", f"update/{big}")
    bu = get("baseline", f"update/{big}")
    floor = results.get("floor", {}).get(big)
    v_ms, b_ms = update_ms(vu), update_ms(bu)
    floor_ms = floor["floor_s"] * 1e3 if isinstance(floor, dict) else None
    if "update" in ctx.groups:
        # Forwarding = the server's own work on the body (Server-Timing), the part a frontend
        # controls: receiving the body and the engine call (ZeroMQ transfer, the engine's own
        # decode) are shown beside it, end to end, and are the same engine for both servers.
        v_own, b_own = own_ms(vu), own_ms(bu)
        f_ratio = v_own / floor_ms if v_own and floor_ms else None
        detail = (f"forwarding {fmt_ms(v_own)} ms = {f_ratio:.1f}x the floor's "
                  f"{fmt_ms(floor_ms)} ms" if f_ratio else "missing figure")
        if v_ms:
            detail += f"; end to end {fmt_ms(v_ms)} ms"
        target(f"{big} update forwarded < 2x the floor", None if f_ratio is None else f_ratio < 2,
               detail)
        r = ratio(False, v_own, b_own)
        detail = (f"forwarding {fmt_ratio(r)} ({fmt_ms(v_own)} vs {fmt_ms(b_own)} ms)"
                  if r else "no baseline figure")
        e2e = ratio(False, v_ms, b_ms)
        if e2e:
            detail += f"; end to end {fmt_ratio(e2e)} ({fmt_ms(v_ms)} vs {fmt_ms(b_ms)} ms)"
        target(f"{big} update forwarded >= 5x faster than the baseline",
               None if r is None else r >= 5, detail)
        for kind, _, _ in PAYLOADS:
            result = get("vllmd", f"update/{kind}")
            if not isinstance(result, dict) or not result.get("peak_rss"):
                continue
            times = result["peak_rss"] / result["body_bytes"]
            detail = (f"{fmt_mb(result['peak_rss'])} = {times:.1f}x the {fmt_mb(result['body_bytes'])}"
                      f" body (idle {fmt_mb(result['idle_rss'])})")
            verdict = times < 3
            if result.get("idle_rss") and result["idle_rss"] >= 3 * result["body_bytes"]:
                # The daemon's resting footprint alone exceeds the bound: not about the body.
                verdict = "n/a"
                growth = result["peak_rss"] - result["idle_rss"]
                detail += (f"; the idle RSS alone is over 3x this body, growth over idle "
                           f"{fmt_mb(growth)} = {growth / result['body_bytes']:.1f}x")
            target(f"vllmd peak RSS < 3x the body ({kind})", verdict, detail)
    if "health" in ctx.groups:
        h = get("vllmd", "health")
        p99 = h["health"]["latency_ms"]["p99"] if isinstance(h, dict) else None
        target("/health p99 < 5 ms while updates block", None if p99 is None else p99 < 5,
               f"p99 {fmt_ms(p99)} ms" if p99 is not None else "no vllmd figure")
    if not has_baseline:
        report.notes.append("no baseline run: ratio columns and baseline targets are empty")
    return report
