"""GGUF metadata and zero-copy tensors, through the `gguf` package (mmap).

A `Tensor` exposes the raw bytes of a weight as a uint8 view into the file mapping, its
GGML type and its shape in row-major (NumPy) order: a matrix with `ne = [n_in, n_out]` in
GGML order has `shape == (n_out, n_in)` here, one output row per quantized row.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ModelLoadError

GGUF_MAGIC = b"GGUF"


@dataclass
class Tensor:
    name: str
    ggml_type: int  # gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # NumPy order (outermost first), e.g. (n_out, n_in)
    data: np.ndarray  # raw storage: float32/float16 arrays for float types, uint8 blocks otherwise

    @property
    def type_name(self) -> str:
        import gguf

        return gguf.GGMLQuantizationType(self.ggml_type).name

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def raw(self) -> np.ndarray:
        """Bytes as uint8 with shape (*shape[:-1], bytes_per_row) (zero-copy)."""
        rows = self.shape[:-1]
        return self.data.view(np.uint8).reshape(*rows, -1)

    def dequantize(self) -> np.ndarray:
        """float32 copy with `shape` (slow path for tests and small tensors)."""
        from . import quant

        return quant.dequantize(self.raw(), self.ggml_type, self.shape)


_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
           10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY, _BOOL = 8, 9, 7


class _Cursor:
    """Little-endian reader over the mapped header; overruns mean a truncated file."""

    def __init__(self, buf: np.ndarray, path: Path):
        self.mv, self.n, self.pos, self.path = memoryview(buf), len(buf), 0, path

    def _need(self, n: int) -> int:
        p = self.pos
        if p + n > self.n:
            raise ModelLoadError(f"{self.path}: truncated GGUF header (needs byte {p + n}, file has {self.n})")
        self.pos = p + n
        return p

    def take(self, n: int) -> memoryview:
        p = self._need(n)
        return self.mv[p:p + n]

    def unpack(self, fmt: str, size: int):
        return struct.unpack_from(fmt, self.mv, self._need(size))[0]

    def u32(self) -> int:
        return self.unpack("<I", 4)

    def u64(self) -> int:
        return self.unpack("<Q", 8)

    def string(self) -> str:
        n = self.u64()
        p = self._need(n)
        return str(self.mv[p:p + n], "utf-8", "replace")

    def value(self, code: int):
        if code == _STRING:
            return self.string()
        if code == _ARRAY:
            sub, n = self.u32(), self.u64()
            if sub == _STRING:
                return self.strings(n)
            if sub == _ARRAY:
                return [self.value(_ARRAY) for _ in range(n)]
            if sub not in _SCALAR:
                raise ModelLoadError(f"{self.path}: unknown metadata array type {sub}")
            dt = np.dtype(_SCALAR[sub])
            arr = np.frombuffer(self.take(n * dt.itemsize), dtype=dt)
            return [bool(x) for x in arr] if sub == _BOOL else arr.tolist()
        if code not in _SCALAR:
            raise ModelLoadError(f"{self.path}: unknown metadata value type {code}")
        dt = np.dtype(_SCALAR[code])
        v = np.frombuffer(self.take(dt.itemsize), dtype=dt)[0].item()
        return bool(v) if code == _BOOL else v

    def strings(self, n: int) -> list[str]:
        # hot loop for vocabularies (262k entries): plain struct/slicing, no NumPy per item
        mv, end, p, out = self.mv, self.n, self.pos, []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(n):
            if p + 8 > end:
                break
            ln = unpack(mv, p)[0]
            p += 8
            if p + ln > end:
                break
            out.append(str(mv[p:p + ln], "utf-8", "replace"))
            p += ln
        self.pos = p
        if len(out) != n:
            raise ModelLoadError(f"{self.path}: truncated GGUF header (string array)")
        return out


class GGUFFile:
    """An opened GGUF file: `arch`, `meta` (key -> python value), `tensors` (name -> Tensor).

    The header is parsed here (the gguf package's reader builds an object per array element,
    which takes ~10 s on a 262k-token vocabulary); tensor data are views into one read-only
    memory map. Type sizes and names come from the gguf package.
    """

    def __init__(self, path: str | os.PathLike):
        import gguf

        self.path = Path(path)
        if not self.path.exists():
            raise ModelLoadError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise ModelLoadError(f"{self.path}: is a directory, not a GGUF file")
        size = self.path.stat().st_size
        if size < 24:
            raise ModelLoadError(f"{self.path}: not a GGUF file (only {size} bytes)")
        mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        if bytes(mm[:4]) != GGUF_MAGIC:
            raise ModelLoadError(f"{self.path}: not a GGUF file (magic {bytes(mm[:4])!r})")
        cur = _Cursor(mm, self.path)
        cur.take(4)  # magic
        version = cur.u32()
        if version not in (2, 3):
            raise ModelLoadError(f"{self.path}: unsupported GGUF version {version} (supported: 2, 3)")
        n_tensors, n_kv = cur.u64(), cur.u64()
        if n_tensors > size or n_kv > size:
            raise ModelLoadError(f"{self.path}: damaged GGUF header (counts {n_tensors}, {n_kv})")
        self.version = version
        self.meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.meta[key] = cur.value(cur.u32())
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.u32()
            if n_dims > 8:
                raise ModelLoadError(f"{self.path}: damaged tensor info for {name!r} ({n_dims} dims)")
            dims = [cur.u64() for _ in range(n_dims)]
            infos.append((name, dims, cur.u32(), cur.u64()))
        align = int(self.meta.get("general.alignment", 32))
        data_start = (cur.pos + align - 1) // align * align
        self.tensors: dict[str, Tensor] = {}
        for name, dims, ttype, offset in infos:
            try:
                qtype = gguf.GGMLQuantizationType(ttype)
                block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ModelLoadError(f"{self.path}: tensor {name} has unsupported type {ttype}") from None
            shape = tuple(int(d) for d in reversed(dims)) or (1,)
            if shape[-1] % block:
                raise ModelLoadError(f"{self.path}: tensor {name} row of {shape[-1]} is not a multiple of {block}")
            row_bytes = shape[-1] // block * type_size
            nbytes = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes
            begin = data_start + offset
            if begin + nbytes > size:
                raise ModelLoadError(
                    f"{self.path}: truncated file: tensor {name} ends at byte {begin + nbytes} but the file has {size}")
            raw = mm[begin:begin + nbytes]
            if qtype == gguf.GGMLQuantizationType.F32:
                data = raw.view(np.float32).reshape(shape)
            elif qtype == gguf.GGMLQuantizationType.F16:
                data = raw.view(np.float16).reshape(shape)
            else:
                data = raw.reshape(*shape[:-1], row_bytes)
            self.tensors[name] = Tensor(name, ttype, shape, data)
        self.arch: str = self.require("general.architecture")

    # --- metadata helpers -------------------------------------------------------------
    def require(self, key: str) -> Any:
        if key not in self.meta:
            raise ModelLoadError(f"{self.path}: missing metadata key {key!r}")
        return self.meta[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)

    def arch_key(self, suffix: str, default: Any = ...) -> Any:
        """`{arch}.{suffix}`, e.g. arch_key('block_count'); required unless a default is given."""
        key = f"{self.arch}.{suffix}"
        if default is ...:
            return self.require(key)
        return self.meta.get(key, default)

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelLoadError(f"{self.path}: missing tensor {name!r}") from None

    def has(self, name: str) -> bool:
        return name in self.tensors
