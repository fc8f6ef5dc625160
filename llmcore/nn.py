"""Neural-network ops on float32 activations.

CONTRACT (other modules rely on exactly this API; implementations may change):

- ``rms_norm(x (n, d), weight (d,) or None, eps, out=None) -> (n, d)``; any leading shape
  works (normalises over the last axis, e.g. q/k norms on (n, heads, head_dim)).
- ``add_rms_norm(x (n, d), add (n, d), weight, eps, out=None) -> (n, d)``: fused residual:
  ``x += add`` in place, then returns ``rms_norm(x)``.
- ``rope(x (n, n_heads, head_dim), positions int32 (n,), n_rot, base, neox, freq_scale=1.0,
  freq_factors=None)`` rotates the first `n_rot` dims of each head in place and returns x.
  neox=False: pairs (2i, 2i+1) (llama); neox=True: pairs (i, i + n_rot/2) (qwen, gemma...).
  Angle of pair i: pos * freq_scale * base^(-2i/n_rot) / freq_factors[i] (ggml, llama3
  ``rope_freqs``).
- ``silu(x)``, ``gelu(x)`` (tanh approximation, as ggml), ``silu_mul(g, u) = silu(g)*u``,
  ``gelu_mul(g, u) = gelu(g)*u``, ``softmax(x, axis=-1)``.
- KV storage: see llmcore/cache. ``kv_store`` and ``attention`` work on block pools:
  ``k_pool``/``v_pool`` are arrays (n_blocks, block_size, n_kv_heads, head_dim) of float16
  (float32 for "f32", or uint8 quantized rows for q8_0/q4_0: (n_blocks, block_size,
  n_kv_heads, row_bytes) holding ggml Q8_0/Q4_0 blocks of 32, byte-identical to ggml).
  ``kv_row_bytes(kv_type, head_dim)``: bytes of one (token, kv head) row.
  ``make_kv_pool(kv_type, n_blocks, block_size, n_kv_heads, head_dim, k_tiles=False)``: a
  zeroed pool (the older order ``(n_blocks, block_size, n_kv_heads, head_dim, kv_type)`` is
  accepted); ``k_tiles``: a q4_0 K pool of 16-key tiles, (n_blocks, block_size // 16,
  n_kv_heads, 16, row_bytes), the rows' bytes in the decode scores kernel's layout
  (pyx/simd_kv_rows.h). Every function below takes either layout (``pool_tiled(pool)``).
  ``kv_load(pool, kv_type, block_table, n) -> (n, n_kv_heads, head_dim) float32``: the first
  n tokens of a sequence, dequantized (blocks with id -1 read as zeros).
- ``kv_store(pool, kv_type, block_table int32 (n_blocks_seq,), positions int32 (n,), values float32 (n, n_kv_heads, head_dim))``
  writes (quantizing on write) token i to block block_table[pos // bs], slot pos % bs.
  Batched form: ``kv_store(pool, kv_type, block_tables (S, max_blocks), positions, values,
  seg_start=(S+1,))`` stores rows seg_start[s]:seg_start[s+1] with table s.
- ``attention(q (N, H, D), k_pool, v_pool, kv_type, block_tables int32 (S, max_blocks),
  seg_start int32 (S+1,), q_pos int32 (N,), scale, window=0, softcap=0.0, sinks=None,
  out=None, decode_seqs=None) -> (N, H, Dv)``: rows seg_start[s]:seg_start[s+1] belong to sequence s; query
  i sees key positions j with j <= q_pos[i] and (window == 0 or q_pos[i] - j < window).
  GQA: head h uses kv head h // (H // n_kv_heads). sinks (H,): an extra logit per head
  that takes part in the softmax with no value (gpt-oss). softcap > 0: scores become
  softcap * tanh(score / softcap) (after scaling). Block-table entries of -1 (freed
  blocks) are never read; a query that sees no key gets zeros. With an f16 cache q is
  rounded to f16 before the K.Q products (llama.cpp's K.Q takes q as f16, with flash
  attention on or off); everything else is f32 (an online softmax over the KV blocks: sums
  in another order than llama.cpp's, agreement within float rounding). decode_seqs uint8
  (S,): the sequences marked get, token by token, the bits a one-token decode gets (the
  decode kernel, whatever their row count: speculative decoding's verify segments).

Kernels: pyx/norms.pyx, rope.pyx, activations.pyx, kv_rows.pyx and attention.pyx (built into
llmcore._kernels). With LLMCORE_NO_KERNELS=1 the NumPy reference versions (``_ref_*``, also
the test oracle) run instead.
"""
from __future__ import annotations

import functools

import numpy as np


from . import _kernels
from .threads import get_num_threads

# The kernels of pyx/ (one module per family), or the NumPy references at the end of this
# file when LLMCORE_NO_KERNELS=1 (_kernels.ENABLED; tests flip it to compare the two).
if _kernels.ENABLED:
    _norms = _kernels.load("norms")
    _rope = _kernels.load("rope")
    _activations = _kernels.load("activations")
    _kv_rows = _kernels.load("kv_rows")
    _attention = _kernels.load("attention")

KV_F16, KV_Q8_0, KV_Q4_0, KV_F32 = "f16", "q8_0", "q4_0", "f32"
KV_TYPES = (KV_F16, KV_Q8_0, KV_Q4_0, KV_F32)
# storage type codes of the kernels (pyx/kv_rows.pxd)
_KV_CODE = ({KV_F32: _kv_rows.F32, KV_F16: _kv_rows.F16, KV_Q8_0: _kv_rows.Q8_0, KV_Q4_0: _kv_rows.Q4_0}
            if _kernels.ENABLED else {})
_QBLOCK = {KV_Q8_0: 34, KV_Q4_0: 18}  # bytes per 32 values


# ---- KV pool formats -----------------------------------------------------------------------

def kv_row_bytes(kv_type: str, head_dim: int) -> int:
    """Bytes of one (token, kv head) row of `head_dim` values stored as `kv_type`."""
    if kv_type == KV_F16:
        return 2 * head_dim
    if kv_type == KV_F32:
        return 4 * head_dim
    if kv_type in _QBLOCK:
        if head_dim % 32:
            raise ValueError(f"kv type {kv_type} needs head_dim % 32 == 0, got {head_dim}")
        return head_dim // 32 * _QBLOCK[kv_type]
    raise ValueError(f"unknown kv type {kv_type!r} (expected one of {', '.join(KV_TYPES)})")


def k_tiles_ok(kv_type: str, block_size: int, head_dim: int) -> bool:
    """Whether a K pool of this format is stored in 16-key tiles when asked (make_kv_pool)."""
    return kv_type == KV_Q4_0 and block_size % 16 == 0 and head_dim % 32 == 0 and head_dim <= 1024


def make_kv_pool(kv_type, n_blocks, block_size, n_kv_heads, head_dim, *, k_tiles: bool = False) -> np.ndarray:
    """A zeroed pool: (n_blocks, block_size, n_kv_heads, head_dim) float16/float32 for f16/f32,
    or (n_blocks, block_size, n_kv_heads, row_bytes) uint8 for q8_0/q4_0. The older order
    (n_blocks, block_size, n_kv_heads, head_dim, kv_type) is accepted too.

    k_tiles: a K pool in the scores kernel's layout where the format allows it (k_tiles_ok:
    Q4_0, block_size % 16 == 0): (n_blocks, block_size // 16, n_kv_heads, 16, row_bytes), each
    (16 slots, kv head) a tile of the rows' bytes rearranged (pyx/simd_kv_rows.h). Every
    function here takes either layout and knows it from the array's 5 axes."""
    if not isinstance(kv_type, str) and isinstance(head_dim, str):
        kv_type, n_blocks, block_size, n_kv_heads, head_dim = head_dim, kv_type, n_blocks, block_size, n_kv_heads
    row = kv_row_bytes(kv_type, head_dim)
    if k_tiles and k_tiles_ok(kv_type, block_size, head_dim):
        return np.zeros((n_blocks, block_size // 16, n_kv_heads, 16, row), dtype=np.uint8)
    if kv_type == KV_F16:
        return np.zeros((n_blocks, block_size, n_kv_heads, head_dim), dtype=np.float16)
    if kv_type == KV_F32:
        return np.zeros((n_blocks, block_size, n_kv_heads, head_dim), dtype=np.float32)
    return np.zeros((n_blocks, block_size, n_kv_heads, row), dtype=np.uint8)


def _pool_head_dim(pool: np.ndarray, kv_type: str) -> int:
    if kv_type in _QBLOCK:
        return pool.shape[-1] // _QBLOCK[kv_type] * 32
    return pool.shape[-1]


def pool_tiled(pool: np.ndarray) -> bool:
    """A K pool of 16-key tiles (make_kv_pool(k_tiles=True))."""
    return pool.ndim == 5


def pool_block_size(pool: np.ndarray) -> int:
    return pool.shape[1] * 16 if pool.ndim == 5 else pool.shape[1]


def _check_pool(pool: np.ndarray, kv_type: str) -> None:
    want = {KV_F16: np.float16, KV_F32: np.float32}.get(kv_type, np.uint8)
    if kv_type not in KV_TYPES:
        raise ValueError(f"unknown kv type {kv_type!r}")
    if pool.ndim == 5:
        if pool.shape[3] != 16 or pool.dtype != want or not k_tiles_ok(kv_type, 16 * pool.shape[1],
                                                                      _pool_head_dim(pool, kv_type)):
            raise ValueError(f"a tiled K pool is q4_0 (n_blocks, block_size // 16, n_kv_heads, 16, row), "
                             f"got {kv_type} {pool.dtype} {pool.shape}")
    elif pool.dtype != want or pool.ndim != 4:
        raise ValueError(f"{kv_type} pool must be a 4-d {np.dtype(want).name} array, got {pool.dtype} {pool.shape}")
    if not pool.flags.c_contiguous:
        raise ValueError("KV pool must be C-contiguous")


def _pool_bytes(pool: np.ndarray) -> np.ndarray:
    """(n_blocks, bytes per block) uint8 view, no copy."""
    per_block = int(np.prod(pool.shape[1:], dtype=np.int64)) * pool.itemsize
    return pool.reshape(-1).view(np.uint8).reshape(pool.shape[0], per_block)


def _i32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int32)


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


# ---- norms, rope, activations ----------------------------------------------------------------

def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    if not _kernels.ENABLED:
        y = _ref_rms_norm(x, weight, eps)
        if out is not None:
            out[...] = y
            return out
        return y
    x = np.asarray(x, dtype=np.float32)
    shape, d = x.shape, x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.strides[-1] != 4 or not x2.flags.writeable:
        x2 = np.ascontiguousarray(x2) if x2.flags.writeable else np.array(x2, order="C")
    o2 = np.empty(x2.shape, dtype=np.float32) if out is None else out.reshape(-1, d)
    w = None if weight is None else _f32(weight)
    _norms.rms_norm(x2, w, float(eps), o2, None, get_num_threads())
    return o2.reshape(shape) if out is None else out


def add_rms_norm(x: np.ndarray, add: np.ndarray, weight: np.ndarray | None, eps: float,
                 out: np.ndarray | None = None) -> np.ndarray:
    """x += add (in place, x must be a writable float32 (n, d) array), return rms_norm(x)."""
    if not _kernels.ENABLED or x.dtype != np.float32 or x.ndim != 2 or x.strides[-1] != 4:
        x += add
        return rms_norm(x, weight, eps, out)
    a = _f32(add).reshape(x.shape)
    o = np.empty(x.shape, dtype=np.float32) if out is None else out
    w = None if weight is None else _f32(weight)
    _norms.rms_norm(x, w, float(eps), o, a, get_num_threads())
    return o


def rope(x, positions, n_rot, base, neox, freq_scale=1.0, freq_factors=None):
    if not _kernels.ENABLED:
        return _ref_rope(x, positions, n_rot, base, neox, freq_scale, freq_factors)
    pos = _i32(positions)
    ff = None if freq_factors is None else _f32(freq_factors)
    if n_rot > x.shape[-1] or n_rot % 2:
        raise ValueError(f"n_rot={n_rot} must be even and <= head_dim={x.shape[-1]}")
    if x.dtype == np.float32 and x.ndim == 3 and x.strides[-1] == 4 and x.flags.writeable:
        _rope.rope(x, pos, int(n_rot), float(base), bool(neox), float(freq_scale), ff, get_num_threads())
        return x
    tmp = np.ascontiguousarray(x, dtype=np.float32).reshape(x.shape[0], -1, x.shape[-1])
    _rope.rope(tmp, pos, int(n_rot), float(base), bool(neox), float(freq_scale), ff, get_num_threads())
    x[...] = tmp.reshape(x.shape)
    return x


def _act(kind, g, u):
    g = np.asarray(g, dtype=np.float32)
    if (g.ndim == 2 and g.strides[1] == 4 and g.shape[1] and u is not None and isinstance(u, np.ndarray)
            and u.dtype == np.float32 and u.shape == g.shape and u.strides[1] == 4):
        out = np.empty(g.shape, dtype=np.float32)  # strided rows (fused gate/up slices): no copies
        _activations.act_rows(kind, g, u, out, get_num_threads())
        return out
    gf = np.ascontiguousarray(g).reshape(-1)
    uf = None
    if u is not None:
        u = np.asarray(u, dtype=np.float32)
        if u.shape != g.shape:
            u = np.broadcast_to(u, g.shape)
        uf = np.ascontiguousarray(u).reshape(-1)
    out = np.empty(g.shape, dtype=np.float32)
    _activations.act(kind, gf, uf, out.reshape(-1), get_num_threads())
    return out


def silu(x):
    return _act(0, x, None) if _kernels.ENABLED else _ref_silu(x)


def gelu(x):
    return _act(1, x, None) if _kernels.ENABLED else _ref_gelu(x)


def silu_mul(g, u):
    return _act(0, g, u) if _kernels.ENABLED else _ref_silu_mul(g, u)


def gelu_mul(g, u):
    return _act(1, g, u) if _kernels.ENABLED else _ref_gelu_mul(g, u)


def softmax(x, axis=-1):
    x = np.asarray(x)
    if not _kernels.ENABLED or x.ndim == 0 or axis not in (-1, x.ndim - 1) or x.dtype != np.float32:
        return _ref_softmax(x, axis)
    x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    out = np.empty(x2.shape, dtype=np.float32)
    _activations.softmax_rows(x2, out, get_num_threads())
    return out.reshape(x.shape)


# ---- KV store / load / attention -------------------------------------------------------------

def kv_store(pool, kv_type, block_table, positions, values, seg_start=None):
    """Write values (n, n_kv_heads, head_dim) at `positions` of one sequence (block_table
    1-d), or of several at once: block_table (S, max_blocks) with seg_start (S+1,) giving
    each sequence's rows (one call per layer instead of one per sequence)."""
    _check_pool(pool, kv_type)
    values = _f32(values)
    if values.ndim != 3 or values.shape[1] != pool.shape[2] or values.shape[2] != _pool_head_dim(pool, kv_type):
        raise ValueError(f"values {values.shape} do not fit pool {pool.shape} ({kv_type})")
    tables = _i32(block_table)
    if seg_start is None:
        if tables.ndim != 1:
            raise ValueError("kv_store: a 2-d block table needs seg_start")
        tables = tables.reshape(1, -1)
        seg = np.array([0, values.shape[0]], dtype=np.int32)
    else:
        seg = _i32(seg_start)
        if tables.ndim != 2 or len(seg) != tables.shape[0] + 1 or seg[0] != 0 or seg[-1] != values.shape[0]:
            raise ValueError("kv_store: seg_start must run from 0 to n with one entry per table + 1")
    if not _kernels.ENABLED:
        for s in range(tables.shape[0]):
            r0, r1 = seg[s], seg[s + 1]
            _ref_kv_store(pool, kv_type, tables[s], np.asarray(positions)[r0:r1], values[r0:r1])
        return
    code = _kv_rows.Q4_0_TILES if pool_tiled(pool) else _KV_CODE[kv_type]
    bad = _kv_rows.kv_store(_pool_bytes(pool), code, pool_block_size(pool), pool.shape[2],
                      kv_row_bytes(kv_type, values.shape[2]), tables, seg, _i32(positions),
                      values, get_num_threads())
    if bad:
        raise ValueError(f"kv_store: {bad} positions map to no block (block table too short or id < 0)")


def kv_load(pool, kv_type, block_table, n) -> np.ndarray:
    _check_pool(pool, kv_type)
    table = _i32(block_table)
    bs = pool_block_size(pool)
    if n > len(table) * bs:
        raise ValueError(f"kv_load: {n} tokens but the table covers {len(table) * bs}")
    if not _kernels.ENABLED:
        return _ref_kv_load(pool, kv_type, table, n)
    hd = _pool_head_dim(pool, kv_type)
    out = np.empty((n, pool.shape[2], hd), dtype=np.float32)
    if (table[: (n + bs - 1) // bs] >= pool.shape[0]).any():
        raise ValueError("kv_load: block id out of range")
    code = _kv_rows.Q4_0_TILES if pool_tiled(pool) else _KV_CODE[kv_type]
    _kv_rows.kv_load(_pool_bytes(pool), code, bs, pool.shape[2], kv_row_bytes(kv_type, hd), table, out)
    return out


def attention(q, k_pool, v_pool, kv_type, block_tables, seg_start, q_pos, scale,
              window=0, softcap=0.0, sinks=None, out=None, decode_seqs=None):
    if not _kernels.ENABLED:
        return _ref_attention(q, k_pool, v_pool, kv_type, block_tables, seg_start, q_pos, scale,
                              window, softcap, sinks)
    _check_pool(k_pool, kv_type)
    _check_pool(v_pool, kv_type)
    q = _f32(q)
    N, H, D = q.shape
    bs, kvh = pool_block_size(k_pool), k_pool.shape[2]
    if (pool_block_size(v_pool), v_pool.shape[2]) != (bs, kvh) or v_pool.shape[0] != k_pool.shape[0]:
        raise ValueError(f"k_pool {k_pool.shape} and v_pool {v_pool.shape} disagree")
    if H % kvh:
        raise ValueError(f"n_heads {H} is not a multiple of n_kv_heads {kvh}")
    if _pool_head_dim(k_pool, kv_type) != D:
        raise ValueError(f"q head_dim {D} != k pool head_dim {_pool_head_dim(k_pool, kv_type)}")
    Dv = _pool_head_dim(v_pool, kv_type)
    tables = _i32(block_tables)
    if tables.ndim == 1:
        tables = tables.reshape(1, -1)
    seg = _i32(seg_start)
    pos = _i32(q_pos)
    if len(seg) != tables.shape[0] + 1 or len(pos) != N:
        raise ValueError("seg_start must be non-decreasing from 0 to N with one entry per block table + 1")
    # the kernel checks seg_start order, q_pos range and block ids
    sk = None if sinks is None else _f32(sinks)
    if sk is not None and sk.shape != (H,):
        raise ValueError(f"sinks must have shape ({H},)")
    o = np.empty((N, H, Dv), dtype=np.float32) if out is None else out
    _attention.attention(q, _pool_bytes(k_pool), _pool_bytes(v_pool), _KV_CODE[kv_type], bs, kvh,
                 kv_row_bytes(kv_type, D), kv_row_bytes(kv_type, Dv), Dv, tables, seg, pos,
                 float(scale), int(window or 0), float(softcap or 0.0), sk, o, get_num_threads(),
                 None if decode_seqs is None else np.ascontiguousarray(decode_seqs, dtype=np.uint8),
                 pool_tiled(k_pool))
    return o


# ---- NumPy reference implementations (fallback and test oracle) ------------------------------

def _ref_rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight
    return y.astype(np.float32, copy=False)


def _ref_rope(x, positions, n_rot, base, neox, freq_scale=1.0, freq_factors=None):
    n, h, d = x.shape
    inv = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    if freq_factors is not None:
        inv = inv / np.asarray(freq_factors, dtype=np.float64)
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


def _ref_silu(x):
    return x / (1.0 + np.exp(-x))


def _ref_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x * x * x)))


def _ref_silu_mul(g, u):
    return (_ref_silu(g) * u).astype(np.float32, copy=False)


def _ref_gelu_mul(g, u):
    return (_ref_gelu(g) * u).astype(np.float32, copy=False)


def _ref_softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def _ref_quantize_rows(values: np.ndarray, kv_type: str) -> np.ndarray:
    """(..., head_dim) float32 -> (..., row_bytes) in the pool's dtype."""
    if kv_type == KV_F16:
        return values.astype(np.float16)
    if kv_type == KV_F32:
        return values.astype(np.float32)
    from gguf import GGMLQuantizationType, quants

    qt = GGMLQuantizationType.Q8_0 if kv_type == KV_Q8_0 else GGMLQuantizationType.Q4_0
    return quants.quantize(np.ascontiguousarray(values, dtype=np.float32), qt)


def _ref_dequantize_rows(rows: np.ndarray, kv_type: str) -> np.ndarray:
    if kv_type in (KV_F16, KV_F32):
        return rows.astype(np.float32)
    from gguf import GGMLQuantizationType, quants

    qt = GGMLQuantizationType.Q8_0 if kv_type == KV_Q8_0 else GGMLQuantizationType.Q4_0
    return quants.dequantize(rows, qt).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _ref_tile_perm(row: int) -> np.ndarray:
    """Byte i of a Q4_0 K tile (16 slots of `row` bytes) is byte perm[i] of the 16 rows
    (slot u's byte c at u * row + c): pyx/simd_kv_rows.h's layout."""
    nb = row // 18
    perm = []
    for b in range(nb):
        perm += [u * row + 18 * b + e for u in range(16) for e in range(2)]
    for p in range((nb + 1) // 2):
        nd = 8 if 2 * p + 1 < nb else 4
        perm += [u * row + 18 * (2 * p + d // 4) + 2 + 4 * (d % 4) + e
                 for d in range(nd) for u in range(16) for e in range(4)]
    return np.asarray(perm, dtype=np.int64)


def _ref_rows_from_tiles(tiles: np.ndarray) -> np.ndarray:
    """(N, G, KVH, 16, row) tiles -> (N, 16 G, KVH, row) rows."""
    N, G, KVH, _, row = tiles.shape
    flat = np.empty((N, G, KVH, 16 * row), np.uint8)
    flat[..., _ref_tile_perm(row)] = tiles.reshape(N, G, KVH, 16 * row)
    return flat.reshape(N, G, KVH, 16, row).transpose(0, 1, 3, 2, 4).reshape(N, 16 * G, KVH, row)


def _ref_tiles_from_rows(rows: np.ndarray) -> np.ndarray:
    N, bs, KVH, row = rows.shape
    t = rows.reshape(N, bs // 16, 16, KVH, row).transpose(0, 1, 3, 2, 4).reshape(N, bs // 16, KVH, 16 * row)
    return t[..., _ref_tile_perm(row)].reshape(N, bs // 16, KVH, 16, row)


def _ref_kv_store(pool, kv_type, block_table, positions, values):
    if pool_tiled(pool):  # the touched blocks as rows, written, tiled back
        bs = pool_block_size(pool)
        ids = np.unique(np.asarray(block_table)[np.asarray(positions) // bs])
        rows = _ref_rows_from_tiles(pool[ids])
        local = np.zeros(int(ids.max()) + 1, np.int32)
        local[ids] = np.arange(len(ids), dtype=np.int32)
        _ref_kv_store(rows, kv_type, local[np.asarray(block_table).clip(0, ids.max())], positions, values)
        pool[ids] = _ref_tiles_from_rows(rows)
        return
    bs = pool.shape[1]
    rows = _ref_quantize_rows(np.asarray(values, dtype=np.float32), kv_type)
    for i, p in enumerate(np.asarray(positions)):
        pool[block_table[p // bs], p % bs] = rows[i]


def _ref_kv_load(pool, kv_type, table, n):
    bs = pool_block_size(pool)
    nb = (n + bs - 1) // bs
    t = np.asarray(table[:nb])
    sel = pool[np.maximum(t, 0)]
    blocks = _ref_dequantize_rows(_ref_rows_from_tiles(sel) if pool_tiled(pool) else sel, kv_type)
    blocks[t < 0] = 0.0
    return blocks.reshape(nb * bs, *blocks.shape[2:])[:n]


def _ref_q8_round(x: np.ndarray) -> np.ndarray:
    """x (..., D), D % 32 == 0, rounded to 8 bits a 32-value block: rint(x / d) * d with
    d = max|x| / 127 (f32 scale)."""
    b = np.asarray(x, np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    v = np.clip(np.rint(b * inv), -127, 127)
    return (v * d).astype(np.float32).reshape(x.shape)


def _ref_attention(q, k_pool, v_pool, kv_type, block_tables, seg_start, q_pos, scale,
                   window=0, softcap=0.0, sinks=None):
    N, H, D = q.shape
    Dv = _pool_head_dim(v_pool, kv_type)
    out = np.zeros((N, H, Dv), dtype=np.float32)
    n_kv_heads = k_pool.shape[2]
    group = H // n_kv_heads
    for s in range(len(seg_start) - 1):
        r0, r1 = seg_start[s], seg_start[s + 1]
        if r1 <= r0:
            continue
        n = int(np.max(q_pos[r0:r1])) + 1
        k = _ref_kv_load(k_pool, kv_type, block_tables[s], n)  # (n, KVH, D)
        v = _ref_kv_load(v_pool, kv_type, block_tables[s], n)
        j = np.arange(n)
        # F16 cache: q rounded to f16 for the K.Q products (as llama.cpp takes it, with or
        # without flash attention); probabilities in f32
        # Q8_0 / Q4_0 cache: q rounded to 8 bits a 32-value block (d = max|q| / 127), as
        # llama.cpp takes Q for a quantized K (the kernel's scores are then integer dots)
        # (the kernel rounds q * scale * log2(e): the same integers here, or a tie may round
        # the other way)
        qs = np.float32(np.float32(scale) * np.float32(1.4426950408889634))
        r16 = (lambda a: a.astype(np.float16).astype(np.float32)) if kv_type == KV_F16 else \
            (lambda a: _ref_q8_round(a * qs) / qs) if kv_type in (KV_Q8_0, KV_Q4_0) else (lambda a: a)
        for i in range(r0, r1):
            p = q_pos[i]
            mask = j <= p
            if window:
                mask &= (p - j) < window
            for h in range(H):
                kh = h // group
                sc = (k[:, kh, :] @ r16(q[i, h])) * np.float32(scale)
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                sc = np.where(mask, sc, -np.inf)
                m = sc.max()
                if sinks is not None:
                    m = max(m, sinks[h])
                if m == -np.inf:
                    continue
                e = np.exp(sc - m)
                z = e.sum() + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
                out[i, h] = (e * np.float32(1.0 / z)).astype(np.float32) @ v[:, kh, :]
    return out
