"""The scenarios. Each returns plain dicts (kept in the --json output); processes are stopped
in `finally`, and a failed step is recorded with ctx.fail and the run goes on."""

import http.client
import os
import select
import socket
import statistics
import time

from runner.common import (BASELINE_SERVER, CONNECTIONS, FINISH_BODY, HOST, IPC_INIT, NCCL_INIT,
                           PYTHON, SMALL_UPDATE, log)
from runner.procs import (Process, clean_env, free_port, health_status, http_call,
                          read_proc_status)
from runner.rig import read_load_output, start_rig


def median_round(rounds):
    """The round with the median rate, with every round's rate attached."""
    good = sorted((r for r in rounds if "rps" in r), key=lambda r: r["rps"])
    if not good:
        return rounds[-1] if rounds else {"error": "no round ran"}
    chosen = dict(good[(len(good) - 1) // 2])
    chosen["rounds_rps"] = [r["rps"] for r in good]
    chosen["rounds_sequences_per_s"] = [r["sequences_per_s"] for r in good]
    return chosen


def server_timing(header):
    """{'read': ms, 'engine': ms, 'own': ms} from a Server-Timing header (vllmd names its own
    share 'vllmd', the baseline 'app')."""
    timing = {}
    for part in header.split(","):
        name, _, value = part.strip().partition(";dur=")
        timing["own" if name in ("vllmd", "app") else name] = float(value)
    return timing


def timed_updates(port, path, iterations):
    """Median Server-Timing split of `iterations` start/update/finish sequences."""
    with open(path, "rb") as handle:
        body = handle.read()
    splits = []
    for _ in range(iterations):
        http_call(port, "POST", "/start_weight_update")
        connection = http.client.HTTPConnection(HOST, port, timeout=600)
        try:
            connection.request("POST", "/update_weights", body=body,
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status == 200 and response.getheader("Server-Timing"):
                splits.append(server_timing(response.getheader("Server-Timing")))
        finally:
            connection.close()
        http_call(port, "POST", "/finish_weight_update", FINISH_BODY)
    if not splits:
        return None
    return {key: statistics.median(split[key] for split in splits) for key in splits[0]}


def scenario_throughput(ctx, servers, groups):
    """/weight_info and start+finish pairs at 1/16/64 connections, every server up at once
    (each with its own engine) and taking turns round by round."""
    results = {server: {} for server in servers}
    rigs = {}
    try:
        for server in servers:
            try:
                rig = start_rig(ctx, server, backend="nccl")
                rigs[server] = rig
                rig.post_ok("/init_weight_transfer_engine", NCCL_INIT)
            except Exception as error:  # noqa: BLE001 - the other server still runs
                ctx.fail(f"{server} throughput rig", error)
                rigs.pop(server, None)
        sequences = {"weight_info": ["GET /weight_info"],
                     "pairs": ["POST /start_weight_update",
                               f"POST /finish_weight_update {FINISH_BODY}"]}
        for group in ("weight_info", "pairs"):
            if group not in groups:
                continue
            for connections in CONNECTIONS:
                rounds = {server: [] for server in rigs}
                for number in range(ctx.settings.load_rounds):
                    for server, rig in rigs.items():
                        log(f"{server}: {group}, {connections} connection(s), round "
                            f"{number + 1}/{ctx.settings.load_rounds}")
                        try:
                            rounds[server].append(ctx.load(
                                rig.port, sequences[group], connections,
                                label=f"{server} {group} c={connections}"))
                            if group == "pairs":
                                # Leave no session open: a failed finish may have left one.
                                http_call(rig.port, "POST", "/finish_weight_update")
                        except Exception as error:  # noqa: BLE001
                            ctx.fail(f"{server} {group} c={connections}", error)
                            rounds[server].append({"error": str(error)})
                for server in rigs:
                    results[server][f"{group}/{connections}"] = median_round(rounds[server])
    finally:
        for rig in rigs.values():
            rig.stop()
    return results


def metric_sum_count(port, operation):
    """(sum, count) of vllmd's update-duration histogram for `operation`, or None."""
    try:
        status, text = http_call(port, "GET", "/metrics", timeout=5)
    except OSError:
        return None
    if status != 200:
        return None
    name = "vllm:rl_weight_update_operation_duration_seconds"
    found = {}
    for line in text.splitlines():
        for suffix in ("_sum", "_count"):
            if line.startswith(f'{name}{suffix}{{operation="{operation}"}}'):
                found[suffix] = float(line.split()[-1])
    return (found["_sum"], found["_count"]) if len(found) == 2 else None


def scenario_update(ctx, server, kind, backend):
    path, size = ctx.payload_files[kind]
    rig = start_rig(ctx, server, backend=backend)
    try:
        idle = read_proc_status(rig.pid)
        rig.post_ok("/init_weight_transfer_engine", NCCL_INIT if backend == "nccl" else IPC_INIT)
        before = metric_sum_count(rig.port, "update") if server == "vllmd" else None
        iterations = ctx.settings.update_iterations
        log(f"{server}: POST /update_weights {kind} ({size / 1e6:.1f} MB) x{iterations}")
        result = ctx.load(rig.port, ["POST /start_weight_update",
                                     f"POST /update_weights @{path}",
                                     f"POST /finish_weight_update {FINISH_BODY}"],
                          connections=1, duration=600, warmup=0, iterations=iterations,
                          label=f"{server} update {kind}")
        after = metric_sum_count(rig.port, "update") if server == "vllmd" else None
        timing = timed_updates(rig.port, path, iterations)
        peak = read_proc_status(rig.pid)
        update = result["steps"][1]
        out = {"body_bytes": size, "load": result, "idle_rss": idle.get("VmRSS"),
               "peak_rss": peak.get("VmHWM"), "update_p50_ms": update["latency_ms"]["p50"],
               "update_mean_ms": update["latency_ms"]["mean"],
               "update_ok": update["ok"], "update_requests": update["requests"],
               "first_error": update.get("first_error", ""), "timing_ms": timing}
        if before and after and after[1] > before[1]:
            out["engine_mean_ms"] = (after[0] - before[0]) / (after[1] - before[1]) * 1e3
        return out
    finally:
        rig.stop()


def scenario_health_blocked(ctx, server):
    block = ctx.settings.block_seconds
    rig = start_rig(ctx, server, backend="nccl",
                    engine_extra=["--inject-delay", f"update_weights={block:g}"])
    try:
        rig.post_ok("/init_weight_transfer_engine", NCCL_INIT)
        rig.post_ok("/start_weight_update")
        log(f"{server}: GET /health while 8 updates block for {block:g} s each")
        # 8 connections send one update each and wait; the first is in the engine for `block`
        # seconds, the others wait behind it (lifecycle calls are serialized).
        updates = ctx.load_async(rig.port, [f"POST /update_weights {SMALL_UPDATE}"],
                                 connections=8, duration=block + 1.0, iterations=1,
                                 label=f"{server} blocked updates")
        time.sleep(0.5)
        # The window ends 0.5 s before the first update can come back.
        health = ctx.load(rig.port, ["GET /health"], connections=1, duration=block - 1.0,
                          warmup=0, label=f"{server} health while blocked")
        blocked = read_load_output(updates, timeout=block + 30)
        return {"health": health, "updates": blocked}
    finally:
        rig.stop()


def notify_socket(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    return sock


def time_startup(ctx, server, embedded):
    """Seconds from spawn to READY=1 (vllmd only) and to the first 200 on /health."""
    tag = f"startup-{ctx.next_id()}"
    notify_path = os.path.join(ctx.workdir, f"{tag}.notify")
    sock = notify_socket(notify_path) if server == "vllmd" else None
    handshake = f"tcp://{HOST}:{free_port()}"
    port_file = os.path.join(ctx.workdir, f"{tag}.port")
    port = None
    if server == "vllmd":
        argv = [ctx.bin("vllmd"), "--dev-mode", "--host", HOST, "--port", "0",
                "--port-file", port_file, "--log-level", "warning", *ctx.args.vllmd_arg]
        argv += (["--engine", "embedded"] if embedded else
                 ["--engine", "external", "--handshake-address", handshake,
                  "--data-parallel-size", "1"])
        env = clean_env({"NOTIFY_SOCKET": notify_path})
    else:
        port = free_port()
        argv = [PYTHON, BASELINE_SERVER, "--host", HOST, "--port", str(port),
                "--handshake-address", handshake, "--data-parallel-size", "1", "--dev-mode",
                "--log-level", "warning", *ctx.args.baseline_arg]
        env = clean_env()
    processes = []
    ready = healthy = None
    try:
        began = time.monotonic()
        processes.append(Process(server, argv, os.path.join(ctx.workdir, f"{tag}.log"), env))
        if not embedded:
            processes.append(Process(
                "engine0", [ctx.bin("vllm-ref-engine"), "--handshake", handshake, "--backend",
                            "nccl", "--log-level", "warning"],
                os.path.join(ctx.workdir, f"{tag}.engine.log")))
        deadline = began + 60
        while (healthy is None or (sock and ready is None)) and time.monotonic() < deadline:
            if healthy is not None and time.monotonic() > began + healthy + 2:
                break  # serving, but no READY=1 within 2 s: reported as missing
            if sock and ready is None and select.select([sock], [], [], 0.002)[0]:
                if b"READY=1" in sock.recv(4096):
                    ready = time.monotonic() - began
            elif not sock:
                time.sleep(0.002)
            if port is None:
                try:
                    with open(port_file, encoding="ascii") as handle:
                        text = handle.read()
                    if text.endswith("\n"):
                        port = int(text)
                except (FileNotFoundError, ValueError):
                    pass
            if port is not None and healthy is None and health_status(port, 0.5) == 200:
                healthy = time.monotonic() - began
            for process in processes:
                if not process.alive():
                    raise RuntimeError(f"{process.name} exited with {process.popen.returncode}"
                                       f" during start-up:\n{process.log_tail()}")
        if healthy is None:
            raise RuntimeError(f"{server} not healthy within 60 s:\n{processes[0].log_tail()}")
        return ready, healthy
    finally:
        for process in reversed(processes):
            process.stop()
        if sock:
            sock.close()


def scenario_startup(ctx, server):
    runs = ctx.settings.startup_runs
    out = {}
    modes = [("embedded", True), ("external", False)] if server == "vllmd" else [
        ("external", False)]
    for mode, embedded in modes:
        log(f"{server}: start-up ({mode}) x{runs}")
        samples = []
        for _ in range(runs):
            try:
                samples.append(time_startup(ctx, server, embedded))
            except RuntimeError as error:  # a probed port taken meanwhile: once more
                log(f"{server} start-up failed ({str(error).splitlines()[0]}); trying once more")
                samples.append(time_startup(ctx, server, embedded))
        ready = [r for r, _ in samples if r is not None]
        out[mode] = {"ready_s": statistics.median(ready) if ready else None,
                     "health_s": statistics.median(h for _, h in samples),
                     "samples": samples}
    return out


def scenario_floor(ctx, kind):
    path, _ = ctx.payload_files[kind]
    log(f"floor: simdjson over {kind}")
    return ctx.run_json([ctx.bin("json_floor"), path, "--runs", str(ctx.settings.floor_runs)],
                        timeout=300)
