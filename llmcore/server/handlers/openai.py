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
from .chatcore import ChatRun, make_setup, tool_setup, usage_with_reasoning
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
    return render_chat_text(eng, body)[1]


def template_kwargs(body: dict) -> dict:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("'chat_template_kwargs' must be an object")
    kwargs = {k: v for k, v in kwargs.items() if isinstance(k, str) and k not in ("messages", "tools")}
    for key in ("reasoning_effort", "enable_thinking"):  # top-level shortcuts some clients send
        if key in body and key not in kwargs and body[key] is not None:
            kwargs[key] = body[key]
    return kwargs


def render_chat_text(eng, body: dict) -> tuple[str, list[int]]:
    """The rendered prompt text and its tokens (the template gets the request's tools)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list")
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError("each message must be an object with a string 'role'")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise RequestError("message 'content' must be a string, a list of parts, or null")
    tools, _, _ = tool_setup(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    kwargs = template_kwargs(body)
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
    return text, dedupe_bos(eng, eng.tokenizer.encode(text, add_special=True, parse_special=True))


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
        tools, _, _ = tool_setup(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
        kwargs = template_kwargs(body)
        kwargs.pop("add_generation_prompt", None)
        text = eng.chat_template.render(msgs[:idx], add_generation_prompt=False, tools=tools, **kwargs)
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
        text, prompt = await off_loop(big, render_chat_text, eng, body)
        run = ChatRun(eng, make_setup(eng, body, text, prompt))
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
                if chat:
                    text += run.text_of(ev)
                    run.count(ev)
                else:
                    text += ev.text
                samples += ev.samples
                continue
            if chat:
                run.parser.parse_all(text)
                msg = {"role": "assistant", "content": run.parser.content}
                if run.parser.reasoning:
                    msg["reasoning_content"] = run.parser.reasoning
                if run.parser.calls:
                    msg["tool_calls"] = [c.openai() for c in run.parser.calls]
                    msg["content"] = run.parser.content or None
                choice = {"index": 0, "message": msg, "logprobs": lp_obj(samples),
                          "finish_reason": run.finish_reason(ev)}
                return web.json_response({**base, "object": obj, "choices": [choice],
                                          "usage": usage_with_reasoning(usage(ev), run),
                                          "timings": ev.timings.to_dict()})
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
                        deltas = [_oai_delta(d) for d in run.feed(ev)]
                        if not deltas and want_lp and ev.samples:
                            deltas = [{"content": ""}]
                        for i, delta in enumerate(deltas):
                            if first:
                                delta = {"role": "assistant", **delta}
                                first = False
                            choice = {"index": 0, "delta": delta,
                                      "logprobs": lp_obj(ev.samples) if i == 0 else None,
                                      "finish_reason": None}
                            await sse.send({**base, "object": chunk_obj, "choices": [choice]})
                        continue
                    else:
                        choice = {"index": 0, "text": ev.text, "logprobs": lp_obj(ev.samples),
                                  "finish_reason": None}
                    await sse.send({**base, "object": chunk_obj, "choices": [choice]})
                    continue
                assert isinstance(ev, FinalEvent)
                if chat:
                    for d in run.finish():
                        delta = _oai_delta(d)
                        if first:
                            delta = {"role": "assistant", **delta}
                            first = False
                        await sse.send({**base, "object": chunk_obj, "choices": [
                            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]})
                    delta = {"role": "assistant", "content": ""} if first else {}
                    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": run.finish_reason(ev)}
                    use = usage_with_reasoning(usage(ev), run)
                else:
                    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": ev.finish_reason}
                    use = usage(ev)
                await sse.send({**base, "object": chunk_obj, "choices": [choice]})
                # usage always (clients' context meters and benchmarks rely on it)
                await sse.send({**base, "object": chunk_obj, "choices": [], "usage": use,
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


def _oai_delta(d) -> dict:
    if d.kind == "content":
        return {"content": d.text}
    if d.kind == "reasoning":
        return {"reasoning_content": d.text}
    if d.kind == "call":
        return {"tool_calls": [{"index": d.index, "id": d.id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)
