"""Self-check of llama_numpy: /usr/bin/python3 tests/integration/support/test_llama_numpy.py

The model is what the C++ engine is judged by, so it is checked here against a second,
deliberately naive implementation (loops over positions, heads and dimension pairs), against
values worked out by hand, and against itself along paths that share little code."""

import json
import math
import os
import struct
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "examples"))
import llama_numpy as L  # noqa: E402


# --- A naive second implementation ------------------------------------------------------------
# Matrix-vector products use numpy (nothing to get wrong there); the RMSNorm, the rotary, the
# head-to-kv-head mapping, the causal mask and the softmax are explicit loops.

def naive_rms_norm(vec, weight, eps):
    mean_square = sum(float(v) * float(v) for v in vec) / len(vec)
    return np.array([vec[i] / math.sqrt(mean_square + eps) * weight[i] for i in range(len(vec))])


def naive_rotary(vec, position, theta):
    # Rotate-half pairs dimension i with i + d/2, rotated by position * theta^(-2i/d).
    d = len(vec)
    out = np.zeros(d)
    for i in range(d // 2):
        angle = position / theta ** (2 * i / d)
        c, s = math.cos(angle), math.sin(angle)
        out[i] = vec[i] * c - vec[i + d // 2] * s
        out[i + d // 2] = vec[i + d // 2] * c + vec[i] * s
    return out


def naive_attention(qs, ks, vs, heads, kv_heads):
    """qs[t][h], ks[t][g], vs[t][g] are vectors; causal; returns the concatenated heads per t."""
    group = heads // kv_heads
    out = []
    for t in range(len(qs)):
        per_head = []
        for h in range(heads):
            g = h // group
            d = len(qs[t][h])
            scores = [sum(qs[t][h][i] * ks[s][g][i] for i in range(d)) / math.sqrt(d)
                      for s in range(t + 1)]
            top = max(scores)
            exps = [math.exp(x - top) for x in scores]
            total = sum(exps)
            per_head.append(sum(exps[s] / total * vs[s][g] for s in range(t + 1)))
        out.append(np.concatenate(per_head))
    return out


def naive_logits(config, w, tokens):
    heads, kv, d = config["num_attention_heads"], L.kv_heads_of(config), L.head_dim_of(config)
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    xs = [w["model.embed_tokens.weight"][t].copy() for t in tokens]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        qs, ks, vs = [], [], []
        for pos, x in enumerate(xs):
            n = naive_rms_norm(x, w[p + "input_layernorm.weight"], eps)
            q = w[p + "self_attn.q_proj.weight"] @ n
            k = w[p + "self_attn.k_proj.weight"] @ n
            v = w[p + "self_attn.v_proj.weight"] @ n
            qs.append([naive_rotary(q[h * d:(h + 1) * d], pos, theta) for h in range(heads)])
            ks.append([naive_rotary(k[g * d:(g + 1) * d], pos, theta) for g in range(kv)])
            vs.append([v[g * d:(g + 1) * d] for g in range(kv)])
        attended = naive_attention(qs, ks, vs, heads, kv)
        new = []
        for x, a in zip(xs, attended):
            h = x + w[p + "self_attn.o_proj.weight"] @ a
            n = naive_rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
            gate = w[p + "mlp.gate_proj.weight"] @ n
            act = np.array([g / (1 + math.exp(-g)) for g in gate])
            new.append(h + w[p + "mlp.down_proj.weight"] @ (act * (w[p + "mlp.up_proj.weight"] @ n)))
        xs = new
    head = w["model.embed_tokens.weight"] if config["tie_word_embeddings"] else w["lm_head.weight"]
    return np.array([head @ naive_rms_norm(x, w["model.norm.weight"], eps) for x in xs])


def tiny():
    """hidden 4, 1 layer, 1 head, vocab 5, with fixed, non-trivial weights."""
    config = L.config_dict(vocab_size=5, hidden_size=4, intermediate_size=6, num_hidden_layers=1,
                           num_attention_heads=1, num_key_value_heads=1)
    weights = {}
    for k, (name, shape) in enumerate(L.parameter_shapes(config).items()):
        values = np.sin(np.arange(1, int(np.prod(shape)) + 1) * 0.7 + k).reshape(shape)
        weights[name] = 1.0 + 0.2 * values if len(shape) == 1 else 0.5 * values
    return config, weights


PROMPT = [1, 17, 300, 42, 5, 99, 7]


class Pieces(unittest.TestCase):
    """The building blocks against hand-worked values and the naive loops."""

    def test_rms_norm_by_hand(self):
        x, w = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 0.5, 2.0, -1.0])
        # mean of squares (1 + 4 + 9 + 16) / 4 = 7.5
        r = math.sqrt(7.5 + 1e-5)
        want = [1 / r, 2 * 0.5 / r, 3 * 2 / r, -4 / r]
        np.testing.assert_allclose(L.rms_norm(x, w, 1e-5), want, rtol=0, atol=1e-15)
        rows = np.sin(np.arange(12.0)).reshape(3, 4)
        for row, got in zip(rows, L.rms_norm(rows, w, 1e-5)):
            np.testing.assert_allclose(got, naive_rms_norm(row, w, 1e-5), rtol=0, atol=1e-15)

    def test_rotary_by_hand(self):
        # d = 4, theta = 10000: inv_freq = [1, 10000^-0.5] = [1, 0.01].
        x = np.array([1.0, 2.0, 3.0, 4.0])
        cos, sin = L.rope_tables([0, 1], 4, 10000.0)
        got = L.apply_rotary(np.stack([x, x])[:, None, :], cos, sin)[:, 0, :]
        np.testing.assert_array_equal(got[0], x)  # position 0 is the identity
        c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)
        want = [1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2]
        np.testing.assert_allclose(got[1], want, rtol=0, atol=1e-15)
        # Against the loop over pairs, at larger positions and head_dim.
        v = np.cos(np.arange(16.0))
        cos, sin = L.rope_tables([0, 5, 1000, 2047], 16, 500000.0)
        got = L.apply_rotary(np.stack([v] * 4)[:, None, :], cos, sin)[:, 0, :]
        for row, pos in zip(got, [0, 5, 1000, 2047]):
            np.testing.assert_allclose(row, naive_rotary(v, pos, 500000.0), rtol=0, atol=1e-12)

    def test_attention_by_hand(self):
        # One head, d = 4, two positions: position 0 sees only itself, position 1 both.
        q = np.array([[1.0, 0, 0, 0], [0.5, -1.0, 2.0, 0]])[:, None, :]
        k = np.array([[2.0, 1.0, 0, 0], [0, 0, 1.0, 3.0]])[:, None, :]
        v = np.array([[1.0, 2.0, 3.0, 4.0], [-1.0, 0, 1.0, 0]])[:, None, :]
        got = L.attention(q, k, v)
        np.testing.assert_array_equal(got[0], v[0, 0])
        s0, s1 = (1.0 - 1.0) / 2, 2.0 / 2  # q1.k0 / sqrt(4), q1.k1 / sqrt(4)
        p0 = math.exp(s0) / (math.exp(s0) + math.exp(s1))
        np.testing.assert_allclose(got[1], p0 * v[0, 0] + (1 - p0) * v[1, 0], rtol=0, atol=1e-15)

    def test_attention_gqa_against_loops(self):
        rng = np.random.default_rng(3)
        T, H, KV, d = 5, 6, 2, 4
        q, k, v = rng.normal(size=(T, H, d)), rng.normal(size=(T, KV, d)), rng.normal(size=(T, KV, d))
        want = naive_attention(q, k, v, H, KV)
        np.testing.assert_allclose(L.attention(q, k, v), want, rtol=0, atol=1e-14)
        # The last 2 queries against all 5 keys (a decode step after a prefill).
        np.testing.assert_allclose(L.attention(q[3:], k, v), want[3:], rtol=0, atol=1e-14)

    def test_log_softmax(self):
        x = np.array([[1000.0, 1000.0, 0.0], [-3.0, 1.0, 2.0]])
        got = L.log_softmax(x)
        self.assertAlmostEqual(got[0, 0], -math.log(2), delta=1e-15)  # no overflow at 1000
        want = [v - math.log(sum(math.exp(u) for u in x[1])) for v in x[1]]
        np.testing.assert_allclose(got[1], want, rtol=0, atol=1e-15)


class Forward(unittest.TestCase):
    """The whole model against the naive implementation and against itself."""

    def test_tiny_against_loops(self):
        config, weights = tiny()
        tokens = [1, 4, 0, 2, 2, 3]
        got = L.Model(config, weights).logits(tokens)
        self.assertEqual(got.shape, (6, 5))
        np.testing.assert_allclose(got, naive_logits(config, weights, tokens), rtol=0, atol=1e-13)

    def test_default_gqa_against_loops(self):
        config = L.config_dict()  # 4 heads over 2 kv heads
        weights = L.init_weights(config, 11)
        got = L.Model(config, weights).logits(PROMPT)
        np.testing.assert_allclose(got, naive_logits(config, weights, PROMPT), rtol=0, atol=1e-12)

    def test_explicit_head_dim(self):
        config = L.config_dict(num_attention_heads=4, num_key_value_heads=1, head_dim=8)
        shapes = L.parameter_shapes(config)
        self.assertEqual(shapes["model.layers.0.self_attn.q_proj.weight"], (32, 64))
        self.assertEqual(shapes["model.layers.0.self_attn.o_proj.weight"], (64, 32))
        weights = L.init_weights(config, 5)
        got = L.Model(config, weights).logits(PROMPT[:4])
        np.testing.assert_allclose(got, naive_logits(config, weights, PROMPT[:4]), rtol=0, atol=1e-12)

    def test_mha_equals_gqa_with_duplicated_kv(self):
        # num_kv_heads == num_heads is plain multi-head attention: checked against the loops,
        # and shown to be GQA once each kv head's k/v rows are copied to every head it serves.
        mha_config = L.config_dict(num_key_value_heads=4)
        mha = L.init_weights(mha_config, 2)
        np.testing.assert_allclose(L.Model(mha_config, mha).logits(PROMPT),
                                   naive_logits(mha_config, mha, PROMPT), rtol=0, atol=1e-12)
        gqa_config = L.config_dict(num_key_value_heads=2)
        gqa = L.init_weights(gqa_config, 3)
        expanded = dict(gqa)
        for i in range(2):
            for proj in ("k_proj", "v_proj"):
                name = f"model.layers.{i}.self_attn.{proj}.weight"
                blocks = gqa[name].reshape(2, 16, 64)
                expanded[name] = np.repeat(blocks, 2, axis=0).reshape(64, 64)  # head h <- h // 2
        np.testing.assert_allclose(L.Model(mha_config, expanded).logits(PROMPT),
                                   L.Model(gqa_config, gqa).logits(PROMPT), rtol=0, atol=1e-12)

    def test_causality(self):
        model = L.Model(L.config_dict(), L.init_weights(L.config_dict(), 4))
        a = model.logits(PROMPT)
        changed = list(PROMPT)
        changed[4] = 123
        b = model.logits(changed)
        np.testing.assert_allclose(a[:4], b[:4], rtol=0, atol=1e-13)
        self.assertGreater(np.abs(a[4:] - b[4:]).min(axis=1).max(), 1e-6)  # not vacuous

    def test_tied_embeddings(self):
        tied = L.config_dict(tie_word_embeddings=True)
        self.assertNotIn("lm_head.weight", L.parameter_shapes(tied))
        weights = L.init_weights(tied, 6)
        untied = dict(weights)
        untied["lm_head.weight"] = weights["model.embed_tokens.weight"]
        want = L.Model(L.config_dict(), untied).logits(PROMPT)
        np.testing.assert_array_equal(L.Model(tied, weights).logits(PROMPT), want)
        other = dict(untied, **{"lm_head.weight": L.init_weights(L.config_dict(), 7)["lm_head.weight"]})
        self.assertGreater(np.abs(L.Model(L.config_dict(), other).logits(PROMPT) - want).max(), 1e-3)

    def test_kv_cache_equals_full_forward(self):
        config = L.config_dict()
        model = L.Model(config, L.init_weights(config, 8))
        tokens = PROMPT + list(range(200, 260))
        full = model.logits(tokens)
        for prefill in (1, 5, len(tokens)):
            diff = np.abs(model.incremental_logits(tokens, prefill) - full).max()
            self.assertLess(diff, 1e-12, f"prefill {prefill}")
        generated, logprobs = model.greedy(PROMPT, 40)
        full = model.logits(PROMPT + generated)
        self.assertEqual(generated, [int(t) for t in full[len(PROMPT) - 1:-1].argmax(axis=1)])
        self.assertLess(np.abs(logprobs - model.token_logprobs(PROMPT, generated)).max(), 1e-12)

    def test_token_logprobs(self):
        config, weights = tiny()
        model = L.Model(config, weights)
        prompt, completion = [1, 4], [0, 3, 3]
        got = model.token_logprobs(prompt, completion)
        for j, token in enumerate(completion):
            row = model.logits(prompt + completion[:j])[-1]
            want = row[token] - math.log(sum(math.exp(x) for x in row))
            self.assertAlmostEqual(got[j], want, delta=1e-13)

    def test_greedy_ties_take_the_lowest_id(self):
        config = L.config_dict()
        weights = L.init_weights(config, 9)
        weights["lm_head.weight"] = np.zeros((512, 64))  # every logit 0: all tie
        tokens, logprobs = L.Model(config, weights).greedy(PROMPT, 3)
        self.assertEqual(tokens, [0, 0, 0])
        np.testing.assert_allclose(logprobs, -math.log(512), rtol=0, atol=1e-13)
        # Two identical rows beat the zeros wherever their logit is positive: 9 over 300.
        weights["lm_head.weight"][[300, 9]] = weights["model.embed_tokens.weight"][3] * 10
        model = L.Model(config, weights)
        tokens, _ = model.greedy(PROMPT, 8)
        for t, row in zip(tokens, model.logits(PROMPT + tokens)[len(PROMPT) - 1:]):
            self.assertEqual(t, int(np.flatnonzero(row == row.max())[0]))
        self.assertIn(9, tokens)
        self.assertNotIn(300, tokens)

    def test_greedy_speed(self):
        config = L.config_dict()
        model = L.Model(config, L.init_weights(config, 0))
        start = time.perf_counter()
        tokens, logprobs = model.greedy(PROMPT, 128)
        elapsed = time.perf_counter() - start
        print(f"\n    greedy 128 tokens, default config: {elapsed:.3f} s", file=sys.stderr)
        self.assertEqual((len(tokens), logprobs.shape), (128, (128,)))
        self.assertLess(elapsed, 2.0)


class Bytes(unittest.TestCase):
    """float32 / bfloat16 rounding and the safetensors files."""

    def test_bfloat16_known_values(self):
        def f32_bits(x):
            return struct.unpack("<I", struct.pack("<f", x))[0]
        # The float32 patterns, by hand: 1 + 2^-8 sets mantissa bit 15, 1 + 2^-7 + 2^-8 bits 16, 15.
        self.assertEqual(f32_bits(1.0), 0x3F800000)
        self.assertEqual(f32_bits(1.00390625), 0x3F808000)  # lower half exactly 0x8000: a tie
        self.assertEqual(f32_bits(1.01171875), 0x3F818000)  # a tie with an odd upper half
        above = struct.unpack("<f", struct.pack("<I", 0x3F808001))[0]  # just above the tie
        cases = [(1.0, 0x3F80), (1.00390625, 0x3F80), (1.01171875, 0x3F82), (-1.01171875, 0xBF82),
                 (above, 0x3F81), (0.0, 0x0000), (-0.0, 0x8000), (float("inf"), 0x7F80),
                 (3.4028234663852886e38, 0x7F80),  # float32 max rounds up to inf, as in torch
                 (float("nan"), 0x7FC0)]
        values = np.array([v for v, _ in cases])
        self.assertEqual(list(L.bfloat16_bits(values)), [b for _, b in cases])
        self.assertEqual(L.tensor_bytes(values, "bfloat16"),
                         struct.pack(f"<{len(cases)}H", *[b for _, b in cases]))
        np.testing.assert_array_equal(L.round_to(np.array([1.00390625, 1.01171875, above]), "bfloat16"),
                                      [1.0, 1.015625, 1.0078125])

    def test_float32(self):
        x = np.array([[0.1, -2.5], [1e-40, 3.0]])
        self.assertEqual(L.tensor_bytes(x, "float32"), struct.pack("<4f", 0.1, -2.5, 1e-40, 3.0))
        self.assertEqual(L.round_to(x, "float32")[0, 0], struct.unpack("<f", struct.pack("<f", 0.1))[0])
        self.assertNotEqual(L.round_to(x, "float32")[0, 0], 0.1)
        # C order of the logical array, whatever the memory layout.
        self.assertEqual(L.tensor_bytes(x.T, "float32"), struct.pack("<4f", 0.1, 1e-40, -2.5, 3.0))

    def check_file(self, path):
        """The header's layout: padded to 8, offsets contiguous in header order, nothing after."""
        with open(path, "rb") as f:
            raw = f.read()
        (n,) = struct.unpack_from("<Q", raw)
        self.assertEqual(n % 8, 0)
        header = json.loads(raw[8:8 + n])
        self.assertEqual(header.pop("__metadata__"), {"format": "pt"})
        offset = 0
        for info in header.values():
            self.assertEqual(info["data_offsets"][0], offset)
            size = {"F32": 4, "BF16": 2}[info["dtype"]] * int(np.prod(info["shape"]))
            offset += size
            self.assertEqual(info["data_offsets"][1], offset)
        self.assertEqual(len(raw), 8 + n + offset)
        return list(header), offset

    def test_model_dir_round_trip(self):
        for tied in (False, True):
            config = L.config_dict(tie_word_embeddings=tied)
            weights = L.init_weights(config, 10)
            names = list(L.parameter_shapes(config))
            for dtype in ("float32", "bfloat16"):
                for shards in (1, 3):
                    with self.subTest(tied=tied, dtype=dtype, shards=shards), \
                            tempfile.TemporaryDirectory() as d:
                        L.write_model_dir(d, config, weights, dtype, shards)
                        with open(os.path.join(d, "config.json")) as f:
                            self.assertEqual(json.load(f), dict(config, torch_dtype=dtype))
                        if shards == 1:
                            files = ["model.safetensors"]
                            self.assertEqual(sorted(os.listdir(d)), ["config.json", "model.safetensors"])
                        else:
                            files = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
                            with open(os.path.join(d, "model.safetensors.index.json")) as f:
                                index = json.load(f)
                            self.assertEqual(sorted(os.listdir(d)), sorted(
                                files + ["config.json", "model.safetensors.index.json"]))
                        read, order, total = {}, [], 0
                        for file in files:
                            in_file, size = self.check_file(os.path.join(d, file))
                            order += in_file
                            total += size
                            part = L.read_safetensors(os.path.join(d, file))
                            self.assertEqual(list(part), in_file)
                            read.update(part)
                            if shards > 1:
                                self.assertTrue(all(index["weight_map"][n] == file for n in in_file))
                        if shards > 1:
                            self.assertEqual(index["metadata"]["total_size"], total)
                            self.assertEqual(list(index["weight_map"]), names)
                        self.assertEqual(order, names)
                        want = L.round_to(weights, dtype)
                        for name in names:
                            np.testing.assert_array_equal(read[name], want[name])
                        self.assertEqual(L.read_model_dir(d)[1].keys(), set(names))
                        # The model built from the files is the one built from round_to().
                        np.testing.assert_array_equal(L.Model(config, read).logits(PROMPT[:3]),
                                                      L.Model(config, want).logits(PROMPT[:3]))

    def test_bad_weights_are_refused(self):
        config = L.config_dict()
        weights = L.init_weights(config, 1)
        del weights["model.norm.weight"]
        self.assertRaises(ValueError, L.Model, config, weights)
        weights = L.init_weights(config, 1)
        weights["lm_head.weight"] = weights["lm_head.weight"][:, :10]
        with tempfile.TemporaryDirectory() as d:
            self.assertRaises(ValueError, L.write_model_dir, d, config, weights)


if __name__ == "__main__":
    unittest.main(verbosity=2)
