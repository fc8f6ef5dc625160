"""The prompt cache's disk tier: states that left the RAM cache, kept in a directory
across restarts (``--cache-dir DIR``, ``--cache-disk MiB``).

One state file per entry (:mod:`llmcore.cache.state_file`). The index is a
:class:`~llmcore.cache.prompt_cache.PromptCache` whose entries stand for files (their
token paths, trim floors and checkpoint positions, each file's size as its bytes), so a
lookup is the RAM tier's radix walk and the budget is the same LRU by bytes: an entry the
index lets go (evicted, made obsolete by a longer one, not kept) has its file deleted.
At start-up the directory is indexed from the files' headers only, oldest first; stale
temporary files of dead writers are removed; files of another fingerprint are left alone.

Every file operation runs on the :class:`~llmcore.cache.disk_io.IOWorker` thread; the
index lives on the owner's (engine) thread and changes only in completions. A failed
write (full disk, read-only directory), a torn, corrupt or foreign file is a miss, a
warning and a counter (``stats``), never an exception for the caller.

    disk = DiskCache(dir, limit_bytes, io, fingerprint=lambda: model_fingerprint(m, probe))
    disk.start()                                    # index the directory (async)
    disk.write(contents, on_done=release_refs)      # an evicted RAM entry
    entry, n = disk.best(prompt[:-1])               # what the disk could serve
    load = disk.load(entry)                         # async: load.done, load.contents
"""
from __future__ import annotations

import collections
import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .disk_io import IOWorker
from .prompt_cache import CacheEntry, PromptCache
from .state_file import (SUFFIX, Fingerprint, StateContents, StateFileCorrupt, StateFileError,
                         StateFileForeign, read_header, read_state_file, write_state_file)

log = logging.getLogger("llmcore.cache")

# writes queued but not written hold their states (KV blocks referenced, or copies):
# beyond this many bytes an evicted entry is not written (counted)
MAX_PENDING_BYTES = 1 << 30
WARN_EVERY_S = 60.0  # a failure that repeats (full disk) is logged once a minute


@dataclass
class DiskFile:
    """What an index entry stands for."""

    path: Path
    size: int
    keep: bool = False  # forget the entry without deleting the file (foreign or vanished)


@dataclass(frozen=True)
class _At:
    """A checkpoint position (what ``CacheEntry.checkpoint_positions`` reads)."""

    n_tokens: int


@dataclass
class DiskLoad:
    """A file being read for the owner: ``done`` once finished; then ``contents``, or
    ``error`` (the entry was dropped from the index)."""

    entry: CacheEntry
    t_start: float = field(default_factory=time.monotonic)
    done: bool = False
    contents: StateContents | None = None
    error: BaseException | None = None
    seconds: float = 0.0


class DiskCache:
    """Index, budget and jobs of the disk tier (see module docstring). Owner thread only."""

    def __init__(self, directory: str | os.PathLike, limit_bytes: int | None, io: IOWorker,
                 fingerprint: Callable[[], Fingerprint], max_pending_bytes: int = MAX_PENDING_BYTES):
        self.dir = Path(directory)
        self.io = io
        self._fingerprint_fn = fingerprint
        self.fingerprint: Fingerprint | None = None  # set by the start job
        self.index = PromptCache(limit_bytes, on_release=self._forget)
        self.limit_bytes = self.index.limit_bytes
        self.max_pending_bytes = max_pending_bytes
        self.ready = False  # the directory is indexed
        self.enabled = True  # False: the directory or the model cannot be used at all
        self.writable = True
        self.pending_bytes = 0  # of queued writes
        self.loads: dict[int, DiskLoad] = {}  # index entry id -> load in flight
        self.stats = collections.Counter(writes=0, write_failures=0, writes_skipped=0, loads=0,
                                         load_failures=0, files_rejected=0, files_foreign=0, deletes=0,
                                         bytes_written=0, bytes_read=0)
        self._warned: dict[str, float] = {}

    # ---- start-up --------------------------------------------------------------------------
    def start(self) -> None:
        """Index the directory on the I/O thread (``ready`` once done)."""
        self.io.submit(self._start_job, self._started)

    def _start_job(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        fp = self._fingerprint_fn()
        writable = dir_writable(self.dir)
        headers, rejected, foreign = [], [], 0
        for p in self.dir.iterdir():
            name = p.name
            if name.startswith(".") and name.endswith(".tmp"):
                _remove_stale_tmp(p)
                continue
            if not name.endswith(SUFFIX) or not p.is_file():
                continue
            try:
                h = read_header(p)
            except StateFileForeign:
                foreign += 1
                continue
            except (StateFileError, OSError) as e:
                rejected.append((p, str(e)))
                continue
            if h.fingerprint != fp.digest or h.kind != "prompt":
                foreign += 1
                continue
            headers.append((p.stat().st_mtime, h))
        for p, _ in rejected:  # ours and useless: a torn or damaged state file
            try:
                p.unlink()
            except OSError:
                pass
        headers.sort(key=lambda x: x[0])
        return fp, writable, [h for _, h in headers], rejected, foreign

    def _started(self, out, err) -> None:
        if err is not None:
            self.enabled = False
            self.ready = True
            log.warning("disk cache %s unusable, running without it: %s", self.dir, err)
            return
        fp, self.writable, headers, rejected, foreign = out
        self.fingerprint = fp
        for p, why in rejected:
            log.warning("disk cache: removed a damaged state file: %s", why)
        self.stats["files_rejected"] += len(rejected)
        self.stats["files_foreign"] += foreign
        for h in headers:
            self._add(h.tokens, h.path, h.file_size, h.trim_floor, h.checkpoint_positions)
        if not self.writable:
            log.warning("disk cache %s is read-only: entries are read from it, none are written", self.dir)
        self.ready = True
        log.info("disk cache %s: %d entries (%.1f MiB of %s)%s%s", self.dir, self.index.n_entries,
                 self.index.nbytes / 2**20, "unbounded" if self.limit_bytes is None else
                 f"{self.limit_bytes / 2**20:.0f} MiB", f", {foreign} of other models or versions left alone"
                 if foreign else "", f", {len(rejected)} damaged removed" if rejected else "")

    # ---- the index -------------------------------------------------------------------------
    def _add(self, tokens, path: Path, size: int, trim_floor: int, positions) -> CacheEntry | None:
        return self.index.insert(tokens, DiskFile(path, size), checkpoints=[_At(int(p)) for p in positions],
                                 trim_floor=trim_floor, own_bytes=size)

    def _forget(self, entry: CacheEntry) -> None:
        """The index let an entry go: its file goes too (unless marked ``keep``)."""
        f: DiskFile = entry.state
        if f is None or f.keep:
            return
        self.stats["deletes"] += 1
        self.io.submit(lambda: _unlink(f.path), None)

    def best(self, tokens) -> tuple[CacheEntry | None, int]:
        """The indexed entry that can provide the most of `tokens`, and how many."""
        if not self.ready or not self.enabled:
            return None, 0
        return self.index.best(tokens)

    def covers(self, tokens, trim_floor: int, positions) -> bool:
        """Whether an indexed entry already serves everything a state of `tokens` would."""
        tokens = list(tokens)
        n = len(tokens)
        for e, lcp in self.index.lookup(tokens, max_candidates=4):
            if lcp == n and e.can_serve(n) and all(e.can_serve(p) for p in positions) \
                    and (trim_floor >= e.trim_floor or e.n_tokens == n):
                return True
        return False

    # ---- writing ---------------------------------------------------------------------------
    def can_write(self, nbytes: int, bounded: bool = True) -> bool:
        """Whether a state of `nbytes` would be written now (``bounded``: within the bytes
        that queued writes may hold)."""
        return (self.enabled and self.ready and self.writable
                and (self.limit_bytes is None or nbytes <= self.limit_bytes)
                and (not bounded or self.pending_bytes + nbytes <= self.max_pending_bytes))

    def write(self, contents: StateContents, on_done: Callable[[], None] | None = None,
              bounded: bool = True) -> bool:
        """Queue `contents` for a file (atomic write, then indexed). ``on_done`` runs on the
        owner thread after the write, whatever happened (the caller releases the state
        there). False (and ``on_done`` run now) when it is not written: tier off, read-only,
        larger than the budget, or (``bounded``) too many bytes already queued."""
        nbytes = contents.nbytes
        if not self.can_write(nbytes, bounded):
            if self.enabled and self.ready:
                self.stats["writes_skipped" if self.writable else "write_failures"] += 1
            if on_done is not None:
                on_done()
            return False
        fp = self.fingerprint
        path = self.dir / f"{fp.digest[:16]}-{time.time_ns():x}-{os.getpid()}-{next(_names):x}{SUFFIX}"
        self.pending_bytes += nbytes
        tokens, floor = contents.tokens.copy(), contents.trim_floor
        positions = [c.n_tokens for c in contents.checkpoints]

        def done(size, err):
            self.pending_bytes -= nbytes
            try:
                if on_done is not None:
                    on_done()
            finally:
                if err is not None:
                    self.stats["write_failures"] += 1
                    self._warn("write", f"disk cache: writing a state of {len(tokens)} tokens failed: {err}")
                    return
                self.stats["writes"] += 1
                self.stats["bytes_written"] += size
                self._add(tokens, path, size, floor, positions)

        self.io.submit(lambda: write_state_file(path, fp, contents), done)
        return True

    # ---- reading ---------------------------------------------------------------------------
    def load(self, entry: CacheEntry, on_loaded: Callable[[DiskLoad], None] | None = None) -> DiskLoad:
        """Read `entry`'s file on the I/O thread (one load per entry at a time; the entry is
        pinned meanwhile so the budget cannot delete it). ``on_loaded(load)`` runs on the
        owner thread once the contents are there (not after a failure)."""
        have = self.loads.get(entry.id)
        if have is not None:
            return have
        ld = DiskLoad(entry)
        self.loads[entry.id] = ld
        self.index.pin(entry)
        f: DiskFile = entry.state
        fp = self.fingerprint

        def done(contents, err):
            del self.loads[entry.id]
            self.index.unpin(entry)
            ld.done, ld.seconds = True, time.monotonic() - ld.t_start
            if err is None:
                ld.contents = contents
                self.stats["loads"] += 1
                self.stats["bytes_read"] += f.size
                self.index.touch(entry)
                self.io.submit(lambda: _touch(f.path), None)  # LRU order survives a restart
                if on_loaded is not None:
                    on_loaded(ld)
                return
            self.reject(entry, err)
            ld.error = err

        self.io.submit(lambda: read_state_file(f.path, fp), done)
        return ld

    def reject(self, entry: CacheEntry, err: BaseException) -> None:
        """An entry's file could not be used: a miss, a warning, a counter; the entry leaves
        the index (its file is deleted when damaged, kept when foreign or unreadable)."""
        self.stats["load_failures"] += 1
        f: DiskFile = entry.state
        f.keep = not isinstance(err, (StateFileCorrupt, ValueError))
        self._warn("load", f"disk cache: cannot use {f.path.name} ({err}); the prompt is processed instead")
        if entry._alive and entry.pins == 0:
            self.index.remove(entry)

    # ---- shutdown --------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Wait for every queued job (owner thread, at shutdown)."""
        return self.io.drain(timeout)

    # ---- numbers ---------------------------------------------------------------------------
    def numbers(self) -> dict:
        ix = self.index
        return dict(cache_disk_bytes=ix.nbytes, cache_disk_limit_bytes=-1 if ix.limit_bytes is None else ix.limit_bytes,
                    cache_disk_entries=ix.n_entries, cache_disk_tokens=ix.n_tokens,
                    cache_disk_evictions=ix.stats["evictions"], cache_disk_pending_bytes=self.pending_bytes,
                    disk_writes=self.stats["writes"], disk_write_failures=self.stats["write_failures"],
                    disk_writes_skipped=self.stats["writes_skipped"], disk_loads=self.stats["loads"],
                    disk_load_failures=self.stats["load_failures"] + self.stats["files_rejected"])

    def _warn(self, key: str, msg: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(key, -1e9) >= WARN_EVERY_S:
            self._warned[key] = now
            log.warning(msg)
        else:
            log.debug(msg)


_names = itertools.count(1)


def dir_writable(d: Path) -> bool:
    """Whether files can be created in `d` (tried: permissions alone do not tell for root
    or a read-only mount)."""
    probe = d / f".write-probe.{os.getpid()}.tmp"
    try:
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError:
        return False


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def _remove_stale_tmp(p: Path) -> None:
    """A hidden temporary file of a writer that died (its pid is not running)."""
    parts = p.name.split(".")
    try:
        pid = int(parts[-3])
    except (IndexError, ValueError):
        return
    try:
        os.kill(pid, 0)
        return  # alive (maybe this process): a writer into the same directory
    except ProcessLookupError:
        pass
    except OSError:
        return
    try:
        p.unlink()
    except OSError:
        pass


__all__ = ["DiskCache", "DiskFile", "DiskLoad", "MAX_PENDING_BYTES"]
