"""llama-server native routes: /health, /props, /slots, /metrics, /tokenize, /detokenize,
/completion."""
from __future__ import annotations

from aiohttp import web

from ... import __version__
from ...engine import FinalEvent, TokenEvent
from ...errors import RequestError
from ...metrics import slots_json, to_prometheus
from ..errors import error_response, exception_body, read_json
from ..keys import ENGINE
from ..params import BIG_TEXT, gen_params, get_bool, off_loop, prompt_size, tokenize_prompt
from ..sse import ClientGone, SSEWriter
from .common import events, native_probs, piece, ready_engine


async def health(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    if eng.status == "loading":
        return error_response(503, "Loading model")
    if eng.status != "ok":
        return error_response(500, f"model failed to load: {eng.load_error}")
    return web.json_response({"status": "ok"})


def generation_settings(eng, params=None) -> dict:
    gp = params
    sp = gp.sampling if gp else eng.cfg.sampling
    d = sp.to_dict()
    d.update({
        "n_ctx": eng.n_ctx_slot,
        "n_predict": gp.n_predict if gp else eng.cfg.n_predict,
        "stop": gp.stop if gp else [],
        "ignore_eos": gp.ignore_eos if gp else False,
        "cache_prompt": gp.cache_prompt if gp else True,
        "id_slot": gp.id_slot if gp else -1,
        "model": eng.model_name,
    })
    return d


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
            "memory": dict(getattr(eng, "memory_plan", {}) or {}),
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
    prompt = await off_loop(prompt_size(body["prompt"]) > BIG_TEXT, tokenize_prompt, eng, body["prompt"])
    params = gen_params(body, eng)
    stream = get_bool(body, "stream", False)
    return_tokens = get_bool(body, "return_tokens", False)
    want_probs = params.sampling.n_probs > 0
    task = eng.submit(prompt, params)  # validates (400) before any byte is sent

    def final_obj(content: str, tokens: list[int], final: FinalEvent, samples) -> dict:
        d = {
            "index": 0, "content": content, "tokens": tokens if return_tokens else [],
            "id_slot": final.slot_id, "stop": True, "model": eng.model_name,
            "tokens_predicted": final.n_predicted, "tokens_evaluated": final.n_prompt,
            "generation_settings": generation_settings(eng, params), "prompt": "",
            "has_new_line": "\n" in content, "truncated": final.truncated,
            "stop_type": final.stop_type, "stopping_word": final.stopping_word,
            "tokens_cached": final.n_prompt + final.n_predicted,
            "timings": final.timings.to_dict(),
        }
        if want_probs:
            d["completion_probabilities"] = native_probs(eng.tokenizer, samples)
        return d

    if not stream:
        text, toks, samples = "", [], []
        async for ev in events(request, task, None):
            if isinstance(ev, TokenEvent):
                text += ev.text
                toks += ev.tokens
                samples += ev.samples
            else:
                return web.json_response(final_obj(text, toks, ev, samples))
        raise RuntimeError("generation ended without a result")

    sse = SSEWriter(request)
    n = 0
    try:
        await sse.prepare()
        try:
            async for ev in events(request, task, sse):
                if isinstance(ev, TokenEvent):
                    n += len(ev.tokens)
                    if not ev.text and not return_tokens and not want_probs:
                        continue
                    chunk = {"index": 0, "content": ev.text, "tokens": ev.tokens if return_tokens else [],
                             "stop": False, "id_slot": task.slot_id, "tokens_predicted": n,
                             "tokens_evaluated": len(prompt)}
                    if want_probs:
                        chunk["completion_probabilities"] = native_probs(eng.tokenizer, ev.samples)
                    await sse.send(chunk)
                else:
                    await sse.send(final_obj("", [], ev, []))
        except ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001 - headers are out: report in-band
            await sse.send(exception_body(exc)[1])
    except ClientGone:
        task.close()
    return await sse.close()
