"""Helpers shared by the generation handlers: engine access, event loop, probabilities."""
from __future__ import annotations

import asyncio
import time
import uuid

from aiohttp import web

from ...engine import Engine, FinalEvent, Task
from ...errors import LLMCoreError
from ..keys import CONFIG, ENGINE
from ..sse import ClientGone, SSEWriter, client_gone


def ready_engine(request: web.Request) -> Engine:
    eng = request.app[ENGINE]
    if eng.status == "loading":
        raise LLMCoreError("Loading model")
    if eng.status != "ok":
        raise LLMCoreError(f"model failed to load: {eng.load_error}")
    return eng


def keepalive_s(request: web.Request) -> float:
    return float(getattr(request.app[CONFIG], "keepalive_s", 5.0))


async def events(request: web.Request, task: Task, sse: SSEWriter | None):
    """The task's events; while none come, keep the stream alive (comment lines) or, for a
    plain response, watch for the client going away. Cancels the task when left early."""
    try:
        while True:
            try:
                ev = await task.next_event(timeout=keepalive_s(request))
            except asyncio.TimeoutError:
                if sse is not None:
                    await sse.comment()
                elif client_gone(request):
                    raise ClientGone() from None
                continue
            if isinstance(ev, FinalEvent):
                yield ev
                return
            if sse is None and client_gone(request):
                # a plain response whose client left: stop generating for nobody
                raise ClientGone()
            yield ev
    finally:
        task.close()


def piece(tokenizer, token: int) -> tuple[str, list[int]]:
    p = tokenizer.token_to_piece(token)
    if isinstance(p, str):
        b = p.encode("utf-8")
        return p, list(b)
    b = bytes(p)
    return b.decode("utf-8", errors="replace"), list(b)


def _logprob_entries(tokenizer, samples, with_id: bool) -> list[dict]:
    def entry(token: int, logprob: float) -> dict:
        text, b = piece(tokenizer, token)
        e = {"id": token} if with_id else {}
        e.update(token=text, logprob=logprob, bytes=b)
        return e

    return [{**entry(s.token, s.logprob), "top_logprobs": [entry(t.id, t.logprob) for t in s.top or []]}
            for s in samples]


def native_probs(tokenizer, samples) -> list[dict]:
    """llama-server's native form (with token ids)."""
    return _logprob_entries(tokenizer, samples, with_id=True)


def oai_chat_logprobs(tokenizer, samples) -> list[dict]:
    """OpenAI chat ``logprobs.content`` form (no ids)."""
    return _logprob_entries(tokenizer, samples, with_id=False)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(final: FinalEvent) -> dict:
    return {
        "prompt_tokens": final.n_prompt,
        "completion_tokens": final.n_predicted,
        "total_tokens": final.n_prompt + final.n_predicted,
        "prompt_tokens_details": {"cached_tokens": final.timings.cache_n},
    }
