"""llama-server native routes: /health, /props, /slots (and POST /slots/{id}?action=),
/metrics, /tokenize, /detokenize, /completion."""
from __future__ import annotations

import asyncio

from aiohttp import web

from ... import __version__
from ...errors import RequestError
from ...metrics import slots_json, to_prometheus
from ..encoders.native import NativeEncoder, generation_settings
from ..errors import TooLargeError, UnsupportedMediaTypeError, error_response
from ..keys import CONFIG, ENGINE, ready_engine
from ..offload import SMALL, json_answer, maybe_in_worker
from ..embeddings import embed_all
from ..prompt import chat_prompt, fewest_tokens, fim_tokens, infill_prompt, text_prompt
from ..requests.body import JSON_ONLY, accepts, read_json
from ..requests.embeddings import EMBEDDING, inputs_of
from ..requests.fields import gen_params, get_bool
from ..requests.chat import APPLY_TEMPLATE
from ..requests.text import COMPLETION, DETOKENIZE, INFILL, SLOT_ACTION, TOKENIZE
from ..stream import respond


async def health(request: web.Request) -> web.Response:
    ready_engine(request)  # 503 while loading or when the load failed
    return web.json_response({"status": "ok"})


async def props(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    body = {
        "default_generation_settings": {**generation_settings(eng), "params": generation_settings(eng)},
        "total_slots": eng.cfg.n_parallel,
        "model_path": eng.info.get("path", ""),
        "model_alias": eng.model_name,
        "n_ctx": eng.n_ctx_slot,
        "max_model_len": eng.n_ctx_slot,
        "n_ctx_total": eng.n_ctx,
        "chat_template": eng.info.get("chat_template") or "",
        "chat_template_origin": eng.info.get("chat_template_origin", "gguf"),
        "warnings": [w for w in (eng.info.get("template_warning"),) if w],
        "reasoning_format": request.app[CONFIG].reasoning_format,
        "api_key_required": bool(request.app[CONFIG].api_keys),
        "infill": fim_tokens(eng.tokenizer) is not None,
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
    }
    fleet = eng.stats().replicas  # llmcore serve --replicas: each replica's state
    if fleet:
        body["replicas"] = [{"replica": i, "status": r.status, "n_slots": r.n_slots,
                             "requests_processing": r.requests_processing,
                             "requests_deferred": r.requests_deferred, "requests_total": r.requests_total}
                            for i, r in enumerate(fleet)]
    return web.json_response(body)


async def slots(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    st = eng.stats()
    if request.query.get("fail_on_no_slot") in ("1", "true") and all(s.state != "idle" for s in st.slots):
        return error_response(503, "no slot available")
    return web.json_response(slots_json(st))


async def slot_action(request: web.Request) -> web.Response:
    """POST /slots/{id}?action=save|restore (body {"filename"}) | erase: llama-server's
    result objects; deferred while the slot is busy (llmcore.engine.slot_files)."""
    eng = ready_engine(request)
    action = request.query.get("action", "")
    try:
        slot_id = int(request.match_info["id_slot"])
    except ValueError:
        raise RequestError(f"Invalid slot id {request.match_info['id_slot']!r}") from None
    filename = None
    if action in ("save", "restore"):
        if request.content_type != "application/json":
            raise UnsupportedMediaTypeError("the body must be sent as Content-Type: application/json")
        filename = (await read_json(request, SLOT_ACTION)).get("filename")
        if filename is None:
            raise RequestError("'filename' is required")
    elif request.content_type != "application/json" and request.can_read_body:
        raise UnsupportedMediaTypeError("the body must be sent as Content-Type: application/json")
    fut = eng.slot_action(action, slot_id, filename)
    return web.json_response(await asyncio.wrap_future(fut))


slot_action.media_types = (*JSON_ONLY, "application/octet-stream")  # erase needs no body


async def metrics(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    return web.Response(body=to_prometheus(eng.stats()).encode(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def _tokens(eng, content: str, add_special: bool, parse_special: bool, with_pieces: bool) -> dict:
    ids = eng.tokenizer.encode(content, add_special=add_special, parse_special=parse_special)
    if not with_pieces:
        return {"tokens": [int(t) for t in ids]}
    toks = []
    for t in ids:
        raw = eng.tokenizer.token_to_piece(t)
        raw = raw.encode() if isinstance(raw, str) else bytes(raw)
        try:
            p = raw.decode("utf-8")
        except UnicodeDecodeError:
            p = list(raw)
        toks.append({"id": int(t), "piece": p})
    return {"tokens": toks}


@accepts(TOKENIZE)
async def tokenize(request: web.Request, body: dict) -> web.Response:
    eng = ready_engine(request)
    content = body["content"]
    n_ctx = int(eng.n_ctx_slot or 0)
    # what no context here can hold is not worth tokenizing: refuse before the work
    if n_ctx and len(content) > n_ctx and (least := fewest_tokens(eng, content)) > n_ctx:
        raise TooLargeError(f"'content' is at least {least} tokens, more than the context ({n_ctx})")
    big = len(content) > SMALL
    out = await maybe_in_worker(request, big, _tokens, eng, content, get_bool(body, "add_special", False),
                                get_bool(body, "parse_special", True), get_bool(body, "with_pieces", False))
    return await json_answer(request, out, big)


@accepts(DETOKENIZE)
async def detokenize(request: web.Request, body: dict) -> web.Response:
    eng = ready_engine(request)
    ids = [int(t) for t in body["tokens"]]
    n_ctx = int(eng.n_ctx_slot or 0)
    if n_ctx and len(ids) > n_ctx:
        raise TooLargeError(f"'tokens' holds {len(ids)} tokens, more than the context ({n_ctx})")
    nv = int(eng.info.get("n_vocab") or 0)
    if nv and any(t < 0 or t >= nv for t in ids):
        raise RequestError(f"token id out of range (vocabulary size {nv})")
    big = len(ids) > SMALL // 4
    text = await maybe_in_worker(request, big, eng.tokenizer.decode, ids)
    return await json_answer(request, {"content": text}, big)


@accepts(COMPLETION)
async def completion(request: web.Request, body: dict) -> web.StreamResponse:
    """POST /completion (llama-server native shape)."""
    eng = ready_engine(request)
    prompt = await text_prompt(request, eng, body)
    params = gen_params(body, eng, prompt=prompt)
    stream = get_bool(body, "stream", False)
    return_tokens = get_bool(body, "return_tokens", False)
    task = eng.submit(prompt.tokens, params)  # validates (400) before any byte is sent
    return await respond(request, task, NativeEncoder(eng, prompt, params, task, return_tokens), stream)


@accepts(APPLY_TEMPLATE)
async def apply_template(request: web.Request, body: dict) -> web.Response:
    """POST /apply-template: the prompt a chat request would be given, without generating."""
    eng = ready_engine(request)
    prompt = await chat_prompt(request, eng, body, checkpoint=False)
    return web.json_response({"prompt": prompt.text})


@accepts(INFILL)
async def infill(request: web.Request, body: dict) -> web.StreamResponse:
    """POST /infill (llama-server's fill-in-the-middle): input_prefix, input_suffix,
    input_extra files, prompt; answered like /completion."""
    eng = ready_engine(request)
    prompt = await infill_prompt(request, eng, body)
    params = gen_params(body, eng, prompt=prompt)
    stream = get_bool(body, "stream", False)
    return_tokens = get_bool(body, "return_tokens", False)
    task = eng.submit(prompt.tokens, params)
    return await respond(request, task, NativeEncoder(eng, prompt, params, task, return_tokens), stream)


@accepts(EMBEDDING)
async def embedding(request: web.Request, body: dict) -> web.Response:
    """POST /embedding (llama-server): [{"index": i, "embedding": [[...]]}] per input."""
    eng = ready_engine(request)
    value = body.get("content") if body.get("content") is not None else body.get("input")
    if value is None:
        raise RequestError("'content' is required")
    vectors, _ = await embed_all(request, eng, inputs_of(value), normalize=body.get("embd_normalize", 2) != -1)
    return web.json_response([{"index": i, "embedding": [v]} for i, v in enumerate(vectors)])
