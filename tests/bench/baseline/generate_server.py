#!/usr/bin/python3
"""BENCHMARK BASELINE -- a stand-in for vLLM's Python frontend serving streamed generation,
NOT vLLM and NOT vllmd.

It serves `POST /inference/v1/generate` with `"stream": true` the way vLLM's Python API server
does, in front of the same reference engines as vllmd:

* FastAPI + uvicorn (uvloop, httptools when they work), one worker, access log off;
  the answer is a StreamingResponse over an async generator, as vLLM's serving code returns;
* the engine link is server.py's (zmq.asyncio, msgpack, the HELLO/INIT/READY handshake), with
  its output reader replaced by ONE output-handler task that decodes every EngineCoreOutputs
  and hands each request's delta to that request's collector, as AsyncLLM's output_handler
  does with RequestOutputCollector: a delta that arrives before the handler took the previous
  one is merged into it, so a slow client costs merged tokens, never more than one event per
  step;
* each request sends one ADD (the 9 fields every layout shares, sampling params as a map with
  only the keys set, like vllmd's ADD) and, when its client leaves, one ABORT.

Events have vllmd's shape (docs/http-api.md §9.2): `data: {"request_id", "choices": [{"index":
0, "logprobs": null, "finish_reason", "stop_reason", "token_ids"}], "usage": null}` per event,
then `data: [DONE]`. Validation is lighter than vllmd's (token_ids and sampling_params must be
present), which can only make this server cheaper.

    /usr/bin/python3 tests/bench/baseline/generate_server.py --host 127.0.0.1 --port PORT \
        --handshake-address tcp://127.0.0.1:HPORT [--log-level warning]
"""

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import uuid

import msgpack
import zmq
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
import uvicorn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server as base  # noqa: E402  the engine link and the server's start-up helpers

log = logging.getLogger("vllmd-generate-baseline")

ADD = b"\x00"
ABORT = b"\x01"
FINISH_REASONS = ["stop", "length", "abort", "error", "repetition"]


class Collector:
    """One request's outputs not yet taken by its handler (vLLM's RequestOutputCollector)."""

    __slots__ = ("tokens", "finish", "stop_reason", "ready")

    def __init__(self):
        self.tokens = []
        self.finish = None
        self.stop_reason = None
        self.ready = asyncio.Event()

    def put(self, token_ids, finish, stop_reason):
        # Merged when the handler has not taken the previous delta yet.
        self.tokens.extend(token_ids)
        if finish is not None:
            self.finish = finish
            self.stop_reason = stop_reason
        self.ready.set()

    async def take(self):
        await self.ready.wait()
        self.ready.clear()
        tokens, self.tokens = self.tokens, []
        return tokens, self.finish, self.stop_reason


class GenerateClient(base.EngineClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests = {}  # engine request id -> Collector

    async def _output_loop(self):
        # AsyncLLM's output_handler: one task, every step's outputs to their requests.
        while True:
            frames = await self.output.recv_multipart(copy=False)
            frame = frames[0].bytes
            if frame == base.ENGINE_CORE_DEAD:
                self._on_dead_frame(frames[0])
                for collector in self.requests.values():
                    collector.put([], 3, None)
                continue
            try:
                outputs = msgpack.unpackb(frame, raw=False, strict_map_key=False)
            except Exception as error:  # noqa: BLE001
                log.warning("dropped an undecodable output: %s", error)
                continue
            for output in outputs[1] or ():
                collector = self.requests.get(output[0])
                if collector is None:
                    continue  # aborted or finished
                finish = output[5] if len(output) > 5 else None
                if finish is not None:
                    del self.requests[output[0]]
                collector.put(output[1], finish, output[6] if len(output) > 6 else None)

    def add(self, engine_id, prompt, sampling):
        engine = self.engines[0]
        if engine.state != "ready":
            raise base.CallError(base.UNAVAILABLE, f"engine rank 0 is {engine.state}")
        collector = Collector()
        self.requests[engine_id] = collector
        payload = msgpack.packb([engine_id, prompt, None, sampling, None, time.time(), None,
                                 None, None], use_single_float=False)
        self.input.send_multipart([engine.identity, ADD, payload], copy=False,
                                  flags=zmq.NOBLOCK)
        return collector

    def abort(self, engine_id):
        if self.requests.pop(engine_id, None) is not None:
            self.input.send_multipart([self.engines[0].identity, ABORT,
                                       msgpack.packb([engine_id])], flags=zmq.NOBLOCK)


def sampling_map(params):
    # Only what the reference engine reads and the request set (msgspec's omit_defaults).
    keys = ("temperature", "top_p", "top_k", "seed", "max_tokens", "min_tokens", "ignore_eos",
            "stop_token_ids", "logprobs")
    return {k: params[k] for k in keys if k in params and params[k] is not None}


def build_app(client):
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health():
        return JSONResponse({}) if client.all_ready.is_set() else JSONResponse({}, 503)

    @app.post("/inference/v1/generate")
    async def generate(request: Request):
        body = await request.json()
        prompt = body.get("token_ids")
        params = body.get("sampling_params")
        if not isinstance(prompt, list) or not prompt or not isinstance(params, dict):
            return JSONResponse({"error": {"message": "token_ids and sampling_params are "
                                           "required", "type": "BadRequestError",
                                           "param": None, "code": 400}}, 400)
        given = request.headers.get("x-request-id") or body.get("request_id") or uuid.uuid4().hex
        request_id = "generate-tokens-" + given
        engine_id = f"{request_id}-{os.urandom(4).hex()}"
        collector = client.add(engine_id, prompt, sampling_map(params))
        prefix = '{"request_id":' + json.dumps(request_id) + ',"choices":[{"index":0,'

        async def events():
            finished = False
            try:
                while not finished:
                    tokens, finish, stop_reason = await collector.take()
                    finished = finish is not None
                    if not tokens and not finished:
                        continue
                    chunk = {"logprobs": None,
                             "finish_reason": FINISH_REASONS[finish] if finished else None,
                             "stop_reason": stop_reason, "token_ids": tokens}
                    yield "data: " + prefix + json.dumps(chunk, separators=(",", ":"))[1:] + \
                        '],"usage":null}\n\n'
                yield "data: [DONE]\n\n"
            finally:
                if not finished:
                    client.abort(engine_id)  # the client left

        if body.get("stream"):
            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse({"error": {"message": "this stand-in streams only",
                                       "type": "BadRequestError", "param": "stream",
                                       "code": 400}}, 400)

    return app


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Benchmark baseline: streamed generation in "
                                     "the shape of vLLM's Python frontend (not vLLM, not vllmd).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--handshake-address", required=True)
    parser.add_argument("--data-parallel-size", type=int, default=1, choices=[1],
                        help="one engine only")
    parser.add_argument("--dev-mode", action="store_true", help="accepted, no effect")
    parser.add_argument("--log-level", default="info",
                        choices=["trace", "debug", "info", "warning", "error", "critical"])
    parser.add_argument("--backlog", type=int, default=4096,
                        help="listen backlog (uvicorn's default is 2048)")
    parser.add_argument("--http", choices=["auto", "httptools", "h11"], default="auto")
    parser.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto")
    return parser.parse_args(argv)


async def serve(args, http):
    client = GenerateClient(args.handshake_address, 1, 600.0)
    client.start()
    try:
        await client.all_ready.wait()
        config = uvicorn.Config(build_app(client), host=args.host, port=args.port, http=http,
                                loop="none", lifespan="off", access_log=False,
                                log_level=args.log_level, log_config=None, workers=1,
                                backlog=args.backlog)
        await uvicorn.Server(config).serve()
    finally:
        await client.close()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    base.configure_logging(args.log_level)
    http = base.http_implementation(args.http)
    loop_name, uvloop = base.loop_implementation(args.loop)
    log.info("generate baseline: uvicorn %s, http=%s, loop=%s", uvicorn.__version__, http,
             loop_name)
    if uvloop is not None:
        uvloop.install()
    try:
        asyncio.run(serve(args, http))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
