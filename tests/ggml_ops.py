"""llama.cpp's own quantizer and matmuls, called in its ggml library (the one inside
llama-cpp-python) through ctypes: the reference for bit-exact kernel tests and the peer in
kernel benchmarks.

    quantize(x, ggml_type) -> uint8 (rows, bytes)     ggml_quantize_chunk (no imatrix)
    mul_mat(raw, ggml_type, x) -> float32 (n, rows)   y = x @ W.T as a ggml graph on the CPU
    mul_mat_id(raws, ggml_type, x, ids) -> float32 (n, top, rows)   MoE: y[t, j] = x[t] @ W[ids[t, j]].T
    MulMat(raw, ggml_type, n, n_threads)              a prepared graph for timing: set_x, run, y

A graph computes as llama.cpp would for one matmul: the activations are quantized to the
weight type's vec_dot type, and the multi-token path (llamafile's tinyBLAS where it has the
type) is the one llama.cpp takes. ``available()`` says why not where llama-cpp-python is
missing.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

import gguf

GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26
_vp = ctypes.c_void_p
_lib = None


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _load():
    global _lib
    if _lib is not None:
        return _lib
    import llama_cpp

    d = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(d, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(d, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    sigs = {
        (base, "ggml_init"): (_vp, [_InitParams]),
        (base, "ggml_free"): (None, [_vp]),
        (base, "ggml_new_tensor_2d"): (_vp, [_vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
        (base, "ggml_new_tensor_3d"): (_vp, [_vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]),
        (base, "ggml_mul_mat"): (_vp, [_vp, _vp, _vp]),
        (base, "ggml_mul_mat_id"): (_vp, [_vp, _vp, _vp, _vp]),
        (base, "ggml_new_graph"): (_vp, [_vp]),
        (base, "ggml_build_forward_expand"): (None, [_vp, _vp]),
        (base, "ggml_get_data"): (_vp, [_vp]),
        (base, "ggml_quantize_chunk"): (ctypes.c_size_t, [ctypes.c_int, _vp, _vp, ctypes.c_int64, ctypes.c_int64,
                                                          ctypes.c_int64, _vp]),
        (cpu, "ggml_graph_compute_with_ctx"): (ctypes.c_int, [_vp, _vp, ctypes.c_int]),
        (cpu, "ggml_backend_cpu_init"): (_vp, []),
    }
    for (lib, name), (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    cpu.ggml_backend_cpu_init()  # initialises the CPU backend's tables (f16, quant types)
    _lib = (base, cpu)
    return _lib


def available() -> str | None:
    """None if llama.cpp's ggml can be called, else the reason it cannot."""
    try:
        _load()
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"llama.cpp's ggml (llama-cpp-python) not usable: {e}"
    return None


def _sizes(ggml_type: int) -> tuple[int, int]:
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]


def quantize(x: np.ndarray, ggml_type: int) -> np.ndarray:
    """float32 (rows, k) -> that type's GGUF blocks, uint8 (rows, bytes), by llama.cpp."""
    base, _ = _load()
    x = np.ascontiguousarray(x, np.float32)
    rows, k = x.shape
    bs, ts = _sizes(ggml_type)
    out = np.zeros((rows, k // bs * ts), np.uint8)
    base.ggml_quantize_chunk(ggml_type, x.ctypes.data, out.ctypes.data, 0, rows, k, None)
    return out


def _ctx_bytes(weight_bytes: int, x_values: int, y_values: int) -> int:
    """A ggml context for one matmul: the tensors, the graph, and the work buffer that
    ggml_graph_compute_with_ctx takes from it (the quantized activations)."""
    return weight_bytes + 8 * x_values + 4 * y_values + (64 << 20)


def _copy_in(t, a: np.ndarray) -> None:
    base, _ = _load()
    a = np.ascontiguousarray(a)
    ctypes.memmove(base.ggml_get_data(t), a.ctypes.data, a.nbytes)


def _copy_out(t, shape) -> np.ndarray:
    base, _ = _load()
    p = ctypes.cast(base.ggml_get_data(t), ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(p, shape=shape).copy()


class MulMat:
    """y = x @ W.T as a prepared ggml graph (W stored as ``ggml_type``) for n tokens."""

    def __init__(self, raw: np.ndarray, ggml_type: int, n: int, n_threads: int = 1):
        base, _ = _load()
        bs, ts = _sizes(ggml_type)
        rows, k = raw.shape[0], raw.shape[1] // ts * bs
        self.ctx = base.ggml_init(_InitParams(_ctx_bytes(raw.nbytes, n * k, rows * n), None, False))
        w = base.ggml_new_tensor_2d(self.ctx, ggml_type, k, rows)
        self.x = base.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, k, n)
        _copy_in(w, raw)
        self.y_t = base.ggml_mul_mat(self.ctx, w, self.x)
        self.graph = base.ggml_new_graph(self.ctx)
        base.ggml_build_forward_expand(self.graph, self.y_t)
        self.n_threads, self.shape = n_threads, (n, rows)

    def set_x(self, x: np.ndarray) -> None:
        _copy_in(self.x, np.asarray(x, np.float32))

    def run(self) -> None:
        if _load()[1].ggml_graph_compute_with_ctx(self.ctx, self.graph, self.n_threads) != 0:
            raise RuntimeError("ggml_graph_compute failed")

    def y(self) -> np.ndarray:
        return _copy_out(self.y_t, self.shape)

    def __del__(self):
        if _lib is not None and getattr(self, "ctx", None):
            _lib[0].ggml_free(self.ctx)
            self.ctx = None


def mul_mat(raw: np.ndarray, ggml_type: int, x: np.ndarray, n_threads: int = 1) -> np.ndarray:
    mm = MulMat(raw, ggml_type, len(x), n_threads)
    mm.set_x(x)
    mm.run()
    return mm.y()


def mul_mat_id(raws: np.ndarray, ggml_type: int, x: np.ndarray, ids: np.ndarray, n_threads: int = 1) -> np.ndarray:
    """raws uint8 (E, rows, bytes); x float32 (n, k); ids int (n, top) -> (n, top, rows)."""
    base, cpu = _load()
    n_exp, rows, _ = raws.shape
    n, k = x.shape
    top = ids.shape[1]
    ctx = base.ggml_init(_InitParams(_ctx_bytes(raws.nbytes, n * k, rows * n * top), None, False))
    try:
        w = base.ggml_new_tensor_3d(ctx, ggml_type, k, rows, n_exp)
        xt = base.ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, 1, n)
        it = base.ggml_new_tensor_2d(ctx, GGML_TYPE_I32, top, n)
        _copy_in(w, raws)
        _copy_in(xt, np.asarray(x, np.float32))
        _copy_in(it, np.asarray(ids, np.int32))
        y = base.ggml_mul_mat_id(ctx, w, xt, it)
        g = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(g, y)
        if cpu.ggml_graph_compute_with_ctx(ctx, g, n_threads) != 0:
            raise RuntimeError("ggml_graph_compute failed")
        return _copy_out(y, (n, top, rows))
    finally:
        base.ggml_free(ctx)
