"""An OpenAI Responses request (Codex CLI), stateless, as a chat request:
`instructions` + `input` (a string or items: messages, function_call,
function_call_output, reasoning); function tools are kept, other tool types skipped."""
from __future__ import annotations

from ...chat import IMAGE_PART_TYPES
from ...errors import ImagesNotSupportedError, RequestError
from .chat import TEMPLATE_KWARGS
from .constraints import TEXT_FORMAT, response_format_of_text_format
from .fields import GENERATION_FIELDS
from .schema import AnyOf, Bool, Enum, Int, List, Map, Obj, Str, Tagged

# ---- the schema (requests/schema.py) ----------------------------------------------------

_PART = Obj({"type": Str(), "text": Str()}, name="a content part")
_PARTS = List(_PART, name="a list of content parts")
ITEM = Tagged("type", {
    "message": Obj({"role": Enum(("system", "developer", "user", "assistant")),
                    "content": AnyOf((Str(), _PARTS), name="a string or a list of content parts")},
                   required=("role",), name="a message item"),
    "function_call": Obj({"call_id": Str(), "id": Str(), "name": Str(), "arguments": Str()},
                         name="a function_call item"),
    "function_call_output": Obj({"call_id": Str(), "output": AnyOf((Str(), _PARTS),
                                                                    name="a string or a list of content parts")},
                                name="a function_call_output item"),
    "reasoning": Obj({"id": Str(), "content": _PARTS, "summary": _PARTS, "encrypted_content": Str()},
                     name="a reasoning item"),
}, default="message", other=Obj(name="an input item"), name="an input item")
TOOL = Obj({"type": Str(), "name": Str(), "description": Str(), "parameters": Map()}, name="a tool object")

RESPONSES = Obj({
    **{k: GENERATION_FIELDS[k] for k in ("temperature", "top_p", "top_k", "stream", "cache_prompt",
                                         "seed", "model")},
    "instructions": Str(),
    "input": AnyOf((Str(), List(ITEM, min_items=1, name="a non-empty list of input items")),
                   name="a string or a non-empty list of input items"),
    "tools": List(TOOL),
    "tool_choice": AnyOf((Enum(("auto", "none", "required")), Obj({"type": Str(), "name": Str()})),
                         name="'auto', 'none', 'required' or an object"),
    "parallel_tool_calls": Bool(), "max_output_tokens": Int(lo=-1),
    "reasoning": Obj({"effort": Str(), "summary": Str()}), "chat_template_kwargs": TEMPLATE_KWARGS,
    "store": Bool(), "previous_response_id": Str(), "metadata": Map(), "user": Str(),
    "text": Obj({"format": TEXT_FORMAT, "verbosity": Str()}), "include": List(Str()), "truncation": Str(), "service_tier": Str(),
}, required=("input",))


def _text(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise RequestError(f"{where}: content must be a string or a list of parts")
    if any(isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES for p in content):
        raise ImagesNotSupportedError(where)
    return "\n".join(p.get("text", "") for p in content
                     if isinstance(p, dict) and isinstance(p.get("text"), str))


def to_chat(body: dict) -> dict:
    """A Responses request as a chat/completions body."""
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
    fmt = (body.get("text") or {}).get("format")
    if isinstance(fmt, dict):
        out["response_format"] = response_format_of_text_format(fmt)
    return out
