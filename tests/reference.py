"""Plain NumPy float32 reference forward of llama / qwen3 (the test oracle).

Independent of llmcore's kernels: weights dequantized with gguf.quants, full causal
attention over the whole sequence, no cache, rope written out here.

    reference_logits(path, tokens) -> float32 (len(tokens), n_vocab)
"""
from __future__ import annotations

import numpy as np

import gguf


def _read(path):
    r = gguf.GGUFReader(str(path))
    meta = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k.startswith("tokenizer."):
            continue
        try:
            meta[k] = f.contents()
        except Exception:
            pass
    w = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed([int(d) for d in t.shape]))
        qt = gguf.GGMLQuantizationType(int(t.tensor_type))
        if qt == gguf.GGMLQuantizationType.F32:
            a = np.asarray(t.data, dtype=np.float32)
        elif qt == gguf.GGMLQuantizationType.F16:
            a = np.asarray(t.data).astype(np.float32)
        else:
            a = gguf.quants.dequantize(np.asarray(t.data).view(np.uint8), qt).astype(np.float32)
        w[t.name] = a.reshape(shape)
    return meta, w


def _rms(x, wt, eps):
    x = x.astype(np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return (y * wt).astype(np.float32)


def _rope(x, pos, n_rot, base, neox):
    # x (n, h, d)
    x = x.astype(np.float64).copy()
    i = np.arange(n_rot // 2, dtype=np.float64)
    theta = pos[:, None].astype(np.float64) * base ** (-2.0 * i / n_rot)  # (n, n_rot/2)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = x[..., : n_rot // 2].copy(), x[..., n_rot // 2: n_rot].copy()
        x[..., : n_rot // 2] = a * c - b * s
        x[..., n_rot // 2: n_rot] = a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        x[..., 0:n_rot:2] = a * c - b * s
        x[..., 1:n_rot:2] = a * s + b * c
    return x.astype(np.float32)


class Reference:
    def __init__(self, path):
        self.meta, self.w = _read(path)
        m = self.meta
        a = self.arch = m["general.architecture"]
        if a not in ("llama", "qwen3"):
            raise NotImplementedError(a)
        self.n_layer = int(m[f"{a}.block_count"])
        self.n_embd = int(m[f"{a}.embedding_length"])
        self.n_head = int(m[f"{a}.attention.head_count"])
        self.n_head_kv = int(m.get(f"{a}.attention.head_count_kv", self.n_head))
        self.head_dim = int(m.get(f"{a}.attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(m.get(f"{a}.rope.dimension_count", self.head_dim))
        self.base = float(m.get(f"{a}.rope.freq_base", 10000.0))
        self.eps = float(m[f"{a}.attention.layer_norm_rms_epsilon"])
        self.neox = a == "qwen3"
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])

    def logits(self, tokens) -> np.ndarray:
        w = self.w
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        pos = np.arange(n)
        H, KVH, D = self.n_head, self.n_head_kv, self.head_dim
        x = w["token_embd.weight"][tokens].astype(np.float32)
        mask = np.tril(np.ones((n, n), dtype=bool))
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = _rms(x, w[p + "attn_norm.weight"], self.eps)
            q = (h @ w[p + "attn_q.weight"].T).reshape(n, H, D)
            k = (h @ w[p + "attn_k.weight"].T).reshape(n, KVH, D)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, KVH, D)
            if self.arch == "qwen3":
                q = _rms(q, w[p + "attn_q_norm.weight"], self.eps)
                k = _rms(k, w[p + "attn_k_norm.weight"], self.eps)
            q = _rope(q, pos, self.n_rot, self.base, self.neox)
            k = _rope(k, pos, self.n_rot, self.base, self.neox)
            rep = H // KVH
            k = np.repeat(k, rep, axis=1)
            v = np.repeat(v, rep, axis=1)
            sc = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(D)
            sc = np.where(mask[None], sc, -np.inf)
            sc = sc - sc.max(-1, keepdims=True)
            pr = np.exp(sc)
            pr /= pr.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", pr, v).reshape(n, H * D)
            x = x + o @ w[p + "attn_output.weight"].T
            h = _rms(x, w[p + "ffn_norm.weight"], self.eps)
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
        x = _rms(x, w["output_norm.weight"], self.eps)
        return (x @ self.out.T).astype(np.float32)


def reference_logits(path, tokens) -> np.ndarray:
    return Reference(path).logits(tokens)
