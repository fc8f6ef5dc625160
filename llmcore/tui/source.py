"""Where snapshots come from. Every source has `async fetch() -> Snapshot`, which never
raises: a failure is a `Snapshot.lost(reason)` (the dashboard shows it as state).

- `EngineSource`: an engine in this process (reads `engine.stats()`, no HTTP).
- `HttpSource`: a running server, through `/slots`, `/metrics` and `/props`.
- `FakeSource`: deterministic numbers (tests, `--mock` demo), scriptable failures.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import Callable, Protocol

from .parsing import from_engine_stats, from_http
from .snapshot import Snapshot


class StatsSource(Protocol):
    name: str

    async def fetch(self) -> Snapshot: ...

    async def close(self) -> None: ...


class EngineSource:
    """Reads an in-process `llmcore.engine.Engine` (its stats snapshot is cheap and safe
    from any thread)."""

    def __init__(self, engine, name: str = "in-process"):
        self.engine = engine
        self.name = name

    async def fetch(self) -> Snapshot:
        try:
            snap = from_engine_stats(self.engine.stats(), memory_plan=self.engine.memory_plan)
        except Exception as e:  # noqa: BLE001 - shown as state, never raised
            return Snapshot.lost(f"{type(e).__name__}: {e}")
        if snap.get("status") == "error":  # why it failed is not a number: ask the engine
            return replace(snap, stats={**snap.stats, "error": self.engine.load_error or ""})
        return snap

    async def close(self) -> None:
        pass


class HttpSource:
    """Polls a llmcore (or llama-server) at `url` over HTTP with aiohttp. `/props` is read
    once per connection once the model is loaded (then it does not change), every poll
    before; `/slots` and `/metrics` every poll."""

    def __init__(self, url: str, timeout: float = 3.0, api_key: str | None = None):
        self.url = url.rstrip("/")
        if "://" not in self.url:
            self.url = "http://" + self.url
        self.name = self.url
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = None
        self._props: dict | None = None

    async def _get(self, path: str, as_json: bool):
        async with self._session.get(self.url + path, headers=self.headers) as r:
            if r.status == 404 or r.status == 501:
                return None  # route not offered: its fields show as "-"
            if r.status >= 400 and path != "/props":
                raise ConnectionError(f"GET {path}: HTTP {r.status}")
            return await r.json(content_type=None) if as_json else await r.text()

    async def fetch(self) -> Snapshot:
        import aiohttp

        try:
            if self._session is None or self._session.closed:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
            if self._props is None or self._props.get("status", "ok") != "ok":
                self._props = await self._get("/props", True) or {}
            slots, metrics = await asyncio.gather(self._get("/slots", True), self._get("/metrics", False))
            return from_http(slots, metrics, self._props)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - connection loss is a state
            self._props = None  # the server may come back as another process
            msg = str(e) or type(e).__name__
            if isinstance(e, asyncio.TimeoutError):
                msg = f"no answer within {self.timeout:g} s"
            return Snapshot.lost(msg)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class FakeSource:
    """Deterministic stats: `n_slots` slots; each fetch advances a step counter and the
    clock by `dt` seconds. `fail` (a callable step -> bool, or a set of steps) makes a
    fetch return a lost connection. `freeze_at`: from that step on every fetch returns the
    same snapshot (a still picture for screenshot tests). `calls` counts fetches."""

    def __init__(self, n_slots: int = 2, dt: float = 1.0, t0: float = 1_700_000_000.0,
                 fail: Callable[[int], bool] | set | None = None, freeze_at: int | None = None):
        self.name = "fake"
        self.n_slots = n_slots
        self.dt = dt
        self.t0 = t0
        self.fail = fail
        self.freeze_at = freeze_at
        self.calls = 0

    def _failing(self, step: int) -> bool:
        if self.fail is None:
            return False
        return self.fail(step) if callable(self.fail) else step in self.fail

    def snapshot(self, step: int) -> Snapshot:
        t = self.t0 + step * self.dt
        slots = []
        for i in range(self.n_slots):
            busy = (step + i) % 3 != 0
            slots.append({
                "id": i, "state": ("decode" if (step + i) % 3 == 2 else "prefill") if busy else "idle",
                "n_ctx": 4096, "task_id": 100 + step * self.n_slots + i if busy else None,
                "n_tokens": 64 * (i + 1) + step, "n_prompt": 64 * (i + 1), "n_cached": 32 * i,
                "n_prefilled": 64 * (i + 1) - 32 * i if busy else 0, "n_decoded": 4 * step if busy else 0,
                "prompt_per_second": 100.0 + 10 * i if busy else 0.0,
                "predicted_per_second": 20.0 + i if busy else 0.0,
                "cache_source": "slot" if i % 2 == 0 else "ram", "n_checkpoints": i,
                "nbytes": 2**16 * (64 * (i + 1) + step),
            })
        stats = {
            "status": "ok", "model": "fake-model.gguf", "n_ctx": 4096 * self.n_slots,
            "n_ctx_slot": 4096, "n_slots": self.n_slots, "uptime_s": 10.0 + step * self.dt,
            "requests_total": 3 * step, "requests_processing": sum(s["state"] != "idle" for s in slots),
            "requests_deferred": step % 4, "requests_errors": step // 5, "requests_cancelled": 0,
            "prompt_tokens_total": 500 * step, "prompt_seconds_total": 5.0 * step,
            "tokens_predicted_total": int(40 * step + 10 * math.sin(step)),
            "tokens_predicted_seconds_total": 2.0 * step, "cache_tokens_total": 32 * step,
            "prompt_tokens_seconds": 100.0, "predicted_tokens_seconds": 20.0,
        }
        # the cache layers and memory
        stats.update({
            "slot_hits": 2 * step, "slot_misses": 1, "ram_hits": step, "ram_misses": 1,
            "cache_ram_bytes": 2**20 * (1 + step % 7), "cache_ram_limit_bytes": 2**23,
            "cache_ram_entries": step, "cache_ram_tokens": 100 * step, "cache_ram_inserts": step,
            "cache_ram_evictions": step // 3, "cache_save_failures": 0, "cache_restore_failures": 0,
            "checkpoints_created": step, "checkpoints_restored": step // 2, "checkpoints_erased": 0,
            "checkpoint_failures": 0, "checkpoints_count": 2, "checkpoints_bytes": 3 * 2**16,
            "forced_reprefills": step // 4, "kv_used_bytes": 2**16 * sum(s["n_tokens"] for s in slots) + 2**20 * (1 + step % 7), "kv_limit_bytes": 2**20 * 100,
            "kv_slots_max_bytes": 2**16 * 4096 * self.n_slots,
            "idle_slot_evictions": 0, "kv_full_waits": 0, "kv_full_failures": 0,
        })
        model_stats = {"experts_computed": 6 * step, "experts_skipped": 2 * step}
        return Snapshot(time=t, stats=stats, slots=tuple(slots), model_stats=model_stats)

    async def fetch(self) -> Snapshot:
        step = self.calls if self.freeze_at is None else min(self.calls, self.freeze_at)
        self.calls += 1
        if self._failing(step):
            return Snapshot.lost("fake connection refused", t=self.t0 + step * self.dt)
        return self.snapshot(step)

    async def close(self) -> None:
        pass

