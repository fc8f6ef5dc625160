"""Slot save / restore / erase (llama-server's ``POST /slots/{id}?action=...``), in the
disk tier's file format (:mod:`llmcore.cache.state_file`, kind "slot"): a slot's tokens,
its state and its context checkpoints, so a restored hybrid or sliding-window state can
still be rolled back.

Each action is a :class:`SlotCommand` the engine runs on its thread between steps, once
the slot is idle (llama-server defers it the same way). The file itself is written or
read on the I/O thread; a restore then waits for the slot to be idle again and takes the
state in. The results are llama-server's shapes:

    save    {"id_slot", "filename", "n_saved", "n_written", "timings": {"save_ms"}}
    restore {"id_slot", "filename", "n_restored", "n_read", "timings": {"restore_ms"}}
    erase   {"id_slot", "n_erased"}
"""
from __future__ import annotations

import concurrent.futures
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..cache.checkpoints import CheckpointList
from ..cache.disk_io import IOWorker
from ..cache.pool import KVCacheFullError
from ..cache.state_file import (StateContents, StateFileError, export_state, import_state, read_state_file,
                                write_state_file)
from ..errors import NotSupportedError, RequestError, SlotFileError
from .prefix import PrefixPolicy
from .slot import Slot

log = logging.getLogger("llmcore.engine")

_BAD_CHARS = set('/\\:*?"<>|')


def validate_filename(name) -> str:
    """llama-server's rule for slot file names: one plain file name (no directory part),
    1..255 bytes of UTF-8, no control or reserved characters, no leading or trailing
    space, no trailing dot, not "." or ".."."""
    if not isinstance(name, str) or not name or len(name.encode("utf-8", "surrogatepass")) > 255:
        raise SlotFileError("Invalid filename")
    if name in (".", "..") or name != name.strip(" ") or name.endswith(".") or \
            any(ord(ch) < 0x20 or ord(ch) == 0x7F or ch in _BAD_CHARS or 0xD800 <= ord(ch) <= 0xDFFF
                for ch in name):
        raise SlotFileError("Invalid filename")
    return name


@dataclass
class SlotCommand:
    """One slot action, from the caller (any thread) to the engine thread."""

    action: str  # save | restore | erase
    slot_id: int
    filename: str | None = None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    t_start: float = field(default_factory=time.perf_counter)
    contents: StateContents | None = None  # restore: the file read, waiting to be taken in
    n_read: int = 0


class SlotFiles:
    """Runs slot commands on the engine thread (``run``); ``requeue`` puts a restore whose
    file has been read back in the engine's command queue."""

    def __init__(self, directory: str | None, io: IOWorker | None, prefix: PrefixPolicy,
                 fingerprint: Callable, n_ctx_slot: int, requeue: Callable[[SlotCommand], None]):
        self.dir = Path(directory) if directory else None
        self.io = io
        self.prefix = prefix
        self.fingerprint = fingerprint  # () -> Fingerprint, on the I/O thread
        self.n_ctx_slot = n_ctx_slot
        self.requeue = requeue

    def check(self, cmd: SlotCommand, n_slots: int) -> None:
        """Caller side: refuse what can never run (raises)."""
        if cmd.action not in ("save", "restore", "erase"):
            raise RequestError(f"Invalid action {cmd.action!r} (save, restore or erase)")
        if not 0 <= cmd.slot_id < n_slots:
            raise RequestError(f"Invalid slot id {cmd.slot_id} (0..{n_slots - 1})")
        if cmd.action != "erase":
            if self.dir is None or self.io is None:
                raise NotSupportedError("This server does not support slots action.")
            validate_filename(cmd.filename)

    def run(self, cmd: SlotCommand, slot: Slot) -> None:
        """Engine thread, the slot idle."""
        try:
            getattr(self, "_" + cmd.action)(cmd, slot)
        except Exception as e:  # noqa: BLE001 - the caller hears it, the engine goes on
            if not cmd.future.done():
                cmd.future.set_exception(e)

    def _erase(self, cmd: SlotCommand, slot: Slot) -> None:
        n = slot.n_tokens
        if slot.state is not None:
            self.prefix.clear(slot)
        cmd.future.set_result({"id_slot": slot.id, "n_erased": n})

    def _save(self, cmd: SlotCommand, slot: Slot) -> None:
        if slot.state is None:
            slot.state = self.prefix.new_state()
        st = slot.state
        snap = st.snapshot()  # held (blocks referenced) until the file is written
        cks = slot.checkpoints.share()
        contents = export_state(st, snap, list(cks), st.min_trim(), kind="slot")
        path = self.dir / cmd.filename
        n = st.n_tokens

        def done(size, err) -> None:
            st.release_snapshot(snap)
            cks.clear()
            if err is not None:
                log.warning("slot %d: saving to %s failed: %s", slot.id, path.name, err)
                cmd.future.set_exception(SlotFileError(f"failed to save slot {slot.id}: {err}"))
                return
            log.info("slot %d: saved %d tokens to %s (%d bytes)", slot.id, n, path.name, size)
            cmd.future.set_result({"id_slot": slot.id, "filename": cmd.filename, "n_saved": n,
                                   "n_written": size,
                                   "timings": {"save_ms": 1e3 * (time.perf_counter() - cmd.t_start)}})

        def write() -> int:
            path.parent.mkdir(parents=True, exist_ok=True)
            return write_state_file(path, self.fingerprint(), contents)

        self.io.submit(write, done)

    def _restore(self, cmd: SlotCommand, slot: Slot) -> None:
        if cmd.contents is None:  # first: read the file (I/O thread), then come back here
            path = self.dir / cmd.filename

            def read():
                c = read_state_file(path, self.fingerprint())
                return c, path.stat().st_size

            def done(out, err) -> None:
                if err is not None:
                    why = "file not found" if isinstance(err, FileNotFoundError) else str(err)
                    cmd.future.set_exception(SlotFileError(
                        f"Unable to restore slot, no available space in KV cache or invalid slot save file "
                        f"({path.name}: {why})"))
                    return
                cmd.contents, cmd.n_read = out
                self.requeue(cmd)

            self.io.submit(read, done)
            return
        contents, cmd.contents = cmd.contents, None
        if contents.n_tokens >= self.n_ctx_slot:
            raise SlotFileError(f"Unable to restore slot: {contents.n_tokens} tokens do not fit the "
                                f"slot's context of {self.n_ctx_slot}")
        self.prefix.save(slot)  # what the slot holds goes to the RAM cache first
        self.prefix.clear(slot)
        st = slot.state
        pc = self.prefix.pcache
        while True:
            try:
                snap, cks = import_state(st, contents)
                break
            except KVCacheFullError:
                if pc is None or pc.evict_lru() is None:
                    raise SlotFileError("Unable to restore slot, no available space in KV cache") from None
            except (StateFileError, ValueError) as e:
                raise SlotFileError(f"Unable to restore slot: invalid slot save file ({e})") from None
        st.restore(snap)
        st.release_snapshot(snap)  # the state holds its own references now
        for ck in cks:
            ck.charge(self.prefix.checkpoint_budget)
        slot.checkpoints = CheckpointList(self.prefix.max_checkpoints, cks)
        slot.published = False
        slot.t_last_used = time.time()
        log.info("slot %d: restored %d tokens from %s", slot.id, st.n_tokens, cmd.filename)
        cmd.future.set_result({"id_slot": slot.id, "filename": cmd.filename, "n_restored": st.n_tokens,
                               "n_read": cmd.n_read,
                               "timings": {"restore_ms": 1e3 * (time.perf_counter() - cmd.t_start)}})


__all__ = ["SlotCommand", "SlotFiles", "validate_filename"]
