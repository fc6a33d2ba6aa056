"""What every part of the runner shares: paths, request bodies, the scenario list, timings."""

import os
import sys
import time

HOST = "127.0.0.1"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/bench
REPO = os.path.dirname(os.path.dirname(HERE))
BASELINE_SERVER = os.path.join(HERE, "baseline", "server.py")
PYTHON = "/usr/bin/python3"  # Debian's: it has fastapi, uvicorn, zmq, msgpack

# A valid NCCL init_info for the reference engine (it checks the dataclass fields).
NCCL_INIT = {"init_info": {"master_address": "127.0.0.1", "master_port": 29500,
                           "rank_offset": 1, "world_size": 2}}
IPC_INIT = {"init_info": {}}
SMALL_UPDATE = '{"update_info":{"names":["w"],"dtype_names":["bfloat16"],"shapes":[[4,4]]}}'
FINISH_BODY = '{"weight_version":"bench"}'

# The three bodies (make_payload KIND): name, engine backend that accepts them, description.
PAYLOADS = [
    ("nccl-30b", "nccl", "NCCL metadata, 30B MoE"),
    ("ipc-30b", "ipc", "IPC handles x8 GPUs, 30B MoE"),
    ("ipc-235b", "ipc", "IPC handles x8 GPUs, 235B MoE"),
]
CONNECTIONS = [1, 16, 64]
SERVERS = ["vllmd", "baseline"]
GROUPS = ["weight_info", "pairs", "update", "health", "startup", "floor", "generate"]


class Settings:
    """How long each measurement runs: the full run, or --quick (a smoke run)."""

    def __init__(self, quick):
        self.quick = quick
        # Each throughput cell is `load_rounds` http_load runs per server, the servers taking
        # turns, and the round with the median rate is reported: a burst of other work on a
        # shared machine then spoils one round, not the figure.
        self.load_rounds = 1 if quick else 3
        self.load_seconds = 0.5 if quick else 2.0       # per round, after the warm-up
        self.load_warmup = 0.2 if quick else 0.5
        self.update_iterations = 2 if quick else 5      # start/update/finish sequences
        self.block_seconds = 2.5 if quick else 10.0     # engine delay of each blocked update
        self.startup_runs = 2 if quick else 5
        self.floor_runs = 5 if quick else 11


def log(message):
    print(f"[{time.monotonic() - START:6.1f} s] {message}", file=sys.stderr, flush=True)


START = time.monotonic()
