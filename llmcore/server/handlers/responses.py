"""OpenAI Responses API, stateless: POST /v1/responses (for Codex CLI).

`instructions` + `input` (a string or items: messages, function_call,
function_call_output, reasoning) become a chat rendered by the model's template; function
tools are kept, other tool types skipped; the output becomes reasoning / message /
function_call items, streamed with the response.* event lifecycle."""
from __future__ import annotations

from aiohttp import web

from ...engine import FinalEvent, TokenEvent
from ...errors import ContextFullError, RequestError
from ..errors import exception_body, read_json
from ..params import BIG_TEXT, gen_params, get_bool, off_loop
from ..sse import ClientGone, SSEWriter
from .chatcore import ChatRun, make_setup
from .common import events, new_id, now, ready_engine
from .openai import last_user_start, render_chat_text


def _text(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or a list of parts")
    return "\n".join(p.get("text", "") for p in content
                     if isinstance(p, dict) and isinstance(p.get("text"), str))


def to_chat(body: dict) -> dict:
    system: list[str] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        system.append(body["instructions"])
    msgs: list[dict] = []
    inp = body.get("input")
    if isinstance(inp, str):
        inp = [{"type": "message", "role": "user", "content": inp}]
    if not isinstance(inp, list) or not inp:
        raise RequestError("'input' must be a string or a non-empty list of items")
    pending_reasoning = None
    for i, it in enumerate(inp):
        if not isinstance(it, dict):
            raise RequestError(f"input[{i}] must be an object")
        t = it.get("type", "message")
        if t == "message":
            role = it.get("role")
            text = _text(it.get("content"), f"input[{i}]")
            if role in ("system", "developer"):
                system.append(text)
            elif role in ("user", "assistant"):
                m = {"role": role, "content": text}
                if role == "assistant" and pending_reasoning:
                    m["reasoning_content"], pending_reasoning = pending_reasoning, None
                msgs.append(m)
            else:
                raise RequestError(f"input[{i}]: unknown role {role!r}")
        elif t == "function_call":
            call = {"id": it.get("call_id") or it.get("id"), "type": "function",
                    "function": {"name": it.get("name"), "arguments": it.get("arguments") or "{}"}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant" and not any(
                    m["role"] == "tool" for m in msgs[msgs.index(last):]):
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                m = {"role": "assistant", "content": None, "tool_calls": [call]}
                if pending_reasoning:
                    m["reasoning_content"], pending_reasoning = pending_reasoning, None
                msgs.append(m)
        elif t == "function_call_output":
            out = it.get("output")
            msgs.append({"role": "tool", "tool_call_id": it.get("call_id"),
                         "content": out if isinstance(out, str) else _text(out, f"input[{i}]")})
        elif t == "reasoning":
            parts = (it.get("content") or []) + (it.get("summary") or [])
            text = _text([p for p in parts if isinstance(p, dict)], f"input[{i}]")
            pending_reasoning = text or None
        # other item types (images, web search results, ...) are not rendered
    if system:
        msgs.insert(0, {"role": "system", "content": "\n\n".join(system)})
    out: dict = {"messages": msgs}
    tools = body.get("tools")
    if isinstance(tools, list):
        out["tools"] = [{"type": "function", "function": {
            "name": t["name"], "description": t.get("description", ""),
            "parameters": t.get("parameters") or {"type": "object", "properties": {}}}}
            for t in tools if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)]
    for k in ("tool_choice", "parallel_tool_calls", "temperature", "top_p", "top_k", "seed",
              "stream", "chat_template_kwargs", "cache_prompt"):
        if k in body:
            out[k] = body[k]
    if isinstance(out.get("tool_choice"), dict) and out["tool_choice"].get("type") != "function":
        out["tool_choice"] = "auto"  # hosted-tool choices: nothing to force here
    r = body.get("reasoning")
    if isinstance(r, dict) and isinstance(r.get("effort"), str):
        out["reasoning_effort"] = r["effort"]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    return out


def _usage(final: FinalEvent, run: ChatRun) -> dict:
    return {"input_tokens": final.n_prompt,
            "input_tokens_details": {"cached_tokens": final.timings.cache_n},
            "output_tokens": final.n_predicted,
            "output_tokens_details": {"reasoning_tokens": run.reasoning_tokens},
            "total_tokens": final.n_prompt + final.n_predicted}


def _items(run: ChatRun, ids: dict) -> list[dict]:
    p = run.parser
    out = []
    if p.reasoning:
        out.append({"id": ids.setdefault("rs", new_id("rs").replace("-", "_")), "type": "reasoning",
                    "summary": [], "content": [{"type": "reasoning_text", "text": p.reasoning}]})
    if p.content or not p.calls:
        out.append({"id": ids.setdefault("msg", new_id("msg").replace("-", "_")), "type": "message",
                    "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": p.content, "annotations": []}]})
    for i, c in enumerate(p.calls):
        out.append({"id": ids.setdefault(f"fc{i}", new_id("fc").replace("-", "_")), "type": "function_call",
                    "status": "completed", "call_id": c.id, "name": c.name, "arguments": c.arguments or "{}"})
    return out


async def responses(request: web.Request) -> web.StreamResponse:
    eng = ready_engine(request)
    body = await read_json(request)
    chat = to_chat(body)
    big = len(await request.read()) > BIG_TEXT
    try:
        text, prompt = await off_loop(big, render_chat_text, eng, chat)
        run = ChatRun(eng, make_setup(eng, chat, text, prompt))
        params = gen_params(chat, eng, oai=True)
        params.checkpoint_at = last_user_start(eng, chat, prompt)
        task = eng.submit(prompt, params)
    except ContextFullError as exc:
        status, err = exception_body(exc)
        err["error"]["code"] = "context_length_exceeded"
        err["error"]["param"] = "input"
        return web.json_response(err, status=status)
    stream = get_bool(chat, "stream", False)
    rid = new_id("resp").replace("-", "_")
    model = body.get("model") if isinstance(body.get("model"), str) else eng.model_name
    resp = {"id": rid, "object": "response", "created_at": now(), "model": model, "status": "in_progress",
            "output": [], "usage": None, "error": None, "incomplete_details": None,
            "instructions": body.get("instructions"), "tools": body.get("tools") or [],
            "parallel_tool_calls": chat.get("parallel_tool_calls", True)}
    ids: dict = {}

    def finished(ev: FinalEvent) -> dict:
        r = {**resp, "output": _items(run, ids), "usage": _usage(ev, run)}
        if ev.stop_type == "limit" and not run.parser.calls:
            r["status"], r["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        else:
            r["status"] = "completed"
        return r

    if not stream:
        out = ""
        async for ev in events(request, task, None):
            if isinstance(ev, TokenEvent):
                out += run.text_of(ev)
                run.count(ev)
                continue
            run.parser.parse_all(out)
            return web.json_response(finished(ev))
        raise RuntimeError("generation ended without a result")

    sse = SSEWriter(request)
    seq = [0]
    cur: dict = {"kind": None, "index": -1, "item": None, "text": ""}

    async def emit(typ: str, **fields):
        await sse.event(typ, {"type": typ, "sequence_number": seq[0], **fields})
        seq[0] += 1

    async def close_item():
        kind, item, idx = cur["kind"], cur["item"], cur["index"]
        if kind is None:
            return
        if kind == "message":
            part = {"type": "output_text", "text": cur["text"], "annotations": []}
            await emit("response.output_text.done", item_id=item["id"], output_index=idx, content_index=0,
                       text=cur["text"])
            await emit("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0, part=part)
            item = {**item, "status": "completed", "content": [part]}
        elif kind == "reasoning":
            await emit("response.reasoning_text.done", item_id=item["id"], output_index=idx, content_index=0,
                       text=cur["text"])
            item = {**item, "content": [{"type": "reasoning_text", "text": cur["text"]}]}
        else:
            args = cur["text"] or "{}"
            await emit("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                       arguments=args)
            item = {**item, "status": "completed", "arguments": args}
        await emit("response.output_item.done", output_index=idx, item=item)
        cur["kind"] = None

    async def open_item(kind: str, item: dict):
        await close_item()
        cur.update(kind=kind, index=cur["index"] + 1, item=item, text="")
        await emit("response.output_item.added", output_index=cur["index"], item=item)
        if kind == "message":
            await emit("response.content_part.added", item_id=item["id"], output_index=cur["index"],
                       content_index=0, part={"type": "output_text", "text": "", "annotations": []})

    async def send(d):
        if d.kind == "reasoning":
            if cur["kind"] != "reasoning":
                await open_item("reasoning", {"id": ids.setdefault("rs", new_id("rs").replace("-", "_")),
                                              "type": "reasoning", "summary": []})
            cur["text"] += d.text
            await emit("response.reasoning_text.delta", item_id=cur["item"]["id"], output_index=cur["index"],
                       content_index=0, delta=d.text)
        elif d.kind == "content":
            if cur["kind"] != "message":
                await open_item("message", {"id": ids.setdefault("msg", new_id("msg").replace("-", "_")),
                                            "type": "message", "status": "in_progress", "role": "assistant",
                                            "content": []})
            cur["text"] += d.text
            await emit("response.output_text.delta", item_id=cur["item"]["id"], output_index=cur["index"],
                       content_index=0, delta=d.text)
        elif d.kind == "call":
            await open_item("function_call", {"id": ids.setdefault(f"fc{d.index}", new_id("fc").replace("-", "_")),
                                              "type": "function_call", "status": "in_progress",
                                              "call_id": d.id, "name": d.name, "arguments": ""})
        else:
            cur["text"] += d.text
            await emit("response.function_call_arguments.delta", item_id=cur["item"]["id"],
                       output_index=cur["index"], delta=d.text)

    try:
        await sse.prepare()
        await emit("response.created", response=resp)
        await emit("response.in_progress", response=resp)
        try:
            async for ev in events(request, task, sse):
                if isinstance(ev, TokenEvent):
                    for d in run.feed(ev):
                        await send(d)
                    continue
                for d in run.finish():
                    await send(d)
                if cur["index"] < 0:  # nothing generated: still one (empty) message item
                    await open_item("message", {"id": ids.setdefault("msg", new_id("msg").replace("-", "_")),
                                                "type": "message", "status": "in_progress", "role": "assistant",
                                                "content": []})
                await close_item()
                r = finished(ev)
                await emit("response.incomplete" if r["status"] == "incomplete" else "response.completed", response=r)
        except ClientGone:
            raise
        except Exception as exc:  # noqa: BLE001 - headers are out: report in-band
            _, err = exception_body(exc)
            await emit("response.failed", response={**resp, "status": "failed", "error": {
                "code": "server_error", "message": err["error"]["message"]}})
    except ClientGone:
        task.close()
    return await sse.close()
