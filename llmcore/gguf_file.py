"""GGUF metadata and zero-copy tensors, through the `gguf` package (mmap).

A `Tensor` exposes the raw bytes of a weight as a uint8 view into the file mapping, its
GGML type and its shape in row-major (NumPy) order: a matrix with `ne = [n_in, n_out]` in
GGML order has `shape == (n_out, n_in)` here, one output row per quantized row.
"""
from __future__ import annotations

import os
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


class GGUFFile:
    """An opened GGUF file: `arch`, `meta` (key -> python value), `tensors` (name -> Tensor)."""

    def __init__(self, path: str | os.PathLike):
        import gguf

        self.path = Path(path)
        if not self.path.exists():
            raise ModelLoadError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise ModelLoadError(f"{self.path}: is a directory, not a GGUF file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelLoadError(f"{self.path}: not a GGUF file (magic {magic!r})")
        size = self.path.stat().st_size
        try:
            reader = gguf.GGUFReader(self.path, "r")
        except Exception as e:  # the gguf package raises assorted errors on damaged headers
            raise ModelLoadError(f"{self.path}: truncated or damaged GGUF ({type(e).__name__}: {e})") from None
        self._reader = reader
        self.meta: dict[str, Any] = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.meta[key] = field.contents()
            except Exception:
                continue
        self.tensors: dict[str, Tensor] = {}
        known_types = {t.value for t in gguf.GGMLQuantizationType}
        for t in reader.tensors:
            ttype = int(t.tensor_type)
            if ttype not in known_types:
                raise ModelLoadError(f"{self.path}: tensor {t.name} has unknown type {ttype}")
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise ModelLoadError(
                    f"{self.path}: truncated file: tensor {t.name} ends at byte {end} but the file has {size}"
                )
            shape = tuple(int(x) for x in reversed([int(d) for d in t.shape]))
            self.tensors[t.name] = Tensor(t.name, ttype, shape, t.data)
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
