"""Quantized weights: dequantize, embedding rows, and prepared linear layers.

CONTRACT (other modules rely on exactly this API; implementations may change):

- ``dequantize(raw, ggml_type, shape) -> float32 ndarray of `shape```
  equals ``gguf.quants.dequantize`` bit for bit.
- ``get_rows(tensor, ids) -> float32 (len(ids), dim)``: embedding lookup.
- ``Linear(tensor, bias=None)``: y = x @ W.T (+ bias) for W with shape (out, in).
  ``__call__(x: float32 (n, in), out=None) -> float32 (n, out)``; ``in_features``,
  ``out_features``, ``nbytes`` (bytes of weights read per call).
  ``Linear.concat([a, b, c])`` -> one Linear whose output is the concatenation of the
  outputs of a, b, c (fused q/k/v or gate/up); returns None when they cannot be fused
  (different ggml types or in_features), so callers fall back to separate calls.
  ``split(y)`` on a fused Linear returns views of the parts.
- ``ExpertLinear(tensor)`` for 3-D expert weights (n_expert, out, in):
  ``__call__(x (n, in), expert: int, out=None) -> (n, out)``;
  ``grouped(x_sorted (n, in), expert_ids, offsets, out=None, rows=None) -> (n, out)``: rows
  ``offsets[i]:offsets[i+1]`` of x go through expert ``expert_ids[i]`` (one batched
  matmul per active expert; ``len(offsets) == len(expert_ids) + 1``); with ``rows`` (int64
  (n,)), row i is ``x[rows[i]]`` instead (x then holds each distinct row once: an MoE
  layer's tokens, which kernels that take a row map quantize once).

KERNEL MODULE INTERFACE (how pyx/ kernels plug in)
--------------------------------------------------
Each module named in ``WEIGHT_KERNELS`` (``llmcore._kernels.<name>``, built from
``pyx/<name>.pyx``: ``quants`` for float and legacy quants, ``kquants`` for K-quants and
MXFP4, ``iquants`` for IQ4_NL and IQ4_XS) provides exactly:

- ``SUPPORTED``: frozenset of the ggml type ids it handles; ``SIMD_LEVEL``: the kernel path
  this build uses, "avx512vnni", "avx2" or "c".
- ``pack(raw, ggml_type, repack=None, alloc=None) -> Packed``: ``raw`` uint8 (rows,
  bytes_per_row), C-contiguous GGUF blocks (a zero-copy view of the mapping: a layout that
  uses it in place keeps a reference); ``alloc(nbytes)`` -> writable 64-byte aligned uint8
  (nbytes,) is where a repacked layout's bytes go (None: a fresh array). ``Packed`` has int attributes ``ggml_type``, ``rows`` (= out_features),
  ``cols`` (= in_features), ``nbytes`` (bytes read by one matmul) and ``layout`` ("raw": the
  GGUF layout; "repacked16": 16-row groups interleaved). ``repack``: None for the module's
  choice, True or False to ask for one (False raises ValueError where no kernel reads the
  GGUF layout).
- ``matmul(packed, x, y, n_threads) -> None``: ``x`` float32 (n, cols), ``y`` float32
  (n, rows), both C-contiguous; y is overwritten with x @ W.T. One OpenMP parallel region,
  GIL released; results do not depend on n_threads.
- ``matmul_grouped(packs, offsets, x, y, n_threads) -> None`` (MoE): rows
  ``offsets[i]:offsets[i+1]`` of y = those rows of x @ packs[i].T; packs of one type and
  shape, offsets int64 (len(packs) + 1,) from 0 to n. One parallel region for all experts.
  A module may also have ``matmul_grouped_rows(packs, offsets, x, rows, y, n_threads)``:
  row i of the problem is x[rows[i]] (ExpertLinear.grouped gathers the rows itself for the
  others).
- optional, ``matmul_glu(packed, x, out, act_kind, n_threads) -> None`` (gated FFN, prefill):
  out float32 (n, rows / 2) = act(x @ gate.T) * (x @ up.T) for a weight whose rows are
  [gate; up]; act_kind 0 SiLU, 1 GELU; the bits of ``matmul`` then
  ``activations.act_rows``. llmcore.models.layers.GatedFFN uses it where a module has it.
- ``dequantize(raw, ggml_type, out, n_threads) -> None``: ``out`` float32 (rows, cols),
  equal to gguf.quants.dequantize bit for bit.
- ``get_rows(raw, ggml_type, ids, out, n_threads) -> None``: ``ids`` int64 (k,), ``out``
  float32 (k, cols): out[i] = dequantized row ids[i] (IndexError for an id out of range).

A type no module supports falls back to NumPy (dequantize at load, float32 matmul): correct
but slow. ``LLMCORE_NO_KERNELS=1`` forces that fallback for every type (tests, debugging).
"""
from __future__ import annotations

import os
import threading

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError:  # pragma: no cover - gguf is a hard dependency
    raise

from . import _kernels
from .hugepages import HUGE_PAGE, huge_page_mapping
from .threads import get_num_threads

# A parallel region costs a wake-up of the other threads: a few microseconds while they
# still spin (llmcore._kernels: the brief spin of the wait policy), a futex round trip once
# they sleep, far more when the machine is oversubscribed. A decode matmul that streams
# fewer bytes than this per thread runs on fewer threads.
MIN_BYTES_PER_THREAD = int(os.environ.get("LLMCORE_MIN_BYTES_PER_THREAD",
                                          str(64 * 1024 if _kernels.SPINNING else 512 * 1024)))


def _threads_for(n_rows: int, nbytes: int) -> int:
    nt = get_num_threads()
    if nt > 1 and n_rows < 4:
        nt = max(1, min(nt, nbytes // max(1, MIN_BYTES_PER_THREAD)))
    return nt

FLOAT_TYPES = {QT.F32, QT.F16, QT.BF16}


class WeightArena:
    """Where repacked weights live: large anonymous mappings backed by transparent huge pages,
    filled in load order.

    A decode step streams every weight once. Separately allocated tensors of a few hundred
    KB sit on 4 KB pages, scattered: a TLB miss every 4 KB and a hardware prefetcher that
    stops at each page end cost about a third of the read bandwidth. In one huge-page
    arena, consecutive layers' weights are consecutive memory. Chunks are never reused:
    a chunk lives while any weight packed into it does (each array keeps its mapping).
    """

    CHUNK = 64 << 20

    def __init__(self):
        self._lock = threading.Lock()
        self._chunk: np.ndarray | None = None
        self._used = 0

    def _new_chunk(self, nbytes: int) -> np.ndarray:
        return huge_page_mapping(max(self.CHUNK, -(-nbytes // HUGE_PAGE) * HUGE_PAGE))

    def alloc(self, nbytes: int) -> np.ndarray:
        """A writable uint8 (nbytes,) array on a 64-byte boundary."""
        nbytes = int(nbytes)
        if nbytes > self.CHUNK // 4:  # a big tensor gets a mapping of its own
            return self._new_chunk(nbytes)[:nbytes]
        with self._lock:
            if self._chunk is None or self._used + nbytes > self._chunk.shape[0]:
                self._chunk, self._used = self._new_chunk(nbytes), 0
            out = self._chunk[self._used:self._used + nbytes]
            self._used += -(-nbytes // 64) * 64
            return out


ARENA = WeightArena()

# kernel modules in llmcore._kernels implementing the interface above
WEIGHT_KERNELS = ("quants", "kquants", "iquants")
_module_of_type: dict[int, object] | None = None


def kernel_for(ggml_type: int):
    """The kernel module for a ggml type, or None (no kernel for it, or LLMCORE_NO_KERNELS=1:
    the NumPy fallback)."""
    global _module_of_type
    if not _kernels.ENABLED:
        return None
    if _module_of_type is None:
        _module_of_type = {int(t): m for m in map(_kernels.load, WEIGHT_KERNELS) for t in m.SUPPORTED}
    return _module_of_type.get(int(ggml_type))


def _c_uint8(raw) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(raw).view(np.uint8))


def _np_dequantize(raw: np.ndarray, ggml_type: int, shape) -> np.ndarray:
    qt = QT(ggml_type)
    if qt == QT.F32:
        return np.asarray(raw).view(np.float32).reshape(shape).astype(np.float32, copy=True)
    if qt == QT.F16:
        return np.asarray(raw).view(np.float16).reshape(shape).astype(np.float32)
    out = gguf.quants.dequantize(np.asarray(raw).view(np.uint8), qt)
    return np.asarray(out, dtype=np.float32).reshape(shape)


def dequantize(raw: np.ndarray, ggml_type: int, shape) -> np.ndarray:
    """Dequantize raw GGUF storage to float32 with the given logical shape."""
    shape = tuple(int(s) for s in shape)
    k = kernel_for(ggml_type)
    if k is not None:
        cols = shape[-1]
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        out = np.empty((rows, cols), dtype=np.float32)
        k.dequantize(_c_uint8(raw).reshape(rows, -1), int(ggml_type), out, get_num_threads())
        return out.reshape(shape)
    return _np_dequantize(raw, ggml_type, shape)


def get_rows(tensor, ids) -> np.ndarray:
    """Rows `ids` of a 2-D tensor (n_rows, dim) as float32 (len(ids), dim)."""
    ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
    raw = tensor.raw()
    n_rows = raw.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= n_rows):
        raise IndexError(f"{tensor.name}: row id out of range [0, {n_rows})")
    dim = tensor.shape[-1]
    k = kernel_for(tensor.ggml_type)
    if k is not None:
        out = np.empty((len(ids), dim), dtype=np.float32)
        k.get_rows(_c_uint8(raw).reshape(n_rows, -1), int(tensor.ggml_type), ids, out, get_num_threads())
        return out
    return _np_dequantize(raw[ids], tensor.ggml_type, (len(ids), dim))


class Linear:
    """y = x @ W.T (+ bias); W is a 2-D GGUF tensor (out, in)."""

    def __init__(self, tensor, bias: np.ndarray | None = None):
        if len(tensor.shape) != 2:
            raise ValueError(f"{tensor.name}: Linear needs a 2-D tensor, got {tensor.shape}")
        self._setup(tensor.name, tensor.raw(), tensor.ggml_type, tensor.shape, bias)

    def _setup(self, name, raw, ggml_type, shape, bias, parts=None):
        self.name = name
        self.out_features, self.in_features = (int(s) for s in shape)
        self.ggml_type = int(ggml_type)
        self.parts = parts or [self.out_features]
        self.bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32).reshape(-1)
        if self.bias is not None and self.bias.shape[0] != self.out_features:
            raise ValueError(f"{name}: bias has {self.bias.shape[0]} entries, expected {self.out_features}")
        self._kernel = kernel_for(ggml_type)
        self._packed = None
        self._w = None
        if self._kernel is not None:
            self._packed = self._kernel.pack(_c_uint8(raw).reshape(self.out_features, -1), self.ggml_type,
                                             alloc=ARENA.alloc)
            self.nbytes = int(self._packed.nbytes)
        else:
            self._w = _np_dequantize(raw, ggml_type, shape)
            self.nbytes = int(np.asarray(raw).nbytes)

    @classmethod
    def concat(cls, tensors, biases=None, name: str | None = None):
        """One Linear computing [W_a; W_b; ...] @ x, or None if the tensors can't be fused.

        `tensors` are GGUF tensors (or Linears built from them is not supported: pass tensors).
        """
        tensors = list(tensors)
        if not tensors or any(len(t.shape) != 2 for t in tensors):
            return None
        if len({int(t.ggml_type) for t in tensors}) != 1 or len({t.shape[1] for t in tensors}) != 1:
            return None
        raws = [t.raw() for t in tensors]
        if len({r.shape[1] for r in raws}) != 1:
            return None
        raw = np.concatenate(raws, axis=0)
        parts = [int(t.shape[0]) for t in tensors]
        bias = None
        if biases is not None and any(b is not None for b in biases):
            bias = np.concatenate(
                [np.zeros(p, np.float32) if b is None else np.asarray(b, np.float32).reshape(-1) for b, p in zip(biases, parts)]
            )
        self = cls.__new__(cls)
        self._setup(name or "+".join(t.name for t in tensors), raw, tensors[0].ggml_type,
                    (sum(parts), tensors[0].shape[1]), bias, parts)
        return self

    def split(self, y: np.ndarray) -> list[np.ndarray]:
        """Views of the fused output per part (along the last axis)."""
        out, start = [], 0
        for p in self.parts:
            out.append(y[..., start:start + p])
            start += p
        return out

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        squeeze = x.ndim == 1
        x2 = np.ascontiguousarray(x.reshape(-1, self.in_features))
        if x2.shape[1] != self.in_features:
            raise ValueError(f"{self.name}: expected in_features {self.in_features}, got {x.shape}")
        n = x2.shape[0]
        if self._packed is not None:
            direct = (out is not None and out.dtype == np.float32 and out.flags.c_contiguous
                      and out.size == n * self.out_features)
            y = out.reshape(n, self.out_features) if direct else np.empty((n, self.out_features), np.float32)
            self._kernel.matmul(self._packed, x2, y, _threads_for(n, self.nbytes))
        else:
            direct = False
            y = x2 @ self._w.T
        if self.bias is not None:
            y += self.bias
        if squeeze:
            y = y.reshape(self.out_features)
        if out is not None:
            if not direct:
                out[...] = y.reshape(out.shape)
            return out
        return y


class ExpertLinear:
    """Per-expert y = x @ W[e].T for a 3-D tensor (n_expert, out, in)."""

    def __init__(self, tensor):
        if len(tensor.shape) != 3:
            raise ValueError(f"{tensor.name}: ExpertLinear needs a 3-D tensor, got {tensor.shape}")
        self.name = tensor.name
        self.n_expert, self.out_features, self.in_features = tensor.shape
        self.ggml_type = int(tensor.ggml_type)
        self.nbytes_per_expert = tensor.nbytes // self.n_expert
        self._kernel = kernel_for(tensor.ggml_type)
        raw = tensor.raw()
        self._packed = None
        self._w = None
        if self._kernel is not None:
            self._packed = [self._kernel.pack(_c_uint8(raw[e]), self.ggml_type, alloc=ARENA.alloc)
                            for e in range(self.n_expert)]
            self.nbytes_per_expert = int(self._packed[0].nbytes)
        else:
            self._w = _np_dequantize(raw, tensor.ggml_type, tensor.shape)

    def __call__(self, x: np.ndarray, expert: int, out: np.ndarray | None = None) -> np.ndarray:
        x2 = np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1, self.in_features))
        n = x2.shape[0]
        direct = False
        if self._packed is not None:
            direct = (out is not None and out.dtype == np.float32 and out.flags.c_contiguous
                      and out.size == n * self.out_features)
            y = out.reshape(n, self.out_features) if direct else np.empty((n, self.out_features), np.float32)
            self._kernel.matmul(self._packed[int(expert)], x2, y, get_num_threads())
        else:
            y = x2 @ self._w[int(expert)].T
        if out is not None:
            if not direct:
                out[...] = y.reshape(out.shape)
            return out
        return y

    def grouped(self, x_sorted: np.ndarray, expert_ids, offsets, out: np.ndarray | None = None,
                rows=None) -> np.ndarray:
        """Rows offsets[i]:offsets[i+1] of x_sorted go through expert expert_ids[i]; with
        ``rows``, row i is x_sorted[rows[i]] (see the module docstring)."""
        x2 = np.ascontiguousarray(np.asarray(x_sorted, dtype=np.float32).reshape(-1, self.in_features))
        if rows is not None:
            rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
            offs = np.asarray(offsets, dtype=np.int64)
            if not (self._packed is not None and hasattr(self._kernel, "matmul_grouped_rows")
                    and len(expert_ids) and int(offs[0]) == 0 and int(offs[-1]) == rows.shape[0]):
                return self.grouped(x2[rows], expert_ids, offsets, out)
        n = x2.shape[0] if rows is None else rows.shape[0]
        y = out if out is not None else np.empty((n, self.out_features), np.float32)
        if self._packed is not None and len(expert_ids) and y.dtype == np.float32 and y.flags.c_contiguous:
            # one parallel region for all experts
            offs = np.asarray(offsets, dtype=np.int64)
            a, b = int(offs[0]), int(offs[-1])
            packs = [self._packed[int(e)] for e in expert_ids]
            if rows is not None:
                if b > a:
                    self._kernel.matmul_grouped_rows(packs, offs, x2, rows, y, get_num_threads())
            elif b > a:
                self._kernel.matmul_grouped(packs, np.ascontiguousarray(offs - a), x2[a:b], y[a:b], get_num_threads())
            return y
        if rows is not None:
            return self.grouped(x2[rows], expert_ids, offsets, out)
        offsets = [int(o) for o in offsets]
        for i, e in enumerate(expert_ids):
            a, b = offsets[i], offsets[i + 1]
            if b > a:
                self(x2[a:b], int(e), out=y[a:b])
        return y
