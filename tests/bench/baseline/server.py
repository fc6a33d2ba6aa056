#!/usr/bin/python3
"""BENCHMARK BASELINE -- a stand-in for vLLM's Python API server, NOT vLLM and NOT vllmd.

What trainers run today in front of vLLM's engine cores is vLLM's Python API server: FastAPI on
uvicorn, with the dev-mode RL routes of `vllm/entrypoints/serve/dev/rlhf/api_router.py` calling
an `AsyncMPClient` that talks to the engine cores over pyzmq + msgpack. Installing vLLM (torch,
CUDA) to benchmark a control plane is not practical, so this file reproduces that stack for the
weight-synchronization routes only, in the same style:

* FastAPI + uvicorn, one worker process, access log off (uvloop and httptools when they work);
* request bodies read whole and parsed into Python objects with `json.loads` (as
  `await raw_request.json()` does), then re-packed with `msgpack.packb` per engine;
* an asyncio ZeroMQ client (`zmq.asyncio`): the frontend binds the handshake ROUTER and the
  input ROUTER / output PULL sockets, each UTILITY call gets a random 64-bit call id and a
  future, and one reader task resolves futures as replies arrive (in any order), like
  vLLM's `AsyncMPClient`.

So that a benchmark compares like with like, the HTTP contract is vllmd's (see
docs/http-api.md and common/api/ in this repository): the same routes, UTILITY
methods and args, validation rules (400 before anything reaches an engine), error shape
({"error": {message, type, param, code}}), status codes (500 engine failure, 503 engine
unavailable, 504 timeout), lifecycle serialization and "commit the version only after a
successful finish". Differences from vllmd are listed in README.md next to this file.

Usage (Debian's python3, which has fastapi/uvicorn/uvloop/httptools/zmq/msgpack):

    /usr/bin/python3 tests/bench/baseline/server.py --host 127.0.0.1 --port PORT \
        --handshake-address tcp://127.0.0.1:HPORT [--data-parallel-size N] [--dev-mode] \
        [--log-level warning]

It binds the handshake address, waits for N engines (`vllm-ref-engine --handshake ...` or a
headless `vllm serve`, started before or after it), completes the handshake, then listens.
"""

import argparse
import asyncio
import importlib
import json
import logging
import os
import random
import sys
import time

import msgpack
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

import uvicorn

BASELINE_VERSION = "0.1.0-baseline"
log = logging.getLogger("vllmd-baseline")

# ---------------------------------------------------------------------------------------------
# Errors: vllmd's OpenAI-shaped error model (common/api/errors.cpp).
# ---------------------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status, type_, code, message, param=None):
        super().__init__(message)
        self.status = status
        self.type = type_
        self.code = code
        self.message = message
        self.param = param

    def response(self, headers=None):
        return JSONResponse(
            {"error": {"message": self.message, "type": self.type, "param": self.param,
                       "code": self.code}},
            status_code=self.status, headers=headers)


def invalid_request(message, param=None):
    return ApiError(400, "invalid_request_error", "invalid_request_error", message, param)


def json_parse_error(message):
    return ApiError(400, "invalid_request_error", "json_parse_error", message)


def payload_too_large(message):
    return ApiError(413, "invalid_request_error", "payload_too_large", message)


def not_found():
    return ApiError(404, "invalid_request_error", "not_found", "Not Found")


def method_not_allowed():
    return ApiError(405, "invalid_request_error", "method_not_allowed", "Method Not Allowed")


def server_error(message):
    return ApiError(500, "server_error", "server_error", message)


def engine_unavailable(message):
    return ApiError(503, "server_error", "engine_unavailable", message)


def engine_timeout(message):
    return ApiError(504, "server_error", "engine_timeout", message)


def seconds_text(seconds):
    """vllmd's duration format: "1.5 s", "300 s" (common/util/duration.hpp)."""
    text = f"{round(seconds * 1000) / 1000:f}".rstrip("0").rstrip(".")
    return text + " s"


# ---------------------------------------------------------------------------------------------
# Engine client: the frontend side of the engine-core protocol (docs/engine-protocol.md), asyncio.
# ---------------------------------------------------------------------------------------------

UTILITY = b"\x03"
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"

FAILED, TIMEOUT, UNAVAILABLE = "failed", "timeout", "unavailable"


class CallError(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message


class Engine:
    """One DP rank as the client tracks it across restarts."""

    def __init__(self, rank):
        self.rank = rank
        self.identity = rank.to_bytes(2, "little")
        self.state = "waiting"  # waiting | handshaking | ready | dead
        self.reason = ""
        self.registration = {}
        self.got_ready = False
        self.got_registration = False
        self.ready_deadline = None
        self.input_fd = -1  # connection fds (ZMQ_SRCFD) tie disconnects and DEAD to engines
        self.output_fd = -1
        self.dead_by_timeout = False
        self.timed_out_calls = set()


def _source_fd(frame):
    """The connection a frame came in on (ZMQ_SRCFD), or -1."""
    try:
        return frame.get(zmq.SRCFD)
    except (zmq.ZMQError, AttributeError):
        return -1


def _split_tcp(address):
    rest = address[len("tcp://"):]
    host, _, port = rest.rpartition(":")
    return host, port


class EngineClient:
    def __init__(self, handshake_address, data_parallel_size, ready_timeout):
        self.handshake_address = handshake_address
        self.ready_timeout = ready_timeout
        self.engines = [Engine(rank) for rank in range(data_parallel_size)]
        self.pending = {}  # call_id -> (future, rank, method, timeout_marks_dead)
        self.ctx = zmq.asyncio.Context()
        self.tasks = []
        self.all_ready = asyncio.Event()
        self._bind()

    # -- sockets ---------------------------------------------------------------------------

    def _socket(self, kind):
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    def _bind(self):
        address = self.handshake_address
        if address.startswith("tcp://"):
            host, _ = _split_tcp(address)
            input_bind = output_bind = f"tcp://{host}:0"
        elif address.startswith("ipc://"):
            input_bind, output_bind = address + "-input", address + "-output"
        else:
            raise SystemExit(f"unsupported handshake address {address!r} (tcp:// or ipc://)")
        # Output and input first: an engine that says HELLO finds INIT's addresses listening.
        self.output = self._socket(zmq.PULL)
        self.output.bind(output_bind)
        self.input = self._socket(zmq.ROUTER)
        self.input.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.input.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.input_monitor = self.input.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.input.bind(input_bind)
        self.handshake = self._socket(zmq.ROUTER)
        self.handshake.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.handshake.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.handshake.bind(address)
        self.input_endpoint = self.input.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.output_endpoint = self.output.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.init_message = msgpack.packb({
            "addresses": {
                "inputs": [self.input_endpoint],
                "outputs": [self.output_endpoint],
                "coordinator_input": None,
                "coordinator_output": None,
                "frontend_stats_publish_address": None,
            },
            "parallel_config": {},
        })
        log.info("engine link: handshake %s, input %s, output %s; waiting for %d engine(s)",
                 self.handshake.getsockopt(zmq.LAST_ENDPOINT).decode(), self.input_endpoint,
                 self.output_endpoint, len(self.engines))

    def start(self):
        for coro in (self._handshake_loop(), self._input_loop(), self._output_loop(),
                     self._monitor_loop(), self._ready_deadlines()):
            task = asyncio.ensure_future(coro)
            task.add_done_callback(self._task_done)
            self.tasks.append(task)

    @staticmethod
    def _task_done(task):
        if not task.cancelled() and task.exception() is not None:
            log.error("engine link: a background task died: %r", task.exception())

    async def close(self):
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for future, *_ in self.pending.values():
            if not future.done():
                future.set_exception(CallError(UNAVAILABLE, "engine client is shutting down"))
        self.pending.clear()
        self.ctx.destroy(linger=0)

    def _engine_for(self, identity):
        if len(identity) != 2:
            return None
        rank = int.from_bytes(identity, "little")
        return self.engines[rank] if rank < len(self.engines) else None

    # -- state -----------------------------------------------------------------------------

    def _set_state(self, engine, state, reason=""):
        engine.state = state
        engine.reason = reason
        if all(e.state == "ready" for e in self.engines):
            self.all_ready.set()

    def _mark_dead(self, engine, reason, by_timeout=False):
        if engine.state == "dead":
            return
        log.warning("engine link: engine rank %d is dead: %s", engine.rank, reason)
        engine.dead_by_timeout = by_timeout
        engine.input_fd = engine.output_fd = -1
        self._set_state(engine, "dead", reason)
        self._fail_pending(engine.rank, UNAVAILABLE,
                           f"engine rank {engine.rank} is dead: {reason}")

    def _fail_pending(self, rank, kind, message):
        for call_id in [cid for cid, entry in self.pending.items() if entry[1] == rank]:
            future = self.pending.pop(call_id)[0]
            if not future.done():
                future.set_exception(CallError(kind, message))

    def _admit_if_complete(self, engine):
        if engine.got_ready and engine.got_registration:
            reg = engine.registration
            log.info("engine link: engine rank %d ready (vLLM %s, world_size %s)", engine.rank,
                     reg.get("vllm_version"), reg.get("world_size"))
            self._set_state(engine, "ready")

    # -- background tasks ------------------------------------------------------------------

    async def _handshake_loop(self):
        while True:
            frames = await self.handshake.recv_multipart()
            engine = self._engine_for(frames[0])
            if engine is None or len(frames) < 2:
                log.warning("engine link: rejecting a handshake message from an unknown identity")
                continue
            try:
                message = msgpack.unpackb(frames[1], raw=False)
                status = message["status"]
            except Exception as error:  # noqa: BLE001 - a bad peer must not stop the loop
                log.warning("engine link: bad handshake message from engine rank %d: %s",
                            engine.rank, error)
                continue
            if status == "HELLO":
                if engine.state == "handshaking":
                    log.warning("engine link: duplicate HELLO from engine rank %d rejected",
                                engine.rank)
                    continue
                if engine.state == "ready":
                    self._mark_dead(engine, "engine restarted")
                try:
                    await self.handshake.send_multipart([engine.identity, self.init_message])
                except zmq.ZMQError as error:
                    log.warning("engine link: cannot send INIT to engine rank %d: %s",
                                engine.rank, error)
                    continue
                engine.got_ready = engine.got_registration = False
                engine.input_fd = engine.output_fd = -1
                engine.dead_by_timeout = False
                engine.timed_out_calls.clear()
                engine.ready_deadline = time.monotonic() + self.ready_timeout
                log.info("engine link: HELLO from engine rank %d; sent INIT", engine.rank)
                self._set_state(engine, "handshaking")
            elif status == "READY":
                if engine.state != "handshaking" or engine.got_ready:
                    log.warning("engine link: unexpected READY from engine rank %d", engine.rank)
                    continue
                engine.got_ready = True
                self._admit_if_complete(engine)
            else:
                log.warning("engine link: unknown handshake status %r", status)

    async def _input_loop(self):
        # Engines send one registration frame on the input socket, then nothing.
        while True:
            frames = await self.input.recv_multipart(copy=False)
            engine = self._engine_for(frames[0].bytes)
            if engine is None:
                log.warning("engine link: ignoring input from an unknown engine identity")
                continue
            if engine.state != "handshaking" or engine.got_registration:
                log.warning("engine link: unexpected input frame from engine rank %d", engine.rank)
                continue
            payload = frames[1].bytes if len(frames) > 1 else b""
            registration = {}
            if payload:
                try:
                    decoded = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                    registration = decoded if isinstance(decoded, dict) else {}
                except Exception:  # noqa: BLE001
                    registration = {}
            engine.registration = registration
            engine.got_registration = True
            engine.input_fd = _source_fd(frames[1]) if len(frames) > 1 else -1
            self._admit_if_complete(engine)

    async def _monitor_loop(self):
        while True:
            event = parse_monitor_message(await self.input_monitor.recv_multipart())
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            for engine in self.engines:
                if engine.input_fd == event["value"] and engine.state in ("ready", "handshaking"):
                    self._mark_dead(engine, "connection lost")

    async def _ready_deadlines(self):
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for engine in self.engines:
                if engine.state == "handshaking" and engine.ready_deadline <= now:
                    self._mark_dead(engine, "no READY and registration within "
                                    + seconds_text(self.ready_timeout))

    async def _output_loop(self):
        # Like AsyncMPClient.process_outputs_socket: decode, resolve the call's future.
        while True:
            frames = await self.output.recv_multipart(copy=False)
            frame = frames[0].bytes
            if frame == ENGINE_CORE_DEAD:
                self._on_dead_frame(frames[0])
                continue
            try:
                outputs = msgpack.unpackb(frame, raw=False, strict_map_key=False)
                utility = outputs[4]
                if utility is None:
                    continue  # request outputs or stats: not ours
                call_id, failure, result = utility[0], utility[1], utility[2]
                if not isinstance(call_id, int) or not (failure is None or
                                                        isinstance(failure, str)):
                    raise ValueError("utility_output is not [call_id, failure|nil, result]")
            except Exception as error:  # noqa: BLE001 - a bad reply must not stop the loop
                log.warning("engine link: dropped an undecodable reply: %s", error)
                continue
            entry = self.pending.pop(call_id, None)
            if entry is None:
                self._late_reply(call_id)
                continue
            future = entry[0]
            self.engines[entry[1]].output_fd = _source_fd(frames[0])
            if future.done():
                continue
            if failure is not None:
                future.set_exception(CallError(FAILED, failure))
            else:
                future.set_result(result[1] if isinstance(result, list) and len(result) == 2
                                  else None)

    def _on_dead_frame(self, frame):
        # As vllmd: the sender is the ready engine whose replies came over this connection,
        # or else the only ready engine we never heard from on the output socket.
        fd = _source_fd(frame)
        ready = [e for e in self.engines if e.state == "ready"]
        sender = next((e for e in ready if e.output_fd == fd and fd >= 0), None)
        unknown = [e for e in ready if e.output_fd < 0]
        if sender is None and len(unknown) == 1:
            sender = unknown[0]
        if sender is None:
            log.warning("engine link: ENGINE_CORE_DEAD from an unidentified engine; waiting "
                        "for its connection to drop")
            return
        self._mark_dead(sender, "engine sent ENGINE_CORE_DEAD")

    def _late_reply(self, call_id):
        for engine in self.engines:
            if call_id in engine.timed_out_calls:
                engine.timed_out_calls.discard(call_id)
                if engine.state == "dead" and engine.dead_by_timeout:
                    log.info("engine link: engine rank %d answered a timed-out call; it is alive "
                             "again", engine.rank)
                    engine.dead_by_timeout = False
                    self._set_state(engine, "ready")
                return

    # -- calls -----------------------------------------------------------------------------

    async def call(self, engine, method, args, timeout, timeout_marks_dead):
        """One UTILITY call on one engine; returns the value or raises CallError."""
        if engine.state != "ready":
            why = f"engine rank {engine.rank} is {engine.state}"
            if engine.reason:
                why += f" ({engine.reason})"
            raise CallError(UNAVAILABLE, why)
        call_id = random.getrandbits(64)
        while call_id in self.pending:
            call_id = random.getrandbits(64)
        try:
            payload = msgpack.packb((0, call_id, method, args))
        except OverflowError:
            # vllmd refuses such a body while parsing it; here it shows when re-packing, before
            # anything was sent to any engine.
            raise json_parse_error("Invalid JSON body: Integer out of 64-bit range") from None
        future = asyncio.get_running_loop().create_future()
        self.pending[call_id] = (future, engine.rank, method, timeout_marks_dead)
        try:
            await self.input.send_multipart([engine.identity, UTILITY, payload], copy=False)
        except zmq.ZMQError as error:
            self.pending.pop(call_id, None)
            raise CallError(UNAVAILABLE,
                            f"cannot send to engine rank {engine.rank}: {error}") from None
        # A timer rather than asyncio.wait_for: no extra task or waiter future per call.
        timer = asyncio.get_running_loop().call_later(
            timeout, self._expire, call_id, engine, method, timeout, timeout_marks_dead)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, call_id, engine, method, timeout, timeout_marks_dead):
        entry = self.pending.pop(call_id, None)
        if entry is None or entry[0].done():
            return
        if len(engine.timed_out_calls) < 64:  # remembered so a late reply revives the engine
            engine.timed_out_calls.add(call_id)
        if timeout_marks_dead:
            self._mark_dead(engine, "a lifecycle call timed out", by_timeout=True)
        entry[0].set_exception(CallError(
            TIMEOUT, f"engine rank {engine.rank} did not answer {method} within "
                     f"{seconds_text(timeout)}"))

    async def call_all(self, method, args, timeout, timeout_marks_dead):
        """The call on every engine, each with its own call id; (rank, value|CallError) list."""
        async def one(engine):
            try:
                return engine.rank, await self.call(engine, method, args, timeout,
                                                    timeout_marks_dead)
            except CallError as error:
                return engine.rank, error
        if len(self.engines) == 1:
            return [await one(self.engines[0])]
        return await asyncio.gather(*(one(engine) for engine in self.engines))


# ---------------------------------------------------------------------------------------------
# The service: vllmd's WeightSyncService semantics (common/api/service.cpp).
# ---------------------------------------------------------------------------------------------


def summarize(operation, replies):
    """vllmd's error for a fanned-out call: dead outranks timeout outranks failure."""
    worst = None
    details = []
    for rank, value in replies:
        if not isinstance(value, CallError):
            continue
        prefix = f"engine rank {rank}: " if len(replies) > 1 and value.kind == FAILED else ""
        details.append(prefix + value.message)
        if worst is None or value.kind == UNAVAILABLE or (value.kind == TIMEOUT and worst == FAILED):
            worst = value.kind
    if worst is None:
        return None
    message = f"failed to call {operation}: " + "; ".join(details)
    if worst == UNAVAILABLE:
        return engine_unavailable(message)
    if worst == TIMEOUT:
        return engine_timeout(message)
    return server_error(message)


def _reject_constant(name):
    raise ValueError(f"Invalid number: {name}")


class Service:
    def __init__(self, client, lifecycle_timeout, query_timeout, max_body_bytes,
                 world_size_fallback=1):
        self.client = client
        self.lifecycle_timeout = lifecycle_timeout
        self.query_timeout = query_timeout
        self.max_body_bytes = max_body_bytes
        self.world_size_fallback = world_size_fallback
        self.lifecycle_lock = asyncio.Lock()

    async def fan_out(self, operation, method, args, timeout, timeout_marks_dead):
        replies = await self.client.call_all(method, args, timeout, timeout_marks_dead)
        error = summarize(operation, replies)
        if error is not None:
            log.warning("%s", error.message)
            raise error
        return replies

    async def read_body(self, request):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise payload_too_large(
                f"request body exceeds the limit of {self.max_body_bytes} bytes")
        body = await request.body()
        if len(body) > self.max_body_bytes:
            raise payload_too_large(
                f"request body exceeds the limit of {self.max_body_bytes} bytes")
        return body

    @staticmethod
    def parse_object(body):
        """The body as a dict, as `await raw_request.json()` would give it; 400 otherwise."""
        try:
            document = json.loads(body, parse_constant=_reject_constant)
        except json.JSONDecodeError as error:
            if not body.strip():
                message = "Expecting value: empty body"
                pos = len(body)
            elif error.msg == "Extra data":
                message, pos = "Extra data after the JSON value", error.pos
            else:
                message, pos = error.msg, error.pos
            raise json_parse_error(f"Invalid JSON body: {message} at byte {pos}") from None
        except (ValueError, RecursionError) as error:
            raise json_parse_error(f"Invalid JSON body: {error}") from None
        if not isinstance(document, dict):
            raise invalid_request("Request body must be a JSON object")
        return document

    async def lifecycle(self, worker_method, message, document=None, kwarg=None, version=None,
                        set_version_only=False, timing=None):
        """A weight-sync call, serialized across clients; the 200 body on success."""
        if not self.lifecycle_lock.locked():
            await self.lifecycle_lock.acquire()
        else:
            try:
                await asyncio.wait_for(self.lifecycle_lock.acquire(), self.lifecycle_timeout)
            except asyncio.TimeoutError:
                raise engine_timeout(
                    "timed out waiting for another weight-sync call to finish") from None
        try:
            timeout = self.lifecycle_timeout
            if set_version_only:
                await self.fan_out("set_weight_version", "set_weight_version", [version],
                                   timeout, True)
                return {"success": True, "new_version": version}
            kwargs = {kwarg: document[kwarg]} if kwarg else {}
            called = time.perf_counter()
            await self.fan_out(worker_method, "collective_rpc",
                               [worker_method, None, [], kwargs], timeout, True)
            if timing is not None:
                timing["engine"] = time.perf_counter() - called
            if version is not None:
                # Only now that every engine finished: a failure here names set_weight_version.
                await self.fan_out("set_weight_version", "set_weight_version", [version],
                                   timeout, True)
            return {"message": message}
        finally:
            self.lifecycle_lock.release()

    async def query(self, method, args, timeout):
        return await self.fan_out(method, method, args, timeout, False)


def query_bool(request, key, fallback):
    value = request.query_params.get(key)
    if value is None:
        return fallback
    lower = value.lower()
    if lower in ("true", "1", "yes", "on"):
        return True
    if lower in ("false", "0", "no", "off"):
        return False
    raise invalid_request(f"'{key}' must be a boolean, got '{value}'", key)


# ---------------------------------------------------------------------------------------------
# The FastAPI app.
# ---------------------------------------------------------------------------------------------


def build_app(service, dev_mode):
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.router.redirect_slashes = False  # vllmd answers /health/ with 404, not a redirect
    client = service.client

    @app.exception_handler(ApiError)
    async def api_error(_request, error):
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, error):
        if error.status_code == 405:
            return method_not_allowed().response(headers=error.headers)
        if error.status_code == 404:
            return not_found().response()
        return ApiError(error.status_code, "invalid_request_error", "invalid_request_error",
                        str(error.detail)).response()

    @app.exception_handler(Exception)
    async def internal_error(_request, error):
        log.exception("request failed")
        return server_error(f"internal error: {error}").response()

    @app.get("/health")
    async def health():
        problems = []
        for engine in client.engines:
            if engine.state == "ready":
                continue
            text = f"engine rank {engine.rank} is {engine.state}"
            if engine.reason:
                text += f" ({engine.reason})"
            problems.append(text)
        if problems:
            raise engine_unavailable("; ".join(problems))
        return Response(status_code=200, media_type="application/json")

    @app.get("/version")
    async def version():
        body = {"version": BASELINE_VERSION}
        for engine in client.engines:
            vllm_version = engine.registration.get("vllm_version")
            if isinstance(vllm_version, str):
                body["vllm_version"] = vllm_version
                break
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics():
        lines = ["# HELP vllm:engine_up 1 when the engine of this DP rank is attached and alive",
                 "# TYPE vllm:engine_up gauge"]
        for engine in client.engines:
            up = 1 if engine.state == "ready" else 0
            lines.append(f'vllm:engine_up{{rank="{engine.rank}"}} {up}')
        return Response("\n".join(lines) + "\n",
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    if not dev_mode:
        return app  # vLLM attaches the dev routers only in dev mode: 404 like any unknown path

    log.warning("dev mode is on: the weight-sync routes can overwrite the model's weights")

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(request: Request):
        document = service.parse_object(await service.read_body(request))
        if not isinstance(document.get("init_info"), dict):
            raise invalid_request("'init_info' must be a JSON object", "init_info")
        return JSONResponse(await service.lifecycle(
            "init_weight_transfer_engine", "Weight transfer initialized", document, "init_info"))

    @app.post("/start_weight_update")
    async def start_weight_update():
        return JSONResponse(await service.lifecycle(
            "start_weight_update", "Weight update started"))

    @app.post("/start_draft_weight_update")
    async def start_draft_weight_update():
        return JSONResponse(await service.lifecycle(
            "start_draft_weight_update", "Draft weight update started"))

    @app.post("/update_weights")
    async def update_weights(request: Request):
        started = time.perf_counter()
        body = await service.read_body(request)
        read = time.perf_counter() - started
        document = service.parse_object(body)
        info = document.get("update_info")
        if not (isinstance(info, dict) or
                (isinstance(info, list) and all(isinstance(item, dict) for item in info))):
            raise invalid_request(
                "'update_info' must be a JSON object or a list of per-worker JSON objects",
                "update_info")
        timing = {}
        result = await service.lifecycle("update_weights", "Weights updated", document,
                                         "update_info", timing=timing)
        # The same split as vllmd's Server-Timing header (milliseconds): receiving the body,
        # the engine call (packing, sending, waiting), and the server's own work between.
        total = time.perf_counter() - started
        engine = timing.get("engine", 0.0)
        header = (f"read;dur={read * 1e3:.3f}, engine;dur={engine * 1e3:.3f}, "
                  f"app;dur={max(0.0, total - read - engine) * 1e3:.3f}")
        return JSONResponse(result, headers={"Server-Timing": header})

    @app.post("/finish_weight_update")
    async def finish_weight_update(request: Request):
        body = await service.read_body(request)
        version = None
        if body:
            version = service.parse_object(body).get("weight_version")
            if version is not None and not isinstance(version, str):
                raise invalid_request("Invalid 'finish_weight_update' request body",
                                      "weight_version")
        return JSONResponse(await service.lifecycle(
            "finish_weight_update", "Weight update finished", version=version))

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request):
        version = service.parse_object(await service.read_body(request)).get("new_version")
        if not isinstance(version, str):
            raise invalid_request("Invalid 'update_weight_version' request body", "new_version")
        return JSONResponse(await service.lifecycle(
            None, None, version=version, set_version_only=True))

    @app.get("/weight_info")
    async def weight_info():
        replies = await service.query("get_weight_version", [], service.query_timeout)
        agreed = None
        seen = []
        for rank, value in replies:
            if not isinstance(value, str):
                raise server_error(f"failed to call get_weight_version: engine rank {rank} "
                                   "returned a non-string version")
            seen.append(f"rank {rank} '{value}'")
            if agreed is not None and agreed != value:
                raise server_error("engines disagree on the weight version: " + ", ".join(seen))
            agreed = value
        return JSONResponse({"weight_version": agreed or ""})

    @app.get("/get_world_size")
    async def get_world_size(request: Request):
        include_dp = query_bool(request, "include_dp", True)
        for engine in client.engines:
            if engine.state != "ready":
                raise engine_unavailable(f"engine rank {engine.rank} is {engine.state}")
        per_engine = client.engines[0].registration.get("world_size")
        if not isinstance(per_engine, int) or isinstance(per_engine, bool):
            per_engine = service.world_size_fallback
        total = per_engine * len(client.engines) if include_dp else per_engine
        return JSONResponse({"world_size": total})

    @app.post("/pause")
    async def pause(request: Request):
        mode = request.query_params.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            raise invalid_request(f"'mode' must be one of abort, wait, keep; got '{mode}'", "mode")
        clear_cache = query_bool(request, "clear_cache", True)
        # mode=wait drains running requests: the lifecycle timeout, not the query one.
        await service.query("pause_scheduler", [mode, clear_cache], service.lifecycle_timeout)
        return JSONResponse({"status": "paused"})

    @app.post("/resume")
    async def resume():
        await service.query("resume_scheduler", [], service.lifecycle_timeout)
        return JSONResponse({"status": "resumed"})

    @app.get("/is_paused")
    async def is_paused():
        replies = await service.query("is_scheduler_paused", [], service.query_timeout)
        paused = False
        for rank, value in replies:
            if not isinstance(value, bool):
                raise server_error(f"failed to call is_scheduler_paused: engine rank {rank} "
                                   "returned a non-boolean")
            paused = paused or value
        return JSONResponse({"is_paused": paused})

    return app


# ---------------------------------------------------------------------------------------------
# Startup.
# ---------------------------------------------------------------------------------------------


def http_implementation(requested):
    """httptools when uvicorn can drive the installed version, else h11."""
    if requested != "auto":
        return requested
    try:
        importlib.import_module("httptools")
        importlib.import_module("uvicorn.protocols.http.httptools_impl")
        return "httptools"
    except ImportError:
        log.warning("httptools unavailable: falling back to h11")
        return "h11"


def configure_logging(level_name):
    """The stand-ins' log lines on stderr; "trace" is Python's DEBUG."""
    level = logging.DEBUG if level_name == "trace" else getattr(logging, level_name.upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def loop_implementation(requested):
    if requested in ("auto", "uvloop"):
        try:
            import uvloop
            return "uvloop", uvloop
        except ImportError:
            if requested == "uvloop":
                raise
    return "asyncio", None


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Benchmark baseline: a FastAPI/uvicorn stand-in for vLLM's Python API "
                    "server, serving vllmd's weight-sync routes (not vLLM, not vllmd).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--handshake-address", required=True,
                        help="where engines connect: tcp://host:port or ipc:///path")
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--dev-mode", action="store_true",
                        help="serve the weight-sync routes (also env VLLM_SERVER_DEV_MODE=1)")
    parser.add_argument("--log-level", default="info",
                        choices=["trace", "debug", "info", "warning", "error", "critical"])
    parser.add_argument("--call-timeout", type=float, default=1800.0,
                        help="seconds a weight-sync call may take in the engines (vllmd's default)")
    parser.add_argument("--query-timeout", type=float, default=10.0)
    parser.add_argument("--ready-timeout", type=float, default=600.0,
                        help="seconds from an engine's HELLO to READY + registration")
    parser.add_argument("--max-body-bytes", type=int, default=128 << 20)
    parser.add_argument("--http", choices=["auto", "httptools", "h11"], default="auto")
    parser.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto")
    args = parser.parse_args(argv)
    if not args.dev_mode:
        try:
            args.dev_mode = int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")) != 0
        except ValueError:
            args.dev_mode = False
    if args.data_parallel_size < 1 or args.data_parallel_size > 65536:
        parser.error("--data-parallel-size must be between 1 and 65536")
    return args


async def serve(args, http):
    client = EngineClient(args.handshake_address, args.data_parallel_size, args.ready_timeout)
    client.start()
    try:
        # Like vLLM's frontend: the HTTP server starts once every engine has handshaken.
        await client.all_ready.wait()
        log.info("all %d engine(s) ready; serving HTTP on %s:%d", len(client.engines),
                 args.host, args.port)
        service = Service(client, args.call_timeout, args.query_timeout, args.max_body_bytes)
        app = build_app(service, args.dev_mode)
        config = uvicorn.Config(app, host=args.host, port=args.port, http=http, loop="none",
                                lifespan="off", access_log=False, log_level=args.log_level,
                                log_config=None, workers=1)
        await uvicorn.Server(config).serve()
    finally:
        await client.close()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_level)
    http = http_implementation(args.http)
    loop_name, uvloop = loop_implementation(args.loop)
    log.info("baseline %s: uvicorn %s, http=%s, loop=%s", BASELINE_VERSION, uvicorn.__version__,
             http, loop_name)
    if uvloop is not None:
        uvloop.install()
    try:
        asyncio.run(serve(args, http))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
