"""Embeddings: each input is a task that evaluates its text on a slot (batched with the
other slots' work) and ends with the pooled, L2-normed hidden states of its tokens (the
model's pooling type from its GGUF, else the mean)."""
from __future__ import annotations

import asyncio

import numpy as np
from aiohttp import web

from ..engine import Engine, FinalEvent, GenParams
from ..errors import RequestError
from .offload import SMALL, maybe_in_worker
from .prompt import prompt_size, tokenize_prompt
from .stream import events


def _tokenize_all(eng: Engine, inputs: list) -> list[list[int]]:
    out = []
    for i, x in enumerate(inputs):
        toks = tokenize_prompt(eng, x, f"input[{i}]")
        if not toks:
            raise RequestError(f"'input[{i}]' is empty")
        out.append(toks)
    return out


async def _one(request: web.Request, eng: Engine, tokens: list[int], pooling: str) -> list[float]:
    task = eng.submit(tokens, GenParams(n_predict=0, cache_prompt=False, embedding=pooling))
    async for ev in events(request, task, None):
        if isinstance(ev, FinalEvent):
            return ev.embedding or []
    raise RuntimeError("embedding ended without a result")


async def embed_all(request: web.Request, eng: Engine, inputs: list,
                    normalize: bool = True) -> tuple[list[list[float]], int]:
    """The vectors of `inputs` (in order) and the tokens they took. `normalize=False`:
    the raw pooled states (llama-server's embd_normalize -1)."""
    big = sum(prompt_size(x) for x in inputs) > SMALL
    token_lists = await maybe_in_worker(request, big, _tokenize_all, eng, inputs)
    pooling = str(eng.info.get("pooling") or "mean")
    vectors = await asyncio.gather(*(_one(request, eng, t, pooling) for t in token_lists))
    if normalize:
        vectors = [_l2(v) for v in vectors]
    return list(vectors), sum(len(t) for t in token_lists)


def _l2(v: list[float]) -> list[float]:
    a = np.asarray(v, dtype=np.float64)
    n = float(np.linalg.norm(a))
    return (a / n).astype(np.float32).tolist() if n > 0 else list(v)
