"""llama-server native routes: /health, /props, /slots, /metrics, /tokenize, /detokenize,
/completion."""
from __future__ import annotations

from aiohttp import web

from ... import __version__
from ...errors import RequestError
from ...metrics import slots_json, to_prometheus
from ..encoders.native import NativeEncoder, generation_settings
from ..errors import error_response
from ..keys import ENGINE, ready_engine
from ..prompt import text_prompt
from ..requests.body import read_json
from ..requests.fields import gen_params, get_bool
from ..stream import respond


async def health(request: web.Request) -> web.Response:
    ready_engine(request)  # 503 while loading or when the load failed
    return web.json_response({"status": "ok"})


async def props(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    return web.json_response({
        "default_generation_settings": {**generation_settings(eng), "params": generation_settings(eng)},
        "total_slots": eng.cfg.n_parallel,
        "model_path": eng.info.get("path", ""),
        "model_alias": eng.model_name,
        "n_ctx": eng.n_ctx_slot,
        "chat_template": eng.info.get("chat_template") or "",
        "modalities": {"vision": False, "audio": False},
        "build_info": f"llmcore {__version__}",
        "is_sleeping": False,
        "status": eng.status,
        "cache": {
            "cache_prompt": True,
            "cache_ram_mib": eng.cfg.cache_ram_mib,
            "cache_idle_slots": eng.cfg.cache_idle_slots,
            "ctx_checkpoints": eng.cfg.ctx_checkpoints,
            "checkpoint_every_n_tokens": eng.cfg.checkpoint_every_n_tokens,
            "slot_prompt_similarity": eng.cfg.slot_prompt_similarity,
            "n_ctx_total": eng.n_ctx,
            "memory": dict(eng.memory_plan or {}),
        },
    })


async def slots(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    st = eng.stats()
    if request.query.get("fail_on_no_slot") in ("1", "true") and all(s.state != "idle" for s in st.slots):
        return error_response(503, "no slot available")
    return web.json_response(slots_json(st))


async def metrics(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    return web.Response(body=to_prometheus(eng.stats()).encode(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def tokenize(request: web.Request) -> web.Response:
    eng = ready_engine(request)
    body = await read_json(request)
    content = body.get("content")
    if not isinstance(content, str):
        raise RequestError("'content' must be a string")
    ids = eng.tokenizer.encode(content, add_special=get_bool(body, "add_special", False),
                               parse_special=get_bool(body, "parse_special", True))
    if get_bool(body, "with_pieces", False):
        toks = []
        for t in ids:
            raw = eng.tokenizer.token_to_piece(t)
            raw = raw.encode() if isinstance(raw, str) else bytes(raw)
            try:
                p = raw.decode("utf-8")
            except UnicodeDecodeError:
                p = list(raw)
            toks.append({"id": int(t), "piece": p})
        return web.json_response({"tokens": toks})
    return web.json_response({"tokens": [int(t) for t in ids]})


async def detokenize(request: web.Request) -> web.Response:
    eng = ready_engine(request)
    body = await read_json(request)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise RequestError("'tokens' must be a list of token ids")
    nv = int(eng.info.get("n_vocab") or 0)
    if nv and any(t < 0 or t >= nv for t in ids):
        raise RequestError(f"token id out of range (vocabulary size {nv})")
    return web.json_response({"content": eng.tokenizer.decode(ids)})


async def completion(request: web.Request) -> web.StreamResponse:
    """POST /completion (llama-server native shape)."""
    eng = ready_engine(request)
    body = await read_json(request)
    if "prompt" not in body:
        raise RequestError("'prompt' is required")
    prompt = await text_prompt(eng, body["prompt"])
    params = gen_params(body, eng)
    stream = get_bool(body, "stream", False)
    return_tokens = get_bool(body, "return_tokens", False)
    task = eng.submit(prompt.tokens, params)  # validates (400) before any byte is sent
    return await respond(request, task, NativeEncoder(eng, prompt, params, task, return_tokens), stream)
