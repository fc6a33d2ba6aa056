"""A Llama decoder as Hugging Face's LlamaForCausalLM defines it, in float64 numpy.

The trainer's side of the reference engine's Llama: tests check the engine token for token
against it, and the RL example trains it. It follows the HF definition (no rope scaling, no
biases), not the C++ code, so that the two can catch each other's mistakes. Every operation,
the rotary tables included, is float64; the only rounding to float32 or bfloat16 is the one
round_to() and tensor_bytes() do on purpose, to match what an engine holds."""

import json
import os
import struct

import numpy as np

_SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16"}


# --- Configuration and parameters -------------------------------------------------------------

def config_dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                rope_theta=10000.0, max_position_embeddings=2048, tie_word_embeddings=False,
                bos_token_id=1, eos_token_id=2, head_dim=None):
    """A config.json dict as Hugging Face's LlamaConfig writes it; `head_dim` only when given
    (HF then derives it as hidden_size // num_attention_heads)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "float32",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "hidden_act": "silu",
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    }
    if head_dim is not None:
        config["head_dim"] = head_dim
    return config


def head_dim_of(config):
    # As HF: a missing or null head_dim means hidden_size // num_attention_heads.
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def kv_heads_of(config):
    # As HF: a missing or null num_key_value_heads means plain multi-head attention.
    return config.get("num_key_value_heads") or config["num_attention_heads"]


def parameter_shapes(config):
    """{HF parameter name: shape}, in the order of the module tree (lm_head absent when tied)."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d, heads, kv = head_dim_of(config), config["num_attention_heads"], kv_heads_of(config)
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (heads * d, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv * d, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv * d, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * d)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def _check_weights(config, weights):
    shapes = parameter_shapes(config)
    if set(weights) != set(shapes):
        missing, extra = set(shapes) - set(weights), set(weights) - set(shapes)
        raise ValueError(f"weights do not match the config: missing {sorted(missing)}, "
                         f"unexpected {sorted(extra)}")
    for name, shape in shapes.items():
        if tuple(np.shape(weights[name])) != shape:
            raise ValueError(f"{name}: shape {np.shape(weights[name])}, config says {shape}")
    return shapes


def init_weights(config, seed, std=0.1):
    """Random float64 weights, drawn in parameter_shapes() order from default_rng(seed)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in parameter_shapes(config).items():
        if len(shape) == 1:
            # Norm weights near 1 but not 1, so a norm applied without its weight shows.
            weights[name] = 1.0 + rng.normal(0.0, 0.1, shape)
        else:
            weights[name] = rng.normal(0.0, std, shape)
    return weights


# --- float32 / bfloat16 -----------------------------------------------------------------------

def bfloat16_bits(array):
    """bfloat16 bit patterns (uint16) of `array`, as torch casts: to float32 first, then the
    upper half of its bits after round-to-nearest-even on the lower half; NaN is 0x7FC0."""
    f32 = np.asarray(array, dtype=np.float64).astype(np.float32)
    bits = f32.view(np.uint32).astype(np.uint64)  # uint64: the rounding add cannot wrap
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = bits.astype(np.uint16)
    out[np.isnan(f32)] = 0x7FC0
    return out


def _bfloat16_values(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)


def round_to(weights, dtype):
    """The float64 values a float32 or bfloat16 copy of `weights` (a dict or one array) holds,
    so the trainer's model is exactly what an engine holds after receiving those bytes."""
    if isinstance(weights, dict):
        return {name: round_to(value, dtype) for name, value in weights.items()}
    if dtype == "float32":
        return np.asarray(weights, dtype=np.float64).astype(np.float32).astype(np.float64)
    if dtype == "bfloat16":
        return _bfloat16_values(bfloat16_bits(weights))
    raise ValueError(f"unknown dtype {dtype!r}")


def tensor_bytes(array, dtype):
    """Little-endian, C-order bytes of `array` as "float32" or "bfloat16"."""
    if dtype == "float32":
        return np.ascontiguousarray(array, dtype="<f4").tobytes()
    if dtype == "bfloat16":
        return np.ascontiguousarray(bfloat16_bits(array), dtype="<u2").tobytes()
    raise ValueError(f"unknown dtype {dtype!r}")


# --- The pieces of the forward pass -----------------------------------------------------------

def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x):
    with np.errstate(over="ignore"):  # exp(-x) = inf for x < -709 still gives silu = -0
        return x / (1.0 + np.exp(-x))


def rope_tables(positions, head_dim, theta):
    """cos, sin [len(positions), head_dim] in HF's layout: the frequencies twice, concatenated."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    freqs = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x, cos, sin):
    """x [T, heads, head_dim] at the positions the rows of cos, sin [T, head_dim] stand for."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def attention(q, k, v):
    """Causal grouped-query attention: q [T, H, d] holds the last T of the S positions whose
    keys and values k, v [S, KV, d] hold. Returns [T, H * d]."""
    T, H, d = q.shape
    S, KV, _ = k.shape
    # Each kv head serves `group` consecutive query heads: head h reads kv head h // group.
    group = H // KV
    k = np.repeat(k, group, axis=1).transpose(1, 2, 0)  # [H, d, S]
    v = np.repeat(v, group, axis=1).transpose(1, 0, 2)  # [H, S, d]
    scores = (q.transpose(1, 0, 2) @ k) / np.sqrt(d)  # [H, T, S]
    # Query t sits at position S - T + t and sees keys 0 ..= S - T + t.
    future = np.arange(S)[None, :] > np.arange(S - T, S)[:, None]
    scores[:, future] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return (p @ v).transpose(1, 0, 2).reshape(T, H * d)


def log_softmax(logits):
    """float64 log-softmax over the last axis."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


# --- The model --------------------------------------------------------------------------------

class KVCache:
    """Rotated keys and values [positions, kv_heads, head_dim] per layer."""

    def __init__(self, layers, kv_heads, head_dim):
        self.keys = [np.zeros((0, kv_heads, head_dim)) for _ in range(layers)]
        self.values = [np.zeros((0, kv_heads, head_dim)) for _ in range(layers)]
        self.length = 0


class _Layer:
    def __init__(self, w, prefix):
        self.input_norm = w[prefix + "input_layernorm.weight"]
        self.q = w[prefix + "self_attn.q_proj.weight"]
        self.k = w[prefix + "self_attn.k_proj.weight"]
        self.v = w[prefix + "self_attn.v_proj.weight"]
        self.o = w[prefix + "self_attn.o_proj.weight"]
        self.post_norm = w[prefix + "post_attention_layernorm.weight"]
        self.gate = w[prefix + "mlp.gate_proj.weight"]
        self.up = w[prefix + "mlp.up_proj.weight"]
        self.down = w[prefix + "mlp.down_proj.weight"]


class Model:
    """LlamaForCausalLM over float64 copies of `weights` (round_to() them first to match an
    engine that holds float32 or bfloat16)."""

    def __init__(self, config, weights):
        shapes = _check_weights(config, weights)
        # Copies: a trainer updating its arrays in place must not change a model it built.
        w = {name: np.array(weights[name], dtype=np.float64) for name in shapes}
        self.config = config
        self.vocab_size = config["vocab_size"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = kv_heads_of(config)
        self.head_dim = head_dim_of(config)
        if self.heads % self.kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.eps = float(config["rms_norm_eps"])
        self.theta = float(config.get("rope_theta", 10000.0))
        self.embed = w["model.embed_tokens.weight"]
        self.layers = [_Layer(w, f"model.layers.{i}.")
                       for i in range(config["num_hidden_layers"])]
        self.norm = w["model.norm.weight"]
        self.lm_head = self.embed if config.get("tie_word_embeddings") else w["lm_head.weight"]

    def new_cache(self):
        return KVCache(len(self.layers), self.kv_heads, self.head_dim)

    def _features(self, tokens, cache):
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise ValueError("no tokens")
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        T, d = len(tokens), self.head_dim
        cos, sin = rope_tables(np.arange(cache.length, cache.length + T), d, self.theta)
        x = self.embed[tokens]
        for i, layer in enumerate(self.layers):
            n = rms_norm(x, layer.input_norm, self.eps)
            q = apply_rotary((n @ layer.q.T).reshape(T, self.heads, d), cos, sin)
            k = apply_rotary((n @ layer.k.T).reshape(T, self.kv_heads, d), cos, sin)
            v = (n @ layer.v.T).reshape(T, self.kv_heads, d)
            cache.keys[i] = np.concatenate([cache.keys[i], k])
            cache.values[i] = np.concatenate([cache.values[i], v])
            h = x + attention(q, cache.keys[i], cache.values[i]) @ layer.o.T
            n = rms_norm(h, layer.post_norm, self.eps)
            x = h + (silu(n @ layer.gate.T) * (n @ layer.up.T)) @ layer.down.T
        cache.length += T
        return rms_norm(x, self.norm, self.eps)

    def forward(self, tokens, cache):
        """Logits [T, vocab] for `tokens` placed after the cache.length positions `cache`
        holds; their keys and values are appended to it."""
        return self._features(tokens, cache) @ self.lm_head.T

    def features(self, tokens):
        """What the lm_head reads: the final normalised hidden states [T, hidden] of a full
        causal forward (logits = features @ lm_head.T), for a trainer's head gradient."""
        return self._features(tokens, self.new_cache())

    def logits(self, tokens):
        """The full causal forward over `tokens`: logits [T, vocab]."""
        return self.forward(tokens, self.new_cache())

    def incremental_logits(self, tokens, prefill=1):
        """The same logits as logits(), computed as a server decodes: the first `prefill`
        tokens at once, then one token at a time through the KV cache."""
        cache = self.new_cache()
        rows = [self.forward(tokens[:prefill], cache)]
        rows += [self.forward(tokens[t:t + 1], cache) for t in range(prefill, len(tokens))]
        return np.concatenate(rows)

    def greedy(self, prompt, n):
        """n greedy tokens after `prompt` (argmax, the lowest id on ties) and the logprob of
        each under the raw logits that chose it. Returns (list of int, float64 array [n])."""
        cache = self.new_cache()
        last = self.forward(prompt, cache)[-1]
        tokens, logprobs = [], np.zeros(n)
        for step in range(n):
            token = int(np.argmax(last))  # np.argmax returns the first maximum
            tokens.append(token)
            logprobs[step] = log_softmax(last)[token]
            if step + 1 < n:
                last = self.forward([token], cache)[-1]
        return tokens, logprobs

    def token_logprobs(self, prompt, completion):
        """log p(completion[j] | prompt + completion[:j]) for each j, by one full forward —
        what an RL trainer compares with the server's logprobs."""
        prompt, completion = list(prompt), list(completion)
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        logits = self.logits(prompt + completion)[len(prompt) - 1:-1]
        return log_softmax(logits)[np.arange(len(completion)), completion]


# --- safetensors and model directories --------------------------------------------------------

def write_safetensors(path, tensors, metadata=None):
    """Write {name: (dtype, array)} in the given order; `metadata` (str -> str) defaults to
    {"format": "pt"}, what transformers writes."""
    header = {"__metadata__": {str(k): str(v) for k, v in (metadata or {"format": "pt"}).items()}}
    chunks, offset = [], 0
    for name, (dtype, array) in tensors.items():
        data = tensor_bytes(array, dtype)
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(np.shape(array)),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data then starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in chunks:
            f.write(data)


def read_safetensors_header(path):
    """(header dict, offset of the data in the file)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)), 8 + length


def read_safetensors(path):
    """{name: float64 array} of an F32, BF16, F16 or F64 safetensors file."""
    header, base = read_safetensors_header(path)
    with open(path, "rb") as f:
        raw = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        data, dtype = raw[base + begin:base + end], info["dtype"]
        if dtype == "BF16":
            values = _bfloat16_values(np.frombuffer(data, dtype="<u2"))
        elif dtype in ("F32", "F16", "F64"):
            values = np.frombuffer(data, dtype={"F32": "<f4", "F16": "<f2", "F64": "<f8"}[dtype])
        else:
            raise ValueError(f"{name}: unsupported dtype {dtype}")
        tensors[name] = values.astype(np.float64).reshape(info["shape"])
    return tensors


def write_model_dir(directory, config, weights, dtype="float32", shards=1):
    """A Hugging Face model directory: config.json (its torch_dtype set to `dtype`) and
    model.safetensors, or for shards > 1 model-0000i-of-0000N.safetensors files and
    model.safetensors.index.json. Tensors go in parameter_shapes() order, split into `shards`
    runs of about equal count."""
    names = list(_check_weights(config, weights))
    if not 1 <= shards <= len(names):
        raise ValueError(f"shards must be in [1, {len(names)}]")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dict(config, torch_dtype=dtype), f, indent=2)
        f.write("\n")
    if shards == 1:
        write_safetensors(os.path.join(directory, "model.safetensors"),
                          {name: (dtype, weights[name]) for name in names})
        return
    weight_map, total = {}, 0
    for i, group in enumerate(np.array_split(np.arange(len(names)), shards), 1):
        file = f"model-{i:05d}-of-{shards:05d}.safetensors"
        part = {names[j]: (dtype, weights[names[j]]) for j in group}
        write_safetensors(os.path.join(directory, file), part)
        for name, (_, array) in part.items():
            weight_map[name] = file
            total += np.size(array) * (4 if dtype == "float32" else 2)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": int(total)}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def read_model_dir(directory):
    """(config, {name: float64 array}) of a directory write_model_dir() (or HF) wrote."""
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for file in files:
        weights.update(read_safetensors(os.path.join(directory, file)))
    return config, weights
