"""An Anthropic Messages request (Claude Code) as a chat request: system, text /
tool_use / tool_result / thinking blocks, tools with input_schema, tool_choice, thinking,
stop_sequences."""
from __future__ import annotations

import json

from ...chat import IMAGE_PART_TYPES
from ...errors import ImagesNotSupportedError, RequestError
from .fields import GENERATION_FIELDS
from .schema import AnyOf, Anything, Bool, Enum, Int, List, Map, Obj, Str, Tagged

BILLING = "x-anthropic-billing-header"

# ---- the schema (requests/schema.py) ----------------------------------------------------

_TEXT = Obj({"text": Str()}, required=("text",), name="a text block")
_OTHER = Obj(name="a content block")  # images, documents, redacted thinking...: not rendered
_RESULT_CONTENT = AnyOf((Str(), Tagged("type", {"text": _TEXT}, other=_OTHER),
                         List(AnyOf((Str(), Tagged("type", {"text": _TEXT}, other=_OTHER))),
                              name="a list of content blocks")),
                        name="a string or a list of content blocks")
BLOCK = Tagged("type", {
    "text": _TEXT,
    "tool_use": Obj({"id": Str(), "name": Str(), "input": Map()}, name="a tool_use block"),
    "tool_result": Obj({"tool_use_id": Str(), "content": _RESULT_CONTENT, "is_error": Bool()},
                       name="a tool_result block"),
    "thinking": Obj({"thinking": Str(), "signature": Str()}, name="a thinking block"),
}, default="text", other=_OTHER, name="a content block")
CONTENT = AnyOf((Str(), BLOCK, List(AnyOf((Str(), BLOCK)), name="a list of content blocks")),
                name="a string or a list of content blocks")
MESSAGE = Obj({"role": Enum(("user", "assistant")), "content": CONTENT}, required=("role",),
              name="a message object")
TOOL = Obj({"name": Str(), "description": Str(), "input_schema": Map(), "type": Str()}, name="a tool object")

MESSAGES = Obj({
    **{k: GENERATION_FIELDS[k] for k in ("temperature", "top_p", "top_k", "stream", "cache_prompt",
                                         "seed", "model")},
    "max_tokens": Int(lo=-1), "system": CONTENT, "messages": List(MESSAGE, min_items=1),
    "tools": List(TOOL), "stop_sequences": List(Str(), name="a list of strings"),
    "tool_choice": Obj({"type": Str(), "name": Str(), "disable_parallel_tool_use": Bool()}),
    "thinking": Obj({"type": Str(), "budget_tokens": Int()}), "metadata": Map(),
    "service_tier": Str(), "container": Anything(),
}, required=("messages",))
COUNT_TOKENS = MESSAGES


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
    blocks = _blocks(content, "tool_result")
    if any(b.get("type") in IMAGE_PART_TYPES for b in blocks):
        raise ImagesNotSupportedError("a tool_result")
    return "\n".join(b.get("text", "") for b in blocks
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
            elif t in IMAGE_PART_TYPES:
                raise ImagesNotSupportedError(f"messages.{i}")
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
    elif isinstance(th, dict) and th.get("type") == "enabled" and isinstance(th.get("budget_tokens"), int):
        out["reasoning_budget"] = th["budget_tokens"]
    for k in ("temperature", "top_p", "top_k", "stream", "cache_prompt", "seed"):
        if k in body:
            out[k] = body[k]
    if "max_tokens" in body:
        out["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences") is not None:
        out["stop"] = body["stop_sequences"]
    return out
