#!/usr/bin/env python3
"""Validate vllmd against real vLLM engines on a GPU host (see docs/real-engine.md).

One `run` is one phase of one matrix cell (backend x tensor-parallel size):

  --target vllm    The trainer syncs weights into vLLM's own API server (dev mode).
                   This phase is the oracle: after every sync, greedy generations from
                   the server must equal Hugging Face transformers run on the trainer's
                   weights, and the engine-side probe records what the workers hold.
  --target vllmd   The same trainer, with the same weights, syncs through vllmd into
                   headless engines. vllmd serves no generations, so the workers'
                   weights are compared digest by digest with the vllm phase
                   (--reference), and every weight-sync response is held to the HTTP
                   contract.

The trainer side is vLLM's own: HTTPVLLMWeightSyncClient, ModuleSource and
WeightTransferTrainerFactory from vllm.distributed.weight_transfer.

This file is also the engine-side probe. Start each engine with this directory on
PYTHONPATH, VLLMD_PROBE_DIR set and `--worker-extension-cls validate_sync.WeightProbe`:
every worker then appends, to a file in VLLMD_PROBE_DIR, a SHA-256 digest of each of
its parameters before start_weight_update and after finish_weight_update. The probe
only observes; it never changes what the engine does.

  validate_sync.py run --target vllm|vllmd --base-url URL --backend nccl|ipc --tp N ...
  validate_sync.py report RESULTS_DIR

Exit status: 0 every check passed, 1 a check failed, 2 the run could not be carried out.
Only the standard library is imported at module level: vLLM workers import this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import hashlib
import importlib
import inspect
import json
import math
import os
import socket
import sys
import threading
import time
import urllib.parse
from typing import Any

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2

PROMPTS = (
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
)

# Exact 200 bodies of the lifecycle routes (docs/http-api.md §2.1, and vLLM's
# vllm/entrypoints/serve/dev/rlhf/api_router.py).
LIFECYCLE_BODIES = {
    "/init_weight_transfer_engine": {"message": "Weight transfer initialized"},
    "/start_weight_update": {"message": "Weight update started"},
    "/update_weights": {"message": "Weights updated"},
    "/finish_weight_update": {"message": "Weight update finished"},
}

REJECTED_VERSION = "must-not-commit"

# Settings that must be equal for the two phases of a cell to be comparable.
COMPARABLE = ("model", "backend", "tp", "dp", "dtype", "rounds", "noise", "seed", "packed")


class SetupError(Exception):
    """The run cannot be carried out (environment, server or vLLM version)."""


# ---------------------------------------------------------------------------------------
# Engine-side probe. vLLM imports this module in every worker when the engine is started
# with --worker-extension-cls validate_sync.WeightProbe (vllm/v1/worker/worker_base.py,
# WorkerWrapperBase.init_worker). On import, when VLLMD_PROBE_DIR is set, the worker
# class's start_weight_update and finish_weight_update are wrapped to write digests.
# ---------------------------------------------------------------------------------------

PROBE_DIR_ENV = "VLLMD_PROBE_DIR"
PROBE_WORKER_CLASS_ENV = "VLLMD_PROBE_WORKER_CLASS"
DEFAULT_WORKER_CLASS = "vllm.v1.worker.gpu_worker.Worker"


class WeightProbe:
    """The class named by --worker-extension-cls. vLLM appends it to the worker's bases;
    its one method name must not exist on the worker (vLLM asserts that)."""

    def vllmd_probe_installed(self) -> bool:
        return _probe_installed


_probe_installed = False


def _digest_tensor(tensor: Any) -> str:
    """SHA-256 over dtype, shape and the raw bytes of one tensor."""
    import torch

    digest = hashlib.sha256(f"{tensor.dtype}|{tuple(tensor.shape)}|".encode())
    if tensor.is_meta:
        return "meta:" + digest.hexdigest()
    data = tensor.detach().reshape(-1).view(torch.uint8).cpu()
    digest.update(memoryview(data.numpy()))
    return digest.hexdigest()


def _worker_model_digests(worker: Any) -> dict[str, str]:
    try:
        import torch

        model = worker.get_model() if hasattr(worker, "get_model") else worker.model_runner.model
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {name: _digest_tensor(param) for name, param in model.named_parameters()}
    except Exception as exc:  # the probe must never break the engine
        return {"__error__": f"{type(exc).__name__}: {exc}"}


def _worker_identity(worker: Any) -> tuple[int, int]:
    parallel = getattr(worker, "parallel_config", None)
    dp_rank = getattr(parallel, "data_parallel_rank", None)
    if dp_rank is None:
        dp_rank = getattr(parallel, "data_parallel_index", 0)
    return int(dp_rank or 0), int(getattr(worker, "rank", 0) or 0)


def _probe_append(worker: Any, record: dict[str, Any]) -> None:
    try:
        dp_rank, rank = _worker_identity(worker)
        record.update(worker=f"dp{dp_rank}.rank{rank}", pid=os.getpid(), time=time.time())
        path = os.path.join(os.environ[PROBE_DIR_ENV], f"probe-dp{dp_rank}-rank{rank}.jsonl")
        line = json.dumps(record, sort_keys=True) + "\n"
        with open(path, "a", encoding="utf-8") as out:
            out.write(line)
    except Exception:  # the probe must never break the engine
        pass


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _probed_start(original: Any) -> Any:
    @functools.wraps(original)
    def start_weight_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = _worker_model_digests(self)  # the weights this update starts from
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            _probe_append(self, {"event": "start", "ok": False, "error": _describe(exc), "digests": before})
            raise
        _probe_append(self, {"event": "start", "ok": True, "error": None, "digests": before})
        return result

    start_weight_update._vllmd_probe = True  # type: ignore[attr-defined]
    return start_weight_update


def _probed_finish(original: Any) -> Any:
    @functools.wraps(original)
    def finish_weight_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            _probe_append(self, {"event": "finish", "ok": False, "error": _describe(exc), "digests": None})
            raise
        _probe_append(self, {"event": "finish", "ok": True, "error": None, "digests": _worker_model_digests(self)})
        return result

    finish_weight_update._vllmd_probe = True  # type: ignore[attr-defined]
    return finish_weight_update


def _install_probe() -> None:
    global _probe_installed
    directory = os.environ.get(PROBE_DIR_ENV)
    if not directory:
        return
    qualname = os.environ.get(PROBE_WORKER_CLASS_ENV, DEFAULT_WORKER_CLASS)
    status: dict[str, Any] = {"pid": os.getpid(), "worker_class": qualname, "installed": False, "error": None}
    try:
        module_name, _, class_name = qualname.rpartition(".")
        worker_class = getattr(importlib.import_module(module_name), class_name)
        if not getattr(worker_class.finish_weight_update, "_vllmd_probe", False):
            worker_class.start_weight_update = _probed_start(worker_class.start_weight_update)
            worker_class.finish_weight_update = _probed_finish(worker_class.finish_weight_update)
        _probe_installed = status["installed"] = True
    except Exception as exc:
        status["error"] = _describe(exc)
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"install-{os.getpid()}.json"), "w", encoding="utf-8") as out:
            json.dump(status, out)
    except OSError:
        pass


if __name__ != "__main__":
    _install_probe()


class ProbeReader:
    """Reads what the workers' probes wrote, round by round."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory

    def installs(self) -> list[dict[str, Any]]:
        if not self.directory:
            return []
        found = []
        for path in sorted(glob.glob(os.path.join(self.directory, "install-*.json"))):
            try:
                with open(path, encoding="utf-8") as handle:
                    found.append(json.load(handle))
            except (OSError, ValueError):
                found.append({"installed": False, "error": f"unreadable {path}"})
        return found

    def _files(self) -> list[str]:
        if not self.directory:
            return []
        return sorted(glob.glob(os.path.join(self.directory, "probe-*.jsonl")))

    @staticmethod
    def _lines(path: str) -> list[str]:
        with open(path, encoding="utf-8") as handle:
            return handle.read().splitlines()

    def mark(self) -> dict[str, int]:
        return {path: len(self._lines(path)) for path in self._files()}

    def since(self, mark: dict[str, int]) -> list[dict[str, Any]]:
        records = []
        for path in self._files():
            for line in self._lines(path)[mark.get(path, 0):]:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    records.append({"worker": os.path.basename(path), "event": "corrupt", "ok": False,
                                    "error": "unparsable line", "digests": None})
        return records


def analyse_update(records: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """One weight update as the probes saw it: every worker must report exactly one
    successful start (with the digests before) and one successful finish (after)."""
    workers: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        workers.setdefault(str(record.get("worker")), []).append(record)
    problems, after, changed = [], {}, {}
    if len(workers) != world_size:
        problems.append(f"{len(workers)} of {world_size} workers reported")
    for worker, mine in sorted(workers.items()):
        starts = [r for r in mine if r.get("event") == "start"]
        finishes = [r for r in mine if r.get("event") == "finish"]
        if len(starts) != 1 or not starts[0].get("ok"):
            problems.append(f"{worker}: {len(starts)} start records, ok={[r.get('ok') for r in starts]}")
        if len(finishes) != 1 or not finishes[0].get("ok"):
            errors = [r.get("error") for r in finishes]
            problems.append(f"{worker}: {len(finishes)} finish records, errors={errors}")
            continue
        digests = finishes[0].get("digests") or {}
        if "__error__" in digests:
            problems.append(f"{worker}: digest failed: {digests['__error__']}")
            continue
        after[worker] = digests
        before = (starts[0].get("digests") or {}) if starts else {}
        changed[worker] = sum(1 for name, value in digests.items() if before.get(name) != value)
    return {"workers": sorted(workers), "problems": problems, "after": after, "changed": changed}


# ---------------------------------------------------------------------------------------
# Checks and HTTP records.
# ---------------------------------------------------------------------------------------


class Checks:
    """PASS / FAIL / WARN / SKIP / INFO lines. FAIL alone makes the run fail."""

    def __init__(self, echo: bool) -> None:
        self.items: list[dict[str, str]] = []
        self.echo = echo

    def record(self, check_id: str, status: str, detail: str) -> None:
        self.items.append({"id": check_id, "status": status, "detail": detail})
        if self.echo:
            print(f"{status:<5} {check_id:<30} {detail}", flush=True)

    def check(self, check_id: str, ok: bool, detail: str, strict: bool = True) -> bool:
        self.record(check_id, "PASS" if ok else ("FAIL" if strict else "WARN"), detail)
        return ok

    def skip(self, check_id: str, why: str, required: bool = False) -> None:
        self.record(check_id, "FAIL" if required else "SKIP", why)

    def info(self, check_id: str, detail: str) -> None:
        self.record(check_id, "INFO", detail)

    def failed(self) -> list[dict[str, str]]:
        return [item for item in self.items if item["status"] == "FAIL"]


_NO_BODY = object()


def _summarize_request(body: Any) -> Any:
    """What a request carried, small enough to keep (never the IPC handles)."""
    if body is _NO_BODY or body is None:
        return None
    if not isinstance(body, dict):
        return type(body).__name__
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key == "update_info":
            infos = value if isinstance(value, list) else [value]
            shown = [{"keys": sorted(info), "params": len(info.get("names") or [])}
                     if isinstance(info, dict) else type(info).__name__ for info in infos]
            out[key] = shown if isinstance(value, list) else shown[0]
        else:
            out[key] = value
    return out


def _response_body(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text[:2000]


class CallLog:
    """Every HTTP call of the run: the script's own and those of vLLM's client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[dict[str, Any]] = []

    def add(self, **entry: Any) -> None:
        with self._lock:
            entry["seq"] = len(self.entries)
            self.entries.append(entry)

    def mark(self) -> int:
        with self._lock:
            return len(self.entries)

    def since(self, mark: int, source: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.entries[mark:] if source is None or e["source"] == source]


class Http:
    """The script's own calls (pause, resume, versions, generations)."""

    def __init__(self, base_url: str, timeout: float, log: CallLog) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.log = log

    def call(self, method: str, path: str, body: Any = _NO_BODY, params: dict[str, Any] | None = None,
             timeout: float | None = None, keep: bool = True) -> tuple[int, Any]:
        import requests

        extra = {} if body is _NO_BODY else {"json": body}
        started = time.monotonic()
        response = requests.request(method, self.base_url + path, params=params,
                                    timeout=timeout or self.timeout, **extra)
        parsed = _response_body(response)
        if keep:
            self.log.add(source="script", method=method, path=path, request=_summarize_request(body),
                         status=response.status_code, body=parsed,
                         seconds=round(time.monotonic() - started, 4))
        return response.status_code, parsed


class ClientRecorder:
    """Records the calls vLLM's HTTPVLLMWeightSyncClient makes, without changing them.

    The client posts with the module-level requests.post (vllm/distributed/weight_transfer/
    clients.py); while this context is open that name points at a wrapper that times the
    call and keeps the status and body. A client that posts some other way is simply not
    observed, and the checks that need its responses say so (SKIP)."""

    def __init__(self, log: CallLog) -> None:
        self.log = log
        self._original: Any = None

    def __enter__(self) -> "ClientRecorder":
        import requests

        self._original = requests.post
        original, log = self._original, self.log

        def recording_post(url: str, *args: Any, **kwargs: Any) -> Any:
            path = urllib.parse.urlsplit(url).path
            request = _summarize_request(kwargs.get("json"))
            started = time.monotonic()
            try:
                response = original(url, *args, **kwargs)
            except Exception as exc:
                log.add(source="client", method="POST", path=path, request=request, status=None,
                        body=_describe(exc), seconds=round(time.monotonic() - started, 4))
                raise
            log.add(source="client", method="POST", path=path, request=request,
                    status=response.status_code, body=_response_body(response),
                    seconds=round(time.monotonic() - started, 4))
            return response

        requests.post = recording_post
        return self

    def __exit__(self, *exc_info: Any) -> None:
        import requests

        requests.post = self._original


# ---------------------------------------------------------------------------------------
# vLLM's trainer-side API, as the installed vLLM spells it.
# ---------------------------------------------------------------------------------------

WT = "vllm.distributed.weight_transfer"


def _import_attr(modules: list[str], name: str) -> Any:
    errors = []
    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            errors.append(f"{module}: {exc}")
    raise SetupError(f"cannot import {name} ({'; '.join(errors)})")


@dataclasses.dataclass
class TrainerApi:
    client_class: Any
    module_source: Any
    factory: Any
    variant: str               # "init_info" (newest) or "backend+config"
    finish_takes_version: bool


def load_trainer_api() -> TrainerApi:
    try:
        client_class = _import_attr([WT, WT + ".clients"], "HTTPVLLMWeightSyncClient")
        module_source = _import_attr([WT, WT + ".base"], "ModuleSource")
        factory = _import_attr([WT, WT + ".factory"], "WeightTransferTrainerFactory")
    except SetupError as exc:
        raise SetupError(f"{exc}. This vLLM predates the trainer-side weight-transfer API "
                         "(HTTPVLLMWeightSyncClient, ModuleSource, WeightTransferTrainerFactory); "
                         "install a newer vLLM (docs/real-engine.md, Install).") from None
    trainer_init = inspect.signature(factory.trainer_init).parameters
    finish = inspect.signature(client_class.finish_weight_update).parameters
    return TrainerApi(client_class, module_source, factory,
                      "backend+config" if "config" in trainer_init else "init_info",
                      "weight_version" in finish)


def versioned_client_class(api: TrainerApi) -> Any:
    """vLLM's HTTP client, with the round's version riding the finish call (the way vLLM's
    own tests/entrypoints/serve/dev/rlhf tests pass a version through send_weights)."""
    base = api.client_class
    takes_version = api.finish_takes_version

    class VersionedClient(base):  # type: ignore[misc, valid-type]
        version: str | None = None

        def finish_weight_update(self, weight_version: str | None = None) -> None:
            version = weight_version if weight_version is not None else self.version
            if version is None:
                super().finish_weight_update()          # no body at all
            elif takes_version:
                super().finish_weight_update(version)   # {"weight_version": version}
            else:
                # This vLLM's client cannot send a version: post it as the HTTP API defines.
                import requests

                response = requests.post(f"{self.base_url}/finish_weight_update",
                                         json={"weight_version": version}, timeout=self.timeout)
                response.raise_for_status()

    return VersionedClient


def make_trainer(api: TrainerApi, backend: str, *, client: Any, source: Any, rank: int,
                 packed: bool, master_address: str = "", master_port: int = 0,
                 world_size: int = 0) -> Any:
    """WeightTransferTrainerFactory.trainer_init for the installed vLLM. For NCCL it posts
    /init_weight_transfer_engine on a side thread while it opens the rank-0 endpoint."""
    if backend == "nccl":
        info_class = _import_attr([WT + ".nccl_engine", WT + ".nccl_common"], "NCCLTrainerInitInfo")
        fields: dict[str, Any] = dict(master_address=master_address, master_port=master_port,
                                      world_size=world_size, rank=rank)
    else:
        info_class = _import_attr([WT + ".ipc_engine"], "IPCTrainerInitInfo")
        fields = dict(rank=rank)
    if "packed" in {field.name for field in dataclasses.fields(info_class)}:
        fields["packed"] = packed
    call: dict[str, Any] = dict(init_info=info_class(**fields), client=client, source=source)
    parameters = inspect.signature(api.factory.trainer_init).parameters
    if "config" in parameters:  # older spelling: packed rides a WeightTransferConfig subclass
        config_name = "NCCLWeightTransferConfig" if backend == "nccl" else "IPCWeightTransferConfig"
        call["config"] = _import_attr(["vllm.config"], config_name)(packed=packed)
    if "backend" in parameters:
        call["backend"] = backend
    return api.factory.trainer_init(**call)


# ---------------------------------------------------------------------------------------
# The trainer's weights.
# ---------------------------------------------------------------------------------------


def load_trainer_model(name: str, dtype: Any, device: Any) -> Any:
    """Hugging Face model on `device`, cast to `dtype`, in eval mode (OPT has dropout).
    Loaded without a dtype argument (its spelling changed across transformers releases)
    and cast afterwards: fp16 -> fp32 is exact, so the bf16 values equal a direct cast."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name)
    model.to(device=device, dtype=dtype)
    model.eval()
    return model


def perturb(model: Any, seed: int, scale: float) -> None:
    """Deterministic new weights: each parameter gets Gaussian noise of `scale` times its
    own standard deviation, drawn on the CPU from a generator seeded per parameter, so
    every phase and every trainer rank computes the same bytes."""
    import torch

    with torch.no_grad():
        for index, (_, param) in enumerate(model.named_parameters()):
            values = param.detach().to(device="cpu", dtype=torch.float64).reshape(-1)
            if values.numel() > 1:
                spread = float(values.std())
            else:
                spread = abs(float(values[0])) if values.numel() == 1 else 0.0
            # Rounded so that a last-bit difference in the reduction cannot change the noise.
            spread = float(f"{spread:.6g}") if math.isfinite(spread) else 0.0
            generator = torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + index)
            noise = torch.randn(tuple(param.shape), generator=generator, dtype=torch.float32)
            param.add_((noise * (scale * spread)).to(device=param.device, dtype=param.dtype))


def weights_sha(model: Any) -> str:
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode())
        digest.update(_digest_tensor(param).encode())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------
# Generations (vllm phase only): vLLM's server against Hugging Face, greedy, same tokens.
# ---------------------------------------------------------------------------------------


def vllm_greedy(http: Http, served_model: str, prompt_ids: list[int], steps: int) -> list[int]:
    """Greedy completion of exactly `steps` tokens from the prompt's token ids."""
    status, body = http.call("POST", "/v1/completions", keep=False, body={
        "model": served_model, "prompt": prompt_ids, "max_tokens": steps, "temperature": 0.0,
        "ignore_eos": True, "logprobs": 1, "return_tokens_as_token_ids": True,
        "return_token_ids": True})
    if status != 200:
        raise SetupError(f"/v1/completions answered {status}: {body}")
    choice = body["choices"][0]
    if isinstance(choice.get("token_ids"), list):
        return [int(token) for token in choice["token_ids"]]
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens]
    raise SetupError("/v1/completions returned neither token_ids nor token_id:N logprob tokens")


def hf_greedy(model: Any, prompt_ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy decoding with the KV cache, no stopping rule: `steps` argmax tokens, and at
    each step the gap in log-probability between the first and second choice."""
    import torch

    device = next(model.parameters()).device
    inputs = torch.tensor([prompt_ids], device=device)
    mask = torch.ones_like(inputs)
    past, tokens, gaps = None, [], []
    with torch.inference_mode():
        for _ in range(steps):
            out = model(input_ids=inputs, attention_mask=mask, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            token = int(torch.argmax(logits))
            top2 = torch.topk(torch.log_softmax(logits, dim=-1), 2).values
            tokens.append(token)
            gaps.append(float(top2[0] - top2[1]))
            inputs = torch.tensor([[token]], device=device)
            mask = torch.cat([mask, torch.ones((1, 1), dtype=mask.dtype, device=device)], dim=1)
    return tokens, gaps


def first_difference(a: list[int], b: list[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_generations(http: Http, served_model: str, tokenizer: Any, model: Any,
                        steps: int, tie_margin: float) -> list[dict[str, Any]]:
    results = []
    for prompt in PROMPTS:
        prompt_ids = list(tokenizer(prompt)["input_ids"])
        from_vllm = vllm_greedy(http, served_model, prompt_ids, steps)
        from_hf, gaps = hf_greedy(model, prompt_ids, steps)
        at = first_difference(from_vllm, from_hf)
        gap = gaps[at] if at is not None and at < len(gaps) else None
        results.append({
            "prompt": prompt, "prompt_ids": prompt_ids, "vllm": from_vllm, "hf": from_hf,
            "match": at is None, "first_difference": at, "hf_top2_gap_there": gap,
            "near_tie": gap is not None and gap < tie_margin,
            "vllm_text": tokenizer.decode(from_vllm), "hf_text": tokenizer.decode(from_hf)})
    return results


def describe_generations(results: list[dict[str, Any]]) -> str:
    good = sum(1 for r in results if r["match"])
    parts = [f"{good}/{len(results)} prompts equal over {len(results[0]['hf'])} tokens"]
    for r in results:
        if not r["match"]:
            kind = "near-tie" if r["near_tie"] else "clear"
            gap = r["hf_top2_gap_there"]
            parts.append(f"{r['prompt']!r}: first difference at token {r['first_difference']} "
                         f"({kind}, HF top-2 log-prob gap {'n/a' if gap is None else f'{gap:.4f}'})")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------
# Trainer processes: one, or several under torchrun (IPC with TP > 1).
# ---------------------------------------------------------------------------------------


class Dist:
    def __init__(self) -> None:
        self.size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.is_main = self.rank == 0
        if self.size > 1:
            import torch.distributed

            # vLLM's IPC trainer all-gathers the handles over the default group; gloo
            # carries those Python objects without touching the GPUs.
            torch.distributed.init_process_group(backend="gloo")

    def barrier(self) -> None:
        if self.size > 1:
            import torch.distributed

            torch.distributed.barrier()

    def gather(self, value: Any) -> list[Any]:
        if self.size == 1:
            return [value]
        import torch.distributed

        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, value)
        return out

    def close(self) -> None:
        if self.size > 1:
            import torch.distributed

            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_healthy(http: Http, seconds: float) -> None:
    import requests

    deadline, last = time.monotonic() + seconds, "no answer"
    while True:
        try:
            status, _ = http.call("GET", "/health", timeout=10, keep=False)
            if status == 200:
                return
            last = f"HTTP {status}"
        except requests.RequestException as exc:
            last = _describe(exc)
        if time.monotonic() > deadline:
            raise SetupError(f"{http.base_url}/health did not answer 200 within {seconds:.0f} s ({last})")
        time.sleep(2)


def _error_message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))
    return json.dumps(body) if not isinstance(body, str) else body


# ---------------------------------------------------------------------------------------
# One phase of one cell.
# ---------------------------------------------------------------------------------------


class Phase:
    def __init__(self, args: argparse.Namespace, dist: Dist) -> None:
        self.args = args
        self.dist = dist
        self.strict = args.target == "vllmd"  # the HTTP contract binds vllmd, not vLLM
        self.checks = Checks(echo=dist.is_main)
        self.log = CallLog()
        self.http = Http(args.base_url, args.http_timeout, self.log)
        self.probe = ProbeReader(args.probe_dir)
        self.probe_active = False
        self.versions = True      # /weight_info and /update_weight_version answer
        self.committed: str | None = None
        self.world_size = 0
        self.served_model = ""
        self.rounds: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {
            "target": args.target, "base_url": args.base_url,
            "config": {"model": args.model, "backend": args.backend, "tp": args.tp, "dp": args.dp,
                       "dtype": args.dtype, "rounds": args.rounds, "noise": args.noise,
                       "seed": args.seed, "packed": args.packed, "max_tokens": args.max_tokens,
                       "prompts": list(PROMPTS)},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "trainer_processes": dist.size}

    # -- helpers -------------------------------------------------------------------------

    def expect_body(self, check_id: str, status: int, body: Any, expected: Any) -> bool:
        return self.checks.check(check_id, status == 200 and body == expected,
                                 f"HTTP {status} {json.dumps(body)}" + ("" if body == expected else
                                                                        f" (expected {json.dumps(expected)})"),
                                 strict=self.strict)

    def weight_info(self) -> str | None:
        status, body = self.http.call("GET", "/weight_info")
        if status == 200 and isinstance(body, dict):
            return body.get("weight_version")
        return None

    def probe_update(self, check_id: str, mark: dict[str, int]) -> dict[str, Any] | None:
        if not self.probe_active:
            self.checks.skip(check_id, "no engine-side probe", required=self.args.require_probe)
            return None
        seen = analyse_update(self.probe.since(mark), self.world_size)
        ok = not seen["problems"]
        detail = (f"{len(seen['after'])} workers reported" if ok else "; ".join(seen["problems"]))
        self.checks.check(check_id, ok, detail)
        return seen

    # -- stages --------------------------------------------------------------------------

    def preflight(self) -> None:
        args, checks = self.args, self.checks
        wait_healthy(self.http, args.wait)
        checks.check("preflight.health", True, f"{args.base_url}/health answered 200")
        status, body = self.http.call("GET", "/version")
        self.summary["server_version"] = body if status == 200 else None
        checks.info("preflight.version", f"HTTP {status} {json.dumps(body)}")
        status, body = self.http.call("GET", "/get_world_size")
        self.world_size = int(body["world_size"]) if status == 200 and isinstance(body, dict) else -1
        expected = args.tp * args.dp
        if not checks.check("preflight.world_size", self.world_size == expected,
                            f"HTTP {status} {json.dumps(body)} (expected {expected} = TP {args.tp} x DP {args.dp})"):
            raise SetupError("world size differs from the engines started; an NCCL group would never form")
        status, body = self.http.call("GET", "/weight_info")
        self.versions = status == 200
        self.committed = body.get("weight_version") if self.versions and isinstance(body, dict) else None
        if self.versions:
            checks.info("preflight.weight_info", f"starts at {self.committed!r}")
        else:
            checks.check("preflight.weight_info", False, f"HTTP {status}: this server has no /weight_info",
                         strict=self.strict)
        status, body = self.http.call("GET", "/is_paused")
        self.expect_body("preflight.is_paused", status, body, {"is_paused": False})
        installs = self.probe.installs()
        self.probe_active = any(entry.get("installed") for entry in installs)
        if self.probe_active:
            checks.info("preflight.probe", f"installed in {sum(1 for e in installs if e.get('installed'))} "
                        f"processes ({installs[0].get('worker_class')})")
        else:
            why = (f"no probe install records in {args.probe_dir}" if args.probe_dir else "no --probe-dir")
            errors = {e.get("error") for e in installs if e.get("error")}
            checks.skip("preflight.probe", why + (f"; errors: {sorted(errors)}" if errors else ""),
                        required=args.require_probe)

    def check_init(self, entries: list[dict[str, Any]], seconds: float) -> None:
        calls = [e for e in entries if e["path"] == "/init_weight_transfer_engine"]
        if not calls:
            self.checks.skip("init.response", "the client's call was not observed")
            return
        call = calls[-1]
        self.expect_body("init.response", call["status"], call["body"], LIFECYCLE_BODIES[call["path"]])
        self.checks.info("init.request", f"init_info {json.dumps(call['request'].get('init_info'))}, "
                         f"trainer_init took {seconds:.2f} s")

    def check_lifecycle(self, k: int, entries: list[dict[str, Any]], version: str | None) -> None:
        paths = [e["path"] for e in entries]
        if not entries:
            self.checks.skip(f"r{k}.lifecycle", "the client's calls were not observed")
            return
        # start, one or more updates, finish: each answered 200 with the exact body.
        in_order = (len(paths) >= 3 and paths[0] == "/start_weight_update"
                    and paths[-1] == "/finish_weight_update"
                    and all(p == "/update_weights" for p in paths[1:-1]))
        wrong = [f"{e['path']} -> HTTP {e['status']} {json.dumps(e['body'])}" for e in entries
                 if e["status"] != 200 or e["body"] != LIFECYCLE_BODIES.get(e["path"])]
        if in_order and not wrong:
            detail = ", ".join(f"{e['path'][1:]} {e['seconds']:.2f}s" for e in entries)
        else:
            detail = "; ".join(([] if in_order else [f"calls {paths}"]) + wrong)
        self.checks.check(f"r{k}.lifecycle", in_order and not wrong, detail, strict=self.strict)
        finish = entries[-1]
        expected_request = None if version is None else {"weight_version": version}
        self.checks.check(f"r{k}.finish_request", finish["request"] == expected_request,
                          f"finish sent {json.dumps(finish['request'])}")

    def sync_round(self, k: int, engine: Any, client: Any, model: Any, tokenizer: Any) -> None:
        args, checks, dist, http = self.args, self.checks, self.dist, self.http
        if k > 1:
            perturb(model, args.seed + k, args.noise)
        sha = weights_sha(model)
        shas = dist.gather(sha)
        record: dict[str, Any] = {"round": k, "trainer_weights_sha": sha}
        # Odd rounds commit their version through finish_weight_update; even rounds send a
        # version-less finish, then commit with /update_weight_version.
        version = f"step-{k}" if k % 2 == 1 else None
        probe_mark: dict[str, int] = {}
        if dist.is_main:
            if dist.size > 1:
                checks.check(f"r{k}.trainer_weights", len(set(shas)) == 1,
                             f"{dist.size} trainer ranks hold {'identical' if len(set(shas)) == 1 else 'DIFFERENT'} weights")
            probe_mark = self.probe.mark()
            status, body = http.call("POST", "/pause")
            self.expect_body(f"r{k}.pause", status, body, {"status": "paused"})
            status, body = http.call("GET", "/is_paused")
            self.expect_body(f"r{k}.is_paused", status, body, {"is_paused": True})
        dist.barrier()
        client.version = version
        mark = self.log.mark()
        started = time.monotonic()
        try:
            engine.send_weights()
        except Exception:
            if dist.is_main:  # like a trainer would: never leave generation paused
                http.call("POST", "/resume")
            raise
        record["send_seconds"] = round(time.monotonic() - started, 3)
        dist.barrier()
        if dist.is_main:
            entries = self.log.since(mark, "client")
            record["client_calls"] = [{k2: e[k2] for k2 in ("path", "status", "seconds")} for e in entries]
            self.check_lifecycle(k, entries, version)
            if self.versions:
                seen = self.weight_info()
                if version is not None:
                    checks.check(f"r{k}.version", seen == version,
                                 f"weight_info {seen!r} after finish with {version!r}", strict=self.strict)
                else:
                    checks.check(f"r{k}.versionless_finish", seen == self.committed,
                                 f"weight_info {seen!r} after a version-less finish (was {self.committed!r})",
                                 strict=self.strict)
                    version = f"step-{k}"
                    status, body = http.call("POST", "/update_weight_version", body={"new_version": version})
                    self.expect_body(f"r{k}.update_weight_version", status, body,
                                     {"success": True, "new_version": version})
                    seen = self.weight_info()
                    checks.check(f"r{k}.version", seen == version,
                                 f"weight_info {seen!r} after update_weight_version {version!r}", strict=self.strict)
                self.committed = version
            else:
                checks.skip(f"r{k}.version", "this server has no /weight_info", required=self.strict)
            record["version"] = self.committed
            status, body = http.call("POST", "/resume")
            self.expect_body(f"r{k}.resume", status, body, {"status": "resumed"})
            status, body = http.call("GET", "/is_paused")
            self.expect_body(f"r{k}.is_resumed", status, body, {"is_paused": False})
            seen_update = self.probe_update(f"r{k}.probe", probe_mark)
            if seen_update is not None:
                record["probe"] = {"after": seen_update["after"], "changed": seen_update["changed"]}
                unchanged = [w for w, n in seen_update["changed"].items() if n == 0]
                checks.check(f"r{k}.weights_changed", bool(seen_update["changed"]) and not unchanged,
                             "parameters changed per worker: " + json.dumps(seen_update["changed"]))
            if args.target == "vllm":
                results = compare_generations(http, self.served_model, tokenizer, model,
                                              args.max_tokens, args.tie_margin)
                record["generation"] = results
                checks.check(f"r{k}.generation", all(r["match"] for r in results), describe_generations(results))
                if k > 1 and self.rounds and "generation" in self.rounds[-1]:
                    before = [r["hf"] for r in self.rounds[-1]["generation"]]
                    visible = any(r["hf"] != b for r, b in zip(results, before))
                    checks.check(f"r{k}.perturbation_visible", visible,
                                 "round's weights change the greedy output" if visible else
                                 "greedy output equals the previous round's; raise --noise", strict=False)
        self.rounds.append(record)
        dist.barrier()

    def rejected_finish(self, tokenizer: Any, model: Any) -> None:
        """A finish with no update in progress fails in every worker; the version stays."""
        args, checks, http = self.args, self.checks, self.http
        probe_mark = self.probe.mark()
        status, body = http.call("POST", "/finish_weight_update", body={"weight_version": REJECTED_VERSION})
        message = _error_message(body)
        if self.strict:
            ok = (status == 500 and isinstance(body, dict) and isinstance(body.get("error"), dict)
                  and body["error"].get("type") == "server_error" and "finish_weight_update" in message)
        else:
            ok = status >= 400
        checks.check("neg.finish_rejected", ok, f"HTTP {status} {message[:300]}", strict=self.strict)
        if self.versions:
            seen = self.weight_info()
            checks.check("neg.version_kept", seen == self.committed,
                         f"weight_info {seen!r} (committed {self.committed!r}, rejected {REJECTED_VERSION!r})",
                         strict=self.strict)
        else:
            checks.skip("neg.version_kept", "this server has no /weight_info", required=self.strict)
        status, _ = http.call("GET", "/health")
        checks.check("neg.health", status == 200, f"HTTP {status} after the rejected finish", strict=self.strict)
        if self.probe_active:
            records = self.probe.since(probe_mark)
            failed = sorted({r.get("worker") for r in records if r.get("event") == "finish" and not r.get("ok")})
            checks.info("neg.probe", f"workers that ran and refused the finish: {failed}")
        if args.target == "vllm" and self.rounds and "generation" in self.rounds[-1]:
            results = compare_generations(http, self.served_model, tokenizer, model,
                                          args.max_tokens, args.tie_margin)
            same = [r["vllm"] for r in results] == [r["vllm"] for r in self.rounds[-1]["generation"]]
            checks.check("neg.generation_unchanged", same, "generations after the rejected finish "
                         + ("equal the last round's" if same else "DIFFER from the last round's"))

    def compare_with_reference(self) -> None:
        checks = self.checks
        try:
            with open(self.args.reference, encoding="utf-8") as handle:
                reference = json.load(handle)
        except (OSError, ValueError) as exc:
            checks.check("ref.comparable", False, f"cannot read {self.args.reference}: {exc}")
            return
        if reference.get("target") != "vllm" or reference.get("verdict") == "ERROR":
            checks.check("ref.comparable", False, f"{self.args.reference} is not a completed vllm phase "
                         f"(target {reference.get('target')!r}, error {reference.get('error')!r})")
            return
        differing = [key for key in COMPARABLE if reference.get("config", {}).get(key) != self.summary["config"][key]]
        ref_rounds = reference.get("rounds") or []
        shas_equal = ([r.get("trainer_weights_sha") for r in ref_rounds]
                      == [r.get("trainer_weights_sha") for r in self.rounds])
        comparable = not differing and shas_equal
        checks.check("ref.comparable", comparable,
                     "same settings and trainer weights as the vllm phase" if comparable else
                     f"settings differ: {differing}; trainer weights equal in every round: {shas_equal}")
        for mine, theirs in zip(self.rounds, ref_rounds):
            k = mine["round"]
            if "probe" not in mine or "probe" not in theirs:
                checks.skip(f"r{k}.weights_match_reference", "a phase has no probe records",
                            required=self.args.require_probe)
                continue
            a, b = mine["probe"]["after"], theirs["probe"]["after"]
            differ = sorted(f"{w}:{name}" for w in set(a) | set(b)
                            for name in set(a.get(w, {})) | set(b.get(w, {}))
                            if a.get(w, {}).get(name) != b.get(w, {}).get(name))
            params = sum(len(v) for v in b.values())
            if differ:
                detail = f"{len(differ)} of {params} worker parameters differ, e.g. {differ[:5]}"
            elif not comparable:
                detail = "digests equal, but the phases are not comparable (see ref.comparable)"
            else:
                detail = f"{len(b)} workers x {params // max(len(b), 1)} parameters identical to the vllm phase"
            checks.check(f"r{k}.weights_match_reference", comparable and not differ and bool(b), detail)
        theirs = {(e["source"], e["path"]): e for e in reference.get("calls", []) if e.get("status") is not None}
        parity = []
        for entry in self.log.entries:
            other = theirs.get((entry["source"], entry["path"]))
            if other and entry["path"] in ("/get_world_size", *LIFECYCLE_BODIES) and \
                    (other["status"], other["body"]) != (entry["status"], entry["body"]):
                parity.append(f"{entry['path']}: vLLM {other['status']} {json.dumps(other['body'])}, "
                              f"vllmd {entry['status']} {json.dumps(entry['body'])}")
        checks.check("ref.http_parity", not parity, "; ".join(sorted(set(parity))) or
                     "world size and lifecycle responses equal vLLM's server", strict=False)

    def run(self) -> None:
        args, dist, checks = self.args, self.dist, self.checks
        if args.backend == "ipc":
            # HTTP carries the CUDA IPC handles pickled; vLLM's IPC docs set this on both sides.
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        import torch

        if not torch.cuda.is_available():
            raise SetupError("no CUDA device is visible to the trainer")
        device = torch.device(args.device or f"cuda:{dist.local_rank}")
        torch.cuda.set_device(device)
        if args.backend == "nccl" and dist.size > 1:
            raise SetupError("the NCCL trainer is one process (rank 0 of the transfer group); do not use torchrun")
        api = load_trainer_api()
        versions = {}
        for package in ("vllm", "torch", "transformers"):
            try:
                versions[package] = importlib.import_module(package).__version__
            except Exception as exc:  # noqa: BLE001 - report whatever is there
                versions[package] = _describe(exc)
        self.summary["packages"] = versions
        self.summary["trainer_api"] = {
            "client_class": f"{api.client_class.__module__}.{api.client_class.__qualname__}",
            "module_source": f"{api.module_source.__module__}.{api.module_source.__qualname__}",
            "factory": f"{api.factory.__module__}.{api.factory.__qualname__}",
            "variant": api.variant, "finish_takes_version": api.finish_takes_version}
        if dist.is_main:
            checks.info("trainer.api", f"vllm {versions['vllm']}: WeightTransferTrainerFactory ({api.variant}), "
                        f"finish_weight_update takes a version: {api.finish_takes_version}")
            self.preflight()
        dist.barrier()

        tokenizer = None
        model = load_trainer_model(args.model, getattr(torch, args.dtype), device)
        if dist.is_main and args.target == "vllm":
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.model)
            self.served_model = args.served_model or self._served_model()
            before = compare_generations(self.http, self.served_model, tokenizer, model,
                                         args.max_tokens, args.tie_margin)
            self.summary["before_first_sync"] = before
            differs = not any(r["match"] for r in before)
            checks.check("r0.before_sync", differs, "engine's starting weights give other generations than "
                         "the trainer's" if differs else "engine already generates like the trainer: "
                         "start it with --load-format dummy", strict=False)

        client = versioned_client_class(api)(args.base_url, timeout=args.http_timeout)
        source = api.module_source(model)
        with ClientRecorder(self.log):
            mark = self.log.mark()
            started = time.monotonic()
            engine = make_trainer(api, args.backend, client=client, source=source, rank=dist.rank,
                                  packed=args.packed, master_address=args.master_address,
                                  master_port=free_port(args.master_address) if args.backend == "nccl" else 0,
                                  world_size=self.world_size + 1)
            if dist.is_main:
                self.check_init(self.log.since(mark, "client"), time.monotonic() - started)
            dist.barrier()
            try:
                for k in range(1, args.rounds + 1):
                    self.sync_round(k, engine, client, model, tokenizer)
                if dist.is_main:
                    self.rejected_finish(tokenizer, model)
                dist.barrier()
            finally:
                shutdown = getattr(engine, "shutdown", None)
                if callable(shutdown):
                    shutdown()
        if dist.is_main and args.target == "vllmd":
            if args.reference:
                self.compare_with_reference()
            else:
                checks.skip("ref.comparable", "no --reference: the workers' weights are not compared",
                            required=True)

    def _served_model(self) -> str:
        status, body = self.http.call("GET", "/v1/models")
        if status != 200 or not body.get("data"):
            raise SetupError(f"/v1/models answered {status}: {body}")
        return str(body["data"][0]["id"])

    def write(self, error: str | None) -> int:
        failed = self.checks.failed()
        verdict = "ERROR" if error else ("FAIL" if failed else "PASS")
        self.summary.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), verdict=verdict, error=error,
                            world_size=self.world_size, checks=self.checks.items, rounds=self.rounds,
                            calls=self.log.entries)
        if self.args.out and self.dist.is_main:
            os.makedirs(os.path.dirname(os.path.abspath(self.args.out)), exist_ok=True)
            with open(self.args.out, "w", encoding="utf-8") as out:
                json.dump(self.summary, out, indent=1, sort_keys=True)
        if self.dist.is_main:
            print(f"\n{verdict}: {args_label(self.args)}, {len(failed)} failed checks"
                  + (f"; error: {error}" if error else ""), flush=True)
        return EXIT_ERROR if error else (EXIT_FAIL if failed else EXIT_PASS)


def args_label(args: argparse.Namespace) -> str:
    return f"{args.backend} TP{args.tp} via {args.target} at {args.base_url}"


def run_phase(args: argparse.Namespace) -> int:
    dist = Dist()
    phase = Phase(args, dist)
    error = None
    try:
        phase.run()
    except SetupError as exc:
        error = str(exc)
    except Exception as exc:  # keep what was learnt, then say where it stopped
        error = _describe(exc)
        if dist.is_main:
            import traceback

            traceback.print_exc()
    code = phase.write(error)
    if not error:
        dist.close()
    return code


# ---------------------------------------------------------------------------------------
# report: one table for the whole matrix.
# ---------------------------------------------------------------------------------------


def _load(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _status_of(phase: dict[str, Any] | None, suffixes: tuple[str, ...], prefix: str = "") -> str:
    if phase is None:
        return "-"
    picked = [c for c in phase.get("checks", []) if c["id"].startswith(prefix)
              and c["id"].split(".", 1)[-1] in suffixes]
    if not picked:
        return "not run"
    for status in ("FAIL", "WARN", "SKIP"):
        if any(c["status"] == status for c in picked):
            return status
    return "PASS"


def _update_seconds(phase: dict[str, Any] | None) -> str:
    if phase is None:
        return "-"
    times = [c["seconds"] for r in phase.get("rounds", []) for c in r.get("client_calls", [])
             if c["path"] == "/update_weights" and c["seconds"] is not None]
    return f"{sum(times) / len(times):.2f}" if times else "-"


def report(args: argparse.Namespace) -> int:
    cells = sorted(d for d in glob.glob(os.path.join(args.results, "*")) if os.path.isdir(d))
    lines = ["| cell | vLLM server: generations = HF | vllmd: HTTP contract | vllmd: weights = vLLM phase "
             "| failed finish keeps version | update_weights s (vLLM / vllmd) | verdict (vLLM / vllmd) |",
             "|---|---|---|---|---|---|---|"]
    notes, worst = [], EXIT_PASS
    for cell in cells:
        name = os.path.basename(cell)
        skipped = os.path.join(cell, "SKIPPED")
        if os.path.exists(skipped):
            with open(skipped, encoding="utf-8") as handle:
                lines.append(f"| {name} | skipped: {handle.read().strip()} | | | | | |")
            continue
        ref, mine = _load(os.path.join(cell, "vllm.json")), _load(os.path.join(cell, "vllmd.json"))
        contract = ("health", "world_size", "weight_info", "is_paused", "response", "pause", "lifecycle",
                    "finish_request", "version", "versionless_finish", "update_weight_version", "resume",
                    "is_resumed")
        weights = ("probe", "trainer_weights", "weights_changed", "weights_match_reference", "comparable")
        lines.append(
            f"| {name} | {_status_of(ref, ('generation',))} | {_status_of(mine, contract)} "
            f"| {_status_of(mine, weights)} "
            f"| {_status_of(mine, ('finish_rejected', 'version_kept'), 'neg.')} "
            f"| {_update_seconds(ref)} / {_update_seconds(mine)} "
            f"| {(ref or {}).get('verdict', 'missing')} / {(mine or {}).get('verdict', 'missing')} |")
        for label, phase in (("vLLM", ref), ("vllmd", mine)):
            if phase is None:
                notes.append(f"- {name} ({label}): no result file")
                worst = max(worst, EXIT_ERROR)
                continue
            if phase.get("error"):
                notes.append(f"- {name} ({label}): ERROR {phase['error']}")
                worst = max(worst, EXIT_ERROR)
            for check in phase.get("checks", []):
                if check["status"] in ("FAIL", "WARN"):
                    notes.append(f"- {name} ({label}): {check['status']} {check['id']}: {check['detail']}")
                    if check["status"] == "FAIL":
                        worst = max(worst, EXIT_FAIL)
    print("\n".join(lines))
    if notes:
        print("\n" + "\n".join(notes))
    return worst


# ---------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one phase of one cell (see docs/real-engine.md)")
    run.add_argument("--target", choices=("vllm", "vllmd"), required=True,
                     help="vllm: vLLM's own API server (the oracle); vllmd: vllmd before headless engines")
    run.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    run.add_argument("--backend", choices=("nccl", "ipc"), required=True)
    run.add_argument("--tp", type=int, required=True, help="tensor-parallel size the engines were started with")
    run.add_argument("--dp", type=int, default=1, help="data-parallel size (engines behind vllmd)")
    run.add_argument("--model", default="facebook/opt-125m")
    run.add_argument("--served-model", help="model name for /v1/completions (default: first of /v1/models)")
    run.add_argument("--dtype", default="bfloat16", help="trainer dtype; start the engines with the same --dtype")
    run.add_argument("--rounds", type=int, default=2, help="weight syncs; round 1 sends the checkpoint, "
                     "later rounds perturbed weights")
    run.add_argument("--noise", type=float, default=0.02, help="perturbation, in standard deviations per parameter")
    run.add_argument("--seed", type=int, default=1234)
    run.add_argument("--max-tokens", type=int, default=128, help="greedy tokens per prompt")
    run.add_argument("--tie-margin", type=float, default=0.05,
                     help="log-prob gap under which a first difference is reported as a near-tie")
    run.add_argument("--packed", action="store_true", help="packed transfer; vLLM releases whose trainer takes "
                     "a WeightTransferConfig also need packed in the engines' --weight-transfer-config")
    run.add_argument("--probe-dir", help="VLLMD_PROBE_DIR the engines were started with")
    run.add_argument("--require-probe", action="store_true", help="fail, not skip, without probe records")
    run.add_argument("--reference", help="vllmd target: the vllm phase's result file to compare weights with")
    run.add_argument("--master-address", default="127.0.0.1", help="NCCL rendezvous address (trainer side)")
    run.add_argument("--device", help="trainer device (default cuda:LOCAL_RANK)")
    run.add_argument("--http-timeout", type=float, default=900.0)
    run.add_argument("--wait", type=float, default=900.0, help="seconds to wait for /health = 200")
    run.add_argument("--out", help="write the phase's result (JSON) here")
    rep = sub.add_parser("report", help="a Markdown table of a results directory")
    rep.add_argument("results", help="directory with one sub-directory per cell")
    args = parser.parse_args(argv)
    if args.command == "run" and (args.tp < 1 or args.dp < 1 or args.rounds < 1 or args.max_tokens < 1):
        parser.error("--tp, --dp, --rounds and --max-tokens must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.command == "report":
        return report(args)
    return run_phase(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
