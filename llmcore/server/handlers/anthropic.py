"""Anthropic Messages: POST /v1/messages and /v1/messages/count_tokens (for Claude Code).

The request becomes an OpenAI-style chat (system, text / tool_use / tool_result / thinking
blocks, tools with input_schema), rendered by the model's template; the output is parsed by
llmcore.toolcalls like chat/completions. Errors use Anthropic's envelope."""
from __future__ import annotations

import json

from aiohttp import web

from ...engine import FinalEvent, TokenEvent
from ...errors import ContextFullError, LLMCoreError, RequestError
from ..errors import read_json
from ..params import BIG_TEXT, gen_params, get_bool, off_loop
from ..sse import ClientGone, SSEWriter
from .chatcore import ChatRun, make_setup
from .common import events, new_id, ready_engine
from .openai import last_user_start, render_chat_text

BILLING = "x-anthropic-billing-header"


def _err(status: int, type_: str, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": type_, "message": message}}, status=status)


def _error_of(exc: BaseException) -> tuple[int, dict]:
    if isinstance(exc, ContextFullError) and getattr(exc, "n_ctx", None) is not None:
        msg = f"prompt is too long: {exc.n_prompt_tokens} tokens > {exc.n_ctx} maximum"
        return 400, {"type": "invalid_request_error", "message": msg}
    if isinstance(exc, RequestError):
        return 400, {"type": "invalid_request_error", "message": str(exc)}
    if isinstance(exc, LLMCoreError) and str(exc) == "Loading model":
        return 529, {"type": "overloaded_error", "message": "Loading model"}
    return 500, {"type": "api_error", "message": f"{type(exc).__name__}: {exc}" if not isinstance(exc, LLMCoreError) else str(exc)}


def _blocks(content, where: str) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or a list of content blocks")
    return [b if isinstance(b, dict) else {"type": "text", "text": str(b)} for b in content]


def _text_of(content) -> str:
    return "\n".join(b.get("text", "") for b in _blocks(content, "tool_result")
                     if b.get("type") == "text" and isinstance(b.get("text"), str))


def to_chat(body: dict) -> dict:
    """An Anthropic Messages request as a chat/completions body."""
    msgs: list[dict] = []
    system = body.get("system")
    if system is not None:
        parts = [b.get("text", "") for b in _blocks(system, "system")
                 if b.get("type", "text") == "text" and isinstance(b.get("text"), str)
                 and not b.get("text", "").lstrip().startswith(BILLING)]  # changes every request
        if parts:
            msgs.append({"role": "system", "content": "\n".join(parts)})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages: must be a non-empty list")
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise RequestError(f"messages.{i}: role must be 'user' or 'assistant'")
        texts, calls, reasoning = [], [], []
        for b in _blocks(m.get("content"), f"messages.{i}"):
            t = b.get("type")
            if t == "text" and isinstance(b.get("text"), str):
                texts.append(b["text"])
            elif t == "tool_use":
                calls.append({"id": b.get("id"), "type": "function", "function": {
                    "name": b.get("name"), "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}})
            elif t == "tool_result":
                out = _text_of(b.get("content"))
                if b.get("is_error"):
                    out = "Error: " + out
                msgs.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": out})
            elif t == "thinking" and isinstance(b.get("thinking"), str):
                reasoning.append(b["thinking"])
            # images, documents, redacted thinking: not rendered (text-only models)
        if m["role"] == "assistant":
            msg = {"role": "assistant", "content": "\n".join(texts) if texts or not calls else None}
            if calls:
                msg["tool_calls"] = calls
            if reasoning:
                msg["reasoning_content"] = "\n".join(reasoning)
            msgs.append(msg)
        elif texts:
            msgs.append({"role": "user", "content": "\n".join(texts)})
    out = {"messages": msgs}
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description", ""),
            "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}}
            for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)
            and t.get("type") in (None, "custom")]
    tc = body.get("tool_choice")
    if isinstance(tc, dict):
        kind = tc.get("type")
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(kind, "auto")
        if kind == "tool" and isinstance(tc.get("name"), str):
            out["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
        if tc.get("disable_parallel_tool_use") is True:
            out["parallel_tool_calls"] = False
    th = body.get("thinking")
    if isinstance(th, dict) and th.get("type") == "disabled":
        out["chat_template_kwargs"] = {"enable_thinking": False}
    for k in ("temperature", "top_p", "top_k", "stream", "cache_prompt", "seed"):
        if k in body:
            out[k] = body[k]
    if "max_tokens" in body:
        out["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences") is not None:
        out["stop"] = body["stop_sequences"]
    return out


def _usage(final: FinalEvent, run: ChatRun | None = None) -> dict:
    cached = final.timings.cache_n
    return {"input_tokens": max(0, final.n_prompt - cached), "output_tokens": final.n_predicted,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def _stop(final: FinalEvent, run: ChatRun) -> tuple[str, str | None]:
    if run.parser.calls:
        return "tool_use", None
    if final.stop_type == "limit":
        return "max_tokens", None
    if final.stop_type == "word":
        return "stop_sequence", final.stopping_word
    return "end_turn", None


async def count_tokens(request: web.Request) -> web.Response:
    try:
        eng = ready_engine(request)
        body = await read_json(request)
        chat = to_chat(body)
        big = len(await request.read()) > BIG_TEXT
        _, ids = await off_loop(big, render_chat_text, eng, chat)
        return web.json_response({"input_tokens": len(ids)})
    except (RequestError, LLMCoreError) as exc:
        status, err = _error_of(exc)
        return _err(status, err["type"], err["message"])


async def messages(request: web.Request) -> web.StreamResponse:
    try:
        eng = ready_engine(request)
        body = await read_json(request)
        chat = to_chat(body)
        big = len(await request.read()) > BIG_TEXT
        text, prompt = await off_loop(big, render_chat_text, eng, chat)
        run = ChatRun(eng, make_setup(eng, chat, text, prompt))
        params = gen_params(chat, eng, oai=True)
        params.checkpoint_at = last_user_start(eng, chat, prompt)
        stream = get_bool(chat, "stream", False)
        task = eng.submit(prompt, params)
    except (RequestError, LLMCoreError) as exc:
        status, err = _error_of(exc)
        return _err(status, err["type"], err["message"])
    mid = new_id("msg").replace("-", "_")
    model = body.get("model") if isinstance(body.get("model"), str) else eng.model_name
    head = {"id": mid, "type": "message", "role": "assistant", "model": model}

    if not stream:
        out = ""
        try:
            async for ev in events(request, task, None):
                if isinstance(ev, TokenEvent):
                    out += run.text_of(ev)
                    run.count(ev)
                    continue
                p = run.parser.parse_all(out)
                content = []
                if p.reasoning:
                    content.append({"type": "thinking", "thinking": p.reasoning, "signature": ""})
                if p.content:
                    content.append({"type": "text", "text": p.content})
                for c in p.calls:
                    try:
                        args = json.loads(c.arguments or "{}")
                    except ValueError:
                        args = {}
                    content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": args})
                reason, seq = _stop(ev, run)
                return web.json_response({**head, "content": content, "stop_reason": reason,
                                          "stop_sequence": seq, "usage": _usage(ev)})
        except (RequestError, LLMCoreError) as exc:
            status, err = _error_of(exc)
            return _err(status, err["type"], err["message"])
        raise RuntimeError("generation ended without a result")

    sse = SSEWriter(request)
    state = {"index": -1, "open": None}

    async def close_block():
        if state["open"] is not None:
            await sse.event("content_block_stop", {"type": "content_block_stop", "index": state["index"]})
            state["open"] = None

    async def open_block(kind: str, block: dict):
        await close_block()
        state["index"] += 1
        state["open"] = kind
        await sse.event("content_block_start", {"type": "content_block_start", "index": state["index"],
                                                "content_block": block})

    async def send(d):
        if d.kind == "reasoning":
            if state["open"] != "thinking":
                await open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            delta = {"type": "thinking_delta", "thinking": d.text}
        elif d.kind == "content":
            if state["open"] != "text":
                await open_block("text", {"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": d.text}
        elif d.kind == "call":
            await open_block("tool_use", {"type": "tool_use", "id": d.id, "name": d.name, "input": {}})
            return
        else:
            delta = {"type": "input_json_delta", "partial_json": d.text}
        await sse.event("content_block_delta", {"type": "content_block_delta", "index": state["index"],
                                                "delta": delta})

    try:
        await sse.prepare()
        await sse.event("message_start", {"type": "message_start", "message": {
            **head, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": len(prompt), "output_tokens": 0,
                      "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}})
        try:
            async for ev in events(request, task, sse):
                if isinstance(ev, TokenEvent):
                    for d in run.feed(ev):
                        await send(d)
                    continue
                for d in run.finish():
                    await send(d)
                await close_block()
                reason, seq = _stop(ev, run)
                await sse.event("message_delta", {"type": "message_delta",
                                                  "delta": {"stop_reason": reason, "stop_sequence": seq},
                                                  "usage": _usage(ev)})
                await sse.event("message_stop", {"type": "message_stop"})
        except ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001 - headers are out: report in-band
            _, err = _error_of(exc)
            await sse.event("error", {"type": "error", "error": err})
    except ClientGone:
        task.close()
    return await sse.close()
