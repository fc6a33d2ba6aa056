"""The reference engine's tokens, predicted as vllm-ref-engine(1) documents them.

A test (or a trainer) computes what a request with a seed must get back, before and after a
weight sync, without asking the engine."""

import hashlib

MASK = (1 << 64) - 1


def mix(x):
    """splitmix64's finalizer."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def fingerprint(version="default", sessions=0, tensors=None):
    """The fingerprint of the weights an engine holds: `tensors` maps names to bytes (the tcp
    backend only), `sessions` counts the weight-update sessions worker 0 finished."""
    material = ""
    for name in sorted(tensors or {}):
        material += f"{name} {hashlib.sha256(tensors[name]).hexdigest()}\n"
    material += f"version {version}\nsessions {sessions}\n"
    return int(hashlib.sha256(material.encode()).hexdigest()[:16], 16)


def key_of(seed=None, request_id=""):
    if seed is not None:
        return seed & MASK
    h = 0xCBF29CE484222325
    for byte in request_id.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return h


def tokens(prompt, count, seed, vocab_size=32000, weights=None, request_id=""):
    """The first `count` tokens for `prompt` with `seed` (or, without one, for the engine's
    `request_id`), under `weights` (a fingerprint; default: a fresh engine's), before any stop
    rule."""
    weights = fingerprint() if weights is None else weights
    digest = 0
    for token in prompt:
        digest = mix(digest ^ (token & MASK))
    base = mix(mix(mix(weights) ^ key_of(seed, request_id)) ^ digest)
    return [mix(base ^ t) % vocab_size for t in range(count)]
