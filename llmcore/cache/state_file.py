"""State files: one sequence's cached state on disk. The prompt cache's disk tier
(:mod:`llmcore.cache.disk`) and the slots' save/restore share this format.

Layout (little-endian)::

    preamble  40 bytes: magic b"LLMCSTAT", u32 format version, u32 header length,
              u64 token count, u64 payload length, u32 header CRC-32, u32 payload CRC-32
    header    JSON (utf-8): fingerprint digest and details, kind ("prompt" | "slot"),
              trim floor, the records (the state per cache group, each checkpoint's per
              group: kind, position, meta, array indices) and the array table
              (dtype, shape, offset, nbytes)
    tokens    int32 x token count: the token path the state is for
    payload   the arrays, each at a 64-byte aligned offset from the payload start
              (the payload starts 64-byte aligned too)

The header CRC covers header and tokens, the payload CRC the arrays' bytes in order. An
index reads preamble, header and tokens only (:func:`read_header`: the file's length
must match what the preamble says, so a truncated file is found without reading it); a
loader verifies both CRCs (:func:`read_state_file`). Writes are atomic: a hidden
temporary file in the same directory, fsync, rename, fsync of the directory.

The fingerprint (:func:`model_fingerprint`) names everything that changes the bytes: a
digest of the model file, the architecture and its hyper-parameters, each cache group's
layout (kind, pool, KV type, block size, heads, window, recurrent shapes), llmcore's
version and the format version. A file with another fingerprint is foreign: never
restored, never deleted (another model's server may share the directory).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import LLMCoreError
from .checkpoints import export_checkpoint, import_checkpoint
from .protocol import LazyArray, SnapshotFormatError, SnapshotRecord

MAGIC = b"LLMCSTAT"
FORMAT_VERSION = 1
SUFFIX = ".llmstate"
_PREAMBLE = struct.Struct("<8sIIQQII")
_ALIGN = 64
_MAX_HEADER = 64 << 20  # a header larger than this is damage, not a state
_tmp_ids = itertools.count(1)


class StateFileError(LLMCoreError):
    """A state file cannot be used."""


class StateFileCorrupt(StateFileError):
    """Torn, truncated or damaged (bad magic, length or checksum)."""


class StateFileForeign(StateFileError):
    """Written for another model, configuration, llmcore or format version."""


@dataclass(frozen=True)
class Fingerprint:
    digest: str
    details: dict = field(default_factory=dict, compare=False)


def file_digest(path: str | os.PathLike, sample: int = 64 << 10, n_samples: int = 32) -> str:
    """A cheap stable digest of a (large) file: its size, its first 16 MiB (a GGUF's header:
    metadata and tensor table), 32 samples of 64 KiB spread over it and its last MiB."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    h.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        h.update(f.read(16 << 20))
        for i in range(n_samples):
            f.seek(size * i // n_samples)
            h.update(f.read(sample))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read())
    return h.hexdigest()


def model_fingerprint(model, probe) -> Fingerprint:
    """The fingerprint of state files of `model` (whose GGUF is ``model.gguf.path``) with
    sequence states like `probe` (a SeqState: its ``layout()``)."""
    g = getattr(model, "gguf", None)
    path = getattr(g, "path", None)
    if path is None:
        raise StateFileError("the model has no file to fingerprint its states by")
    args = getattr(model, "args", None)
    details = {
        "format": FORMAT_VERSION, "llmcore": __version__, "model_file": file_digest(path),
        "arch": getattr(model, "arch", ""),
        "args": dataclasses.asdict(args) if dataclasses.is_dataclass(args) else None,
        "caches": probe.layout(),
    }
    digest = hashlib.sha256(json.dumps(details, sort_keys=True, default=str).encode()).hexdigest()
    return Fingerprint(digest, details)


@dataclass
class CheckpointRecord:
    n_tokens: int
    kind: str  # periodic | user | tail
    records: dict[str, SnapshotRecord]  # cache group -> record


@dataclass
class StateContents:
    """What a state file holds: the token path, the state at its end (one record per
    cache group), the checkpoints along it, and the trim floor (shortest prefix the state
    can be cut back to without a checkpoint)."""

    tokens: np.ndarray  # int32
    state: dict[str, SnapshotRecord]
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    trim_floor: int = 0
    kind: str = "prompt"  # prompt (the disk tier) | slot (a slot's save file)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays (about the file's size)."""
        return (sum(r.nbytes for r in self.state.values()) + 4 * len(self.tokens)
                + sum(r.nbytes for ck in self.checkpoints for r in ck.records.values()))

    def loaded(self) -> "StateContents":
        """The same contents with every array read now (independent of its source)."""
        return StateContents(self.tokens.copy(), {k: r.loaded() for k, r in self.state.items()},
                             [CheckpointRecord(c.n_tokens, c.kind, {k: r.loaded() for k, r in c.records.items()})
                              for c in self.checkpoints], self.trim_floor, self.kind)


@dataclass(frozen=True)
class StateHeader:
    """What an index needs of a state file (read without its payload)."""

    path: Path
    fingerprint: str
    kind: str
    tokens: np.ndarray
    trim_floor: int
    checkpoint_positions: tuple[int, ...]
    file_size: int
    created: float

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _layout(contents: StateContents) -> tuple[dict, list[LazyArray]]:
    """The header's records and array table, and the arrays in payload order."""
    arrays: list[LazyArray] = []
    table: list[dict] = []
    offset = 0

    def rec(r: SnapshotRecord) -> dict:
        nonlocal offset
        idx = {}
        for name, a in r.arrays.items():
            idx[name] = len(arrays)
            arrays.append(a)
            table.append({"dtype": np.dtype(a.dtype).str, "shape": list(a.shape), "offset": offset,
                          "nbytes": a.nbytes})
            offset = _align(offset + a.nbytes)
        return {"kind": r.kind, "n_tokens": r.n_tokens, "meta": r.meta, "arrays": idx}

    records = {"state": {k: rec(r) for k, r in contents.state.items()},
               "checkpoints": [{"n_tokens": c.n_tokens, "kind": c.kind,
                                "records": {k: rec(r) for k, r in c.records.items()}}
                               for c in contents.checkpoints]}
    return {"records": records, "arrays": table}, arrays


def write_state_file(path: str | os.PathLike, fingerprint: Fingerprint, contents: StateContents) -> int:
    """Write `contents` to `path` atomically; returns the file's size. Raises OSError (full
    disk, read-only directory...) with nothing left behind."""
    path = Path(path)
    body, arrays = _layout(contents)
    header = {"fingerprint": fingerprint.digest, "model": fingerprint.details, "kind": contents.kind,
              "trim_floor": int(contents.trim_floor), "created": time.time(), **body}
    hbytes = json.dumps(header, separators=(",", ":"), default=str).encode()
    tokens = np.ascontiguousarray(contents.tokens, dtype="<i4")
    hcrc = zlib.crc32(tokens.tobytes(), zlib.crc32(hbytes))
    start = _align(_PREAMBLE.size + len(hbytes) + tokens.nbytes)
    payload_len = _align(body["arrays"][-1]["offset"] + body["arrays"][-1]["nbytes"]) if arrays else 0
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_tmp_ids)}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(hbytes), len(tokens), payload_len, hcrc, 0))
            f.write(hbytes)
            f.write(tokens.tobytes())
            f.write(b"\0" * (start - f.tell()))
            pcrc = 0
            for a, info in zip(arrays, body["arrays"]):
                data = np.ascontiguousarray(a.read())
                if data.shape != tuple(a.shape) or data.dtype != np.dtype(a.dtype):
                    raise ValueError(f"array read as {data.dtype}{data.shape}, announced {a.dtype}{a.shape}")
                raw = data.reshape(-1).view(np.uint8)
                pad = start + info["offset"] - f.tell()
                if pad:
                    f.write(b"\0" * pad)
                f.write(raw)
                pcrc = zlib.crc32(raw, pcrc)
            f.write(b"\0" * (start + payload_len - f.tell()))
            f.seek(0)
            f.write(_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(hbytes), len(tokens), payload_len, hcrc, pcrc))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)
    return start + payload_len


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_front(f, path: Path) -> tuple[dict, np.ndarray, int, int, int]:
    """(header, tokens, payload start, payload length, payload CRC) of an open file."""
    pre = f.read(_PREAMBLE.size)
    if len(pre) < _PREAMBLE.size:
        raise StateFileCorrupt(f"{path.name}: truncated ({len(pre)} bytes)")
    magic, version, hlen, n_tok, plen, hcrc, pcrc = _PREAMBLE.unpack(pre)
    if magic != MAGIC:
        raise StateFileCorrupt(f"{path.name}: not a state file")
    if version != FORMAT_VERSION:
        raise StateFileForeign(f"{path.name}: state format {version}, this llmcore reads {FORMAT_VERSION}")
    if hlen > _MAX_HEADER or n_tok > _MAX_HEADER:
        raise StateFileCorrupt(f"{path.name}: damaged preamble")
    hbytes = f.read(hlen)
    tbytes = f.read(4 * n_tok)
    if len(hbytes) != hlen or len(tbytes) != 4 * n_tok:
        raise StateFileCorrupt(f"{path.name}: truncated header")
    if zlib.crc32(tbytes, zlib.crc32(hbytes)) != hcrc:
        raise StateFileCorrupt(f"{path.name}: header checksum mismatch")
    try:
        header = json.loads(hbytes)
    except ValueError:
        raise StateFileCorrupt(f"{path.name}: unreadable header") from None
    start = _align(_PREAMBLE.size + hlen + 4 * n_tok)
    size = os.fstat(f.fileno()).st_size
    if size != start + plen:
        raise StateFileCorrupt(f"{path.name}: {size} bytes, the preamble says {start + plen} (torn or truncated)")
    return header, np.frombuffer(tbytes, dtype="<i4").astype(np.int32), start, plen, pcrc


def read_header(path: str | os.PathLike) -> StateHeader:
    """The header of a state file (StateFileCorrupt / StateFileForeign; OSError)."""
    path = Path(path)
    with open(path, "rb") as f:
        h, tokens, _, _, _ = _read_front(f, path)
        size = os.fstat(f.fileno()).st_size
    try:
        cks = tuple(int(c["n_tokens"]) for c in h["records"]["checkpoints"])
        return StateHeader(path, str(h["fingerprint"]), str(h["kind"]), tokens, int(h["trim_floor"]),
                           cks, size, float(h.get("created", 0.0)))
    except (KeyError, TypeError, ValueError):
        raise StateFileCorrupt(f"{path.name}: damaged header") from None


def read_state_file(path: str | os.PathLike, fingerprint: Fingerprint | None) -> StateContents:
    """The whole file, both checksums verified; its fingerprint must be `fingerprint`'s
    (None: any). StateFileCorrupt / StateFileForeign; OSError."""
    path = Path(path)
    with open(path, "rb") as f:
        h, tokens, start, plen, pcrc = _read_front(f, path)
        if fingerprint is not None and h.get("fingerprint") != fingerprint.digest:
            raise StateFileForeign(f"{path.name}: written for another model or configuration")
        try:
            table = h["arrays"]
            loaded: list[np.ndarray] = []
            crc = 0
            for info in table:
                nbytes, off = int(info["nbytes"]), int(info["offset"])
                dtype, shape = np.dtype(info["dtype"]), tuple(int(x) for x in info["shape"])
                if off < 0 or off + nbytes > plen or nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
                    raise StateFileCorrupt(f"{path.name}: damaged array table")
                buf = np.empty(nbytes, dtype=np.uint8)
                f.seek(start + off)
                if f.readinto(buf) != nbytes:
                    raise StateFileCorrupt(f"{path.name}: truncated payload")
                crc = zlib.crc32(buf, crc)
                loaded.append(buf.view(dtype).reshape(shape))
            if crc != pcrc:
                raise StateFileCorrupt(f"{path.name}: payload checksum mismatch")

            def rec(d: dict) -> SnapshotRecord:
                return SnapshotRecord(str(d["kind"]), int(d["n_tokens"]), dict(d["meta"]),
                                      {k: LazyArray.of(loaded[int(i)]) for k, i in d["arrays"].items()})

            r = h["records"]
            return StateContents(
                tokens, {k: rec(d) for k, d in r["state"].items()},
                [CheckpointRecord(int(c["n_tokens"]), str(c["kind"]), {k: rec(d) for k, d in c["records"].items()})
                 for c in r["checkpoints"]],
                int(h["trim_floor"]), str(h["kind"]))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise StateFileCorrupt(f"{path.name}: damaged header ({e})") from None


# ---- live snapshots <-> contents -------------------------------------------------------------

def export_state(state, snap, checkpoints=(), trim_floor: int = 0, kind: str = "prompt") -> StateContents:
    """The contents of a file for `snap` (a SeqSnapshot of `state`'s model) and its
    checkpoints. Arrays are read when written: the caller keeps `snap` and the checkpoints
    alive until then (or calls ``.loaded()``)."""
    return StateContents(np.asarray(snap.tokens, dtype=np.int32), state.export_snapshot(snap),
                         [CheckpointRecord(ck.n_tokens, ck.kind, export_checkpoint(state, ck)) for ck in checkpoints],
                         int(trim_floor), kind)


def import_state(state, contents: StateContents) -> tuple:
    """(SeqSnapshot, [Checkpoint]) of `state`'s model built from `contents` (new pool
    blocks; all or nothing). SnapshotFormatError when they do not fit this model;
    KVCacheFullError when the pools have no room."""
    n = contents.n_tokens
    if any(not 0 < c.n_tokens <= n for c in contents.checkpoints) or not 0 <= contents.trim_floor <= n:
        raise SnapshotFormatError(f"checkpoints or trim floor outside the {n} tokens of the state")
    snap = state.import_snapshot(contents.tokens.tolist(), contents.state)
    cks = []
    try:
        for c in contents.checkpoints:
            cks.append(import_checkpoint(state, c.n_tokens, c.kind, c.records))
    except BaseException:
        for ck in cks:
            ck.release()
        state.release_snapshot(snap)
        raise
    return snap, cks


__all__ = ["MAGIC", "FORMAT_VERSION", "SUFFIX", "StateFileError", "StateFileCorrupt", "StateFileForeign",
           "Fingerprint", "file_digest", "model_fingerprint", "CheckpointRecord", "StateContents",
           "StateHeader", "write_state_file", "read_header", "read_state_file", "export_state", "import_state"]
