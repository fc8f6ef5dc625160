"""Neural-network ops on float32 activations.

CONTRACT (other modules rely on exactly this API; implementations may change):

- ``rms_norm(x (n, d), weight (d,) or None, eps) -> (n, d)``
- ``rope(x (n, n_heads, head_dim), positions int32 (n,), n_rot, base, neox, freq_scale=1.0)``
  rotates the first `n_rot` dims of each head in place and returns x.
  neox=False: pairs (2i, 2i+1) (llama); neox=True: pairs (i, i + n_rot/2) (qwen, gemma...).
- ``silu(x)``, ``gelu(x)`` (tanh approximation, as ggml), ``silu_mul(g, u) = silu(g)*u``,
  ``gelu_mul(g, u) = gelu(g)*u``, ``softmax(x, axis=-1)``.
- KV storage: see llmcore/cache. ``kv_store`` and ``attention`` work on block pools:
  ``k_pool``/``v_pool`` are arrays (n_blocks, block_size, n_kv_heads, head_dim) of float16
  (or uint8 quantized rows for q8_0/q4_0: (n_blocks, block_size, n_kv_heads, row_bytes)).
- ``kv_store(pool, kv_type, block_table int32 (n_blocks_seq,), positions int32 (n,), values float32 (n, n_kv_heads, head_dim))``
  writes (quantizing on write) token i to block block_table[pos // bs], slot pos % bs.
- ``attention(q (N, H, D), k_pool, v_pool, kv_type, block_tables int32 (S, max_blocks),
  seg_start int32 (S+1,), q_pos int32 (N,), scale, window=0, softcap=0.0, sinks=None)
  -> (N, H, D)``: rows seg_start[s]:seg_start[s+1] belong to sequence s; query i sees
  key positions j with j <= q_pos[i] and (window == 0 or q_pos[i] - j < window).
  GQA: head h uses kv head h // (H // n_kv_heads). sinks (H,): an extra logit per head
  that takes part in the softmax with no value (gpt-oss).
"""
from __future__ import annotations

import numpy as np

KV_F16, KV_Q8_0, KV_Q4_0, KV_F32 = "f16", "q8_0", "q4_0", "f32"


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight
    return y.astype(np.float32, copy=False)


def rope(x, positions, n_rot, base, neox, freq_scale=1.0):
    n, h, d = x.shape
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    ang = (np.asarray(positions, dtype=np.float64)[:, None] * freq_scale) * inv[None, :]
    cos = np.cos(ang).astype(np.float32)[:, None, :]
    sin = np.sin(ang).astype(np.float32)[:, None, :]
    if neox:
        half = n_rot // 2
        a = x[:, :, :half].copy()
        b = x[:, :, half:n_rot].copy()
        x[:, :, :half] = a * cos - b * sin
        x[:, :, half:n_rot] = a * sin + b * cos
    else:
        a = x[:, :, 0:n_rot:2].copy()
        b = x[:, :, 1:n_rot:2].copy()
        x[:, :, 0:n_rot:2] = a * cos - b * sin
        x[:, :, 1:n_rot:2] = a * sin + b * cos
    return x


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x * x * x)))


def silu_mul(g, u):
    return (silu(g) * u).astype(np.float32, copy=False)


def gelu_mul(g, u):
    return (gelu(g) * u).astype(np.float32, copy=False)


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def kv_store(pool, kv_type, block_table, positions, values):
    if kv_type not in (KV_F16, KV_F32):
        raise NotImplementedError(f"kv type {kv_type} in the NumPy path")
    bs = pool.shape[1]
    for i, p in enumerate(np.asarray(positions)):
        pool[block_table[p // bs], p % bs] = values[i]


def _gather(pool, kv_type, table, n):
    bs = pool.shape[1]
    nb = (n + bs - 1) // bs
    blocks = pool[np.maximum(table[:nb], 0)].astype(np.float32)
    return blocks.reshape(nb * bs, *pool.shape[2:])[:n]


def attention(q, k_pool, v_pool, kv_type, block_tables, seg_start, q_pos, scale,
              window=0, softcap=0.0, sinks=None):
    N, H, D = q.shape
    out = np.zeros((N, H, v_pool.shape[-1]), dtype=np.float32)
    n_kv_heads = k_pool.shape[2]
    group = H // n_kv_heads
    for s in range(len(seg_start) - 1):
        r0, r1 = seg_start[s], seg_start[s + 1]
        if r1 <= r0:
            continue
        n = int(np.max(q_pos[r0:r1])) + 1
        k = _gather(k_pool, kv_type, block_tables[s], n)  # (n, KVH, D)
        v = _gather(v_pool, kv_type, block_tables[s], n)
        j = np.arange(n)
        for i in range(r0, r1):
            p = q_pos[i]
            mask = j <= p
            if window:
                mask &= (p - j) < window
            for h in range(H):
                kh = h // group
                sc = (k[:, kh, :] @ q[i, h]) * scale
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                sc = np.where(mask, sc, -np.inf)
                m = sc.max()
                if sinks is not None:
                    m = max(m, sinks[h])
                e = np.exp(sc - m)
                z = e.sum() + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
                out[i, h] = (e / z) @ v[:, kh, :]
    return out
