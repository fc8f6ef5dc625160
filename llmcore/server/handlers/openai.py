"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""
from __future__ import annotations

from aiohttp import web

from ... import __version__
from ...engine import FinalEvent, TokenEvent
from ...errors import RequestError
from ..errors import exception_body, read_json
from ..keys import ENGINE
from ..params import (BIG_TEXT, check_text_fits, dedupe_bos, gen_params, get_bool, off_loop,
                      prompt_size, tokenize_prompt)
from ..sse import ClientGone, SSEWriter
from .common import events, new_id, now, oai_chat_logprobs, ready_engine, usage

FINGERPRINT = f"llmcore-{__version__}"


async def models(request: web.Request) -> web.Response:
    eng = request.app[ENGINE]
    info = eng.info
    meta = {k: info.get(k) for k in ("n_vocab", "n_ctx_train", "n_embd", "n_params", "size")}
    return web.json_response({
        "object": "list",
        "data": [{"id": eng.model_name, "object": "model", "created": int(eng.t_start),
                  "owned_by": "llmcore", "meta": meta}],
    })


def render_chat(eng, body: dict) -> list[int]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list")
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError("each message must be an object with a string 'role'")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise RequestError("message 'content' must be a string, a list of parts, or null")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("'tools' must be a list")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("'chat_template_kwargs' must be an object")
    kwargs = {k: v for k, v in kwargs.items() if isinstance(k, str) and k not in ("messages", "tools")}
    add_gen = kwargs.pop("add_generation_prompt", True)
    tmpl = eng.chat_template
    if tmpl is None:
        text = "".join(f"<|im_start|>{m['role']}\n{_text(m.get('content'))}<|im_end|>\n" for m in msgs)
        text += "<|im_start|>assistant\n"
    else:
        try:
            text = _render(tmpl, msgs, add_gen, tools, kwargs)
        except RequestError:
            raise
        except Exception as e:  # noqa: BLE001 - template errors are the request's fault here
            raise RequestError(f"chat template error: {e}") from e
    check_text_fits(eng, text)
    return dedupe_bos(eng, eng.tokenizer.encode(text, add_special=True, parse_special=True))


def _render(tmpl, msgs, add_gen, tools, kwargs) -> str:
    """Render; a template that concatenates `content` fails on the null content of an
    assistant turn that only made tool calls (valid OpenAI input): retry with "" there."""
    try:
        return tmpl.render(msgs, add_generation_prompt=add_gen, tools=tools, **kwargs)
    except RequestError:
        if not any(isinstance(m, dict) and m.get("content") is None for m in msgs):
            raise
    msgs = [{**m, "content": ""} if m.get("content") is None else m for m in msgs]
    return tmpl.render(msgs, add_generation_prompt=add_gen, tools=tools, **kwargs)


def last_user_start(eng, body: dict, prompt: list[int]) -> int | None:
    """Token position where the last user message starts (a context checkpoint goes there):
    the common prefix of the prompt and the conversation rendered without that message.
    Only computed for models that need checkpoints (sliding window, recurrent)."""
    if not getattr(eng, "_needs_ckpt", False) or eng.chat_template is None:
        return None
    msgs = body.get("messages") or []
    idx = max((i for i, m in enumerate(msgs) if isinstance(m, dict) and m.get("role") == "user"),
              default=None)
    if not idx:
        return None
    try:
        kwargs = body.get("chat_template_kwargs") or {}
        text = eng.chat_template.render(msgs[:idx], add_generation_prompt=False,
                                        tools=body.get("tools"), **kwargs)
        head = dedupe_bos(eng, eng.tokenizer.encode(text, add_special=True, parse_special=True))
    except Exception:  # noqa: BLE001 - only a hint for checkpoint placement
        return None
    from ...engine import common_prefix

    n = common_prefix(head, prompt)
    return n if 0 < n < len(prompt) else None


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    eng = ready_engine(request)
    body = await read_json(request)
    if chat:
        big = len(await request.read()) > BIG_TEXT
        prompt = await off_loop(big, render_chat, eng, body)
    else:
        if "prompt" not in body:
            raise RequestError("'prompt' is required")
        if body.get("echo") or body.get("best_of") not in (None, 1) or body.get("suffix"):
            raise RequestError("'echo', 'best_of' and 'suffix' are not supported")
        big = prompt_size(body["prompt"]) > BIG_TEXT
        prompt = await off_loop(big, tokenize_prompt, eng, body["prompt"])
    params = gen_params(body, eng, oai=True)
    if chat:
        params.checkpoint_at = last_user_start(eng, body, prompt)
    stream = get_bool(body, "stream", False)
    want_lp = params.sampling.n_probs > 0
    task = eng.submit(prompt, params)
    cid = new_id("chatcmpl" if chat else "cmpl")
    created = now()
    obj = "chat.completion" if chat else "text_completion"
    base = {"id": cid, "created": created, "model": eng.model_name, "system_fingerprint": FINGERPRINT}

    def lp_obj(samples):
        if not want_lp:
            return None
        if chat:
            return {"content": oai_chat_logprobs(eng.tokenizer, samples)}
        items = oai_chat_logprobs(eng.tokenizer, samples)
        return {"tokens": [x["token"] for x in items], "token_logprobs": [x["logprob"] for x in items],
                "top_logprobs": [{t["token"]: t["logprob"] for t in x["top_logprobs"]} for x in items],
                "text_offset": []}

    if not stream:
        text, samples = "", []
        async for ev in events(request, task, None):
            if isinstance(ev, TokenEvent):
                text += ev.text
                samples += ev.samples
                continue
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "logprobs": lp_obj(samples), "finish_reason": ev.finish_reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": lp_obj(samples),
                          "finish_reason": ev.finish_reason}
            return web.json_response({**base, "object": obj, "choices": [choice],
                                      "usage": usage(ev), "timings": ev.timings.to_dict()})
        raise RuntimeError("generation ended without a result")

    sse = SSEWriter(request)
    chunk_obj = "chat.completion.chunk" if chat else "text_completion"
    first = True
    try:
        await sse.prepare()
        try:
            async for ev in events(request, task, sse):
                if isinstance(ev, TokenEvent):
                    if not ev.text and not (want_lp and ev.samples):
                        continue
                    if chat:
                        delta = {"content": ev.text}
                        if first:
                            delta = {"role": "assistant", "content": ev.text}
                            first = False
                        choice = {"index": 0, "delta": delta, "logprobs": lp_obj(ev.samples),
                                  "finish_reason": None}
                    else:
                        choice = {"index": 0, "text": ev.text, "logprobs": lp_obj(ev.samples),
                                  "finish_reason": None}
                    await sse.send({**base, "object": chunk_obj, "choices": [choice]})
                    continue
                assert isinstance(ev, FinalEvent)
                if chat:
                    delta = {"role": "assistant", "content": ""} if first else {}
                    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": ev.finish_reason}
                else:
                    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": ev.finish_reason}
                await sse.send({**base, "object": chunk_obj, "choices": [choice]})
                # usage always (clients' context meters and benchmarks rely on it)
                await sse.send({**base, "object": chunk_obj, "choices": [], "usage": usage(ev),
                                "timings": ev.timings.to_dict()})
                await sse.done()
        except ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001 - headers are out: report in-band
            await sse.send(exception_body(exc)[1])
            await sse.done()
    except ClientGone:
        task.close()
    return await sse.close()


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)
