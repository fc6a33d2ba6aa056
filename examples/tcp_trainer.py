#!/usr/bin/env python3
"""The trainer's side of the reference engine's "tcp" weight-transfer backend.

The backend is NCCL-shaped (vLLM's NCCL init_info and update_info) with the bytes over TCP
(common/reference/tcp_transfer.hpp), so a job without a GPU can push real tensors through
vllmd into reference engines and check, with vLLM's weight checksums, that every worker holds
exactly what was sent. Python's standard library only.

As a library (tests, benchmarks):

    trainer = TcpTrainer(workers)          # listens; workers = GET /get_world_size
    trainer.initialize(lambda info: POST /init_weight_transfer_engine {"init_info": info})
    tensors = [Tensor("w", "float32", [1024, 1024], data), ...]
    sender = trainer.send_async(tensors)   # while POST /update_weights runs
    POST /update_weights {"update_info": update_info(tensors)}
    sender.join()
    expected = checksums(tensors, dp=2, tp=2)   # vLLM's keys, SHA-256 hex

As a demo: python3 examples/tcp_trainer.py --server http://127.0.0.1:8000 --steps 3
"""

import argparse
import hashlib
import json
import os
import socket
import struct
import sys
import threading
import urllib.request
from collections import namedtuple

MAGIC = b"VLLMDREF"
DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8,
               "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}

Tensor = namedtuple("Tensor", "name dtype shape data")


def random_tensor(name, dtype, shape):
    """A tensor of random bytes (the backend moves bytes; their meaning is the trainer's)."""
    count = DTYPE_SIZES[dtype]
    for size in shape:
        count *= size
    return Tensor(name, dtype, list(shape), os.urandom(count))


def update_info(tensors):
    return {"names": [t.name for t in tensors], "dtype_names": [t.dtype for t in tensors],
            "shapes": [t.shape for t in tensors]}


def checksums(tensors, dp=1, tp=1, pp=1, pcp=1):
    """What vLLM's compute_weight_checksums reports for these tensors on every worker: keys
    dp{}:pp{}:pcp{}:tp{}:ep{}:{name}, SHA-256 hex of the bytes (every worker holds them all)."""
    digests = {t.name: hashlib.sha256(t.data).hexdigest() for t in tensors}
    return {f"dp{d}:pp{p}:pcp{c}:tp{r}:ep0:{name}": digest
            for d in range(dp) for p in range(pp) for c in range(pcp) for r in range(tp)
            for name, digest in digests.items()}


def _recv_exactly(connection, size):
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("a worker closed its connection")
        data += chunk
    return data


class TcpTrainer:
    """Rank 0 of the transfer group: the workers connect to it at init."""

    def __init__(self, workers, host="127.0.0.1", port=0):
        self.workers = workers
        self.listener = socket.create_server((host, port))
        self.host = host
        self.port = self.listener.getsockname()[1]
        self.connections = {}  # worker rank (1..workers) -> socket

    def init_info(self):
        return {"master_address": self.host, "master_port": self.port, "rank_offset": 1,
                "world_size": self.workers + 1}

    def accept(self, timeout=60):
        """Waits for every worker's connection and introduction."""
        self.listener.settimeout(timeout)
        while len(self.connections) < self.workers:
            connection, _ = self.listener.accept()
            connection.settimeout(timeout)
            hello = _recv_exactly(connection, 16)
            rank, world_size = struct.unpack(">II", hello[8:])
            if hello[:8] != MAGIC or world_size != self.workers + 1 or rank in self.connections:
                connection.close()
                raise ConnectionError(f"unexpected introduction {hello!r}")
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connections[rank] = connection

    def initialize(self, post_init, timeout=60):
        """The init: post_init(init_info) (the caller's POST /init_weight_transfer_engine,
        which blocks until every worker connected) runs on a thread while this accepts the
        workers. Returns what post_init returned."""
        result = {}
        thread = threading.Thread(target=lambda: result.update(value=post_init(self.init_info())),
                                  daemon=True)
        thread.start()
        try:
            self.accept(timeout=timeout)
        finally:
            thread.join(timeout + 60)
        return result.get("value")

    def send(self, tensors, corrupt_rank=None):
        """Sends every tensor to every worker, one thread per worker (each worker reads its
        tensors in order, whatever the others do). corrupt_rank: flip one byte of the first
        tensor on its way to that worker, as a faulty transfer would."""
        errors = []

        def push(rank, connection):
            try:
                for index, tensor in enumerate(tensors):
                    data = tensor.data
                    if rank == corrupt_rank and index == 0 and data:
                        data = bytes([data[0] ^ 0x01]) + data[1:]
                    connection.sendall(struct.pack(">Q", len(data)))
                    connection.sendall(data)
            except OSError as error:
                errors.append(f"worker rank {rank}: {error}")

        threads = [threading.Thread(target=push, args=item) for item in self.connections.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise ConnectionError("; ".join(errors))

    def send_async(self, tensors, corrupt_rank=None):
        """send() on a thread, to run while POST /update_weights waits for the bytes."""
        thread = threading.Thread(target=self.send, args=(tensors, corrupt_rank), daemon=True)
        thread.start()
        return thread

    def close(self):
        for connection in self.connections.values():
            connection.close()
        self.listener.close()


def _post(server, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(server + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        text = response.read().decode()
        return json.loads(text) if text else None


def _get(server, path):
    with urllib.request.urlopen(server + path, timeout=60) as response:
        return json.loads(response.read().decode())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8000")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--megabytes", type=float, default=4, help="bytes per step, about")
    args = parser.parse_args()
    workers = _get(args.server, "/get_world_size")["world_size"]
    trainer = TcpTrainer(workers)
    trainer.initialize(lambda info: _post(args.server, "/init_weight_transfer_engine",
                                          {"init_info": info}))
    side = max(1, int((args.megabytes * 2**20 / 4) ** 0.5))
    for step in range(1, args.steps + 1):
        tensors = [random_tensor("model.layers.0.mlp.weight", "float32", [side, side]),
                   random_tensor("model.norm.weight", "bfloat16", [side])]
        _post(args.server, "/pause")
        _post(args.server, "/start_weight_update")
        sender = trainer.send_async(tensors)
        _post(args.server, "/update_weights", {"update_info": update_info(tensors)})
        sender.join()
        _post(args.server, "/finish_weight_update", {"weight_version": f"step-{step}"})
        _post(args.server, "/resume")
        reported = {}
        for worker in _post(args.server, "/collective_rpc",
                            {"method": "compute_weight_checksums"})["results"]:
            reported.update(worker)
        held = {key.rsplit(":", 1)[1]: digest for key, digest in reported.items()}
        sent = {t.name: hashlib.sha256(t.data).hexdigest() for t in tensors}
        same = all(held.get(name) == digest for name, digest in sent.items())
        plural = "" if workers == 1 else "s"
        print(f"step {step}: {sum(len(t.data) for t in tensors) / 2**20:.1f} MiB to {workers} "
              f"worker{plural}; checksums {'match' if same else 'DIFFER'}; serving "
              f"{_get(args.server, '/weight_info')['weight_version']}")
        if not same:
            return 1
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
