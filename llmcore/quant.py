"""Quantized weights: dequantize, embedding rows, and prepared linear layers.

CONTRACT (other modules rely on exactly this API; implementations may change):

- ``dequantize(raw, ggml_type, shape) -> float32 ndarray of `shape```
  equals ``gguf.quants.dequantize`` bit for bit.
- ``get_rows(tensor, ids) -> float32 (len(ids), dim)``: embedding lookup.
- ``Linear(tensor, bias=None)``: y = x @ W.T (+ bias) for W with shape (out, in).
  ``__call__(x: float32 (n, in), out=None) -> float32 (n, out)``; ``in_features``,
  ``out_features``, ``nbytes`` (bytes of weights read per call).
- ``ExpertLinear(tensor)`` for 3-D expert weights (n_expert, out, in):
  ``__call__(x (n, in), expert: int, out=None) -> (n, out)``.

This file holds the plain NumPy implementation; the Cython kernels in pyx/ replace
the hot paths while keeping the API.
"""
from __future__ import annotations

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError:  # pragma: no cover - gguf is a hard dependency
    raise

FLOAT_TYPES = {QT.F32, QT.F16, QT.BF16}


def dequantize(raw: np.ndarray, ggml_type: int, shape) -> np.ndarray:
    """Dequantize raw GGUF storage to float32 with the given logical shape."""
    qt = QT(ggml_type)
    if qt == QT.F32:
        return np.asarray(raw).view(np.float32).reshape(shape).astype(np.float32, copy=True)
    if qt == QT.F16:
        return np.asarray(raw).view(np.float16).reshape(shape).astype(np.float32)
    out = gguf.quants.dequantize(np.asarray(raw).view(np.uint8), qt)
    return np.asarray(out, dtype=np.float32).reshape(shape)


def get_rows(tensor, ids) -> np.ndarray:
    """Rows `ids` of a 2-D tensor (n_rows, dim) as float32 (len(ids), dim)."""
    ids = np.asarray(ids, dtype=np.int64)
    raw = tensor.raw()
    return dequantize(raw[ids], tensor.ggml_type, (len(ids), tensor.shape[-1]))


class Linear:
    """y = x @ W.T (+ bias); W is a 2-D GGUF tensor (out, in)."""

    def __init__(self, tensor, bias: np.ndarray | None = None):
        if len(tensor.shape) != 2:
            raise ValueError(f"{tensor.name}: Linear needs a 2-D tensor, got {tensor.shape}")
        self.name = tensor.name
        self.out_features, self.in_features = tensor.shape
        self.ggml_type = tensor.ggml_type
        self.nbytes = tensor.nbytes
        self._w = tensor.dequantize()
        self.bias = None if bias is None else np.asarray(bias, dtype=np.float32)

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        y = np.asarray(x, dtype=np.float32) @ self._w.T
        if self.bias is not None:
            y += self.bias
        if out is not None:
            out[...] = y
            return out
        return y


class ExpertLinear:
    """Per-expert y = x @ W[e].T for a 3-D tensor (n_expert, out, in)."""

    def __init__(self, tensor):
        if len(tensor.shape) != 3:
            raise ValueError(f"{tensor.name}: ExpertLinear needs a 3-D tensor, got {tensor.shape}")
        self.name = tensor.name
        self.n_expert, self.out_features, self.in_features = tensor.shape
        self.ggml_type = tensor.ggml_type
        self.nbytes_per_expert = tensor.nbytes // self.n_expert
        self._w = tensor.dequantize()

    def __call__(self, x: np.ndarray, expert: int, out: np.ndarray | None = None) -> np.ndarray:
        y = np.asarray(x, dtype=np.float32) @ self._w[expert].T
        if out is not None:
            out[...] = y
            return out
        return y
