"""The chat request: an OpenAI chat/completions body, checked and read once.

Anthropic Messages and Responses bodies are translated into this shape first
(requests/anthropic.py, requests/responses.py), so every chat-style API shares it."""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import RequestError


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    tools: list[dict] | None  # what the template gets; None: no tools offered (or tool_choice "none")
    parse_tools: bool  # look for tool calls in the output
    parallel_tool_calls: bool
    template_kwargs: dict  # extra template variables (enable_thinking, reasoning_effort, ...)
    add_generation_prompt: bool = True


def read_chat(body: dict) -> ChatRequest:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list")
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError("each message must be an object with a string 'role'")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise RequestError("message 'content' must be a string, a list of parts, or null")
    tools, parse, parallel = _tool_setup(body.get("tools"), body.get("tool_choice"),
                                         body.get("parallel_tool_calls"))
    kwargs = _template_kwargs(body)
    add_gen = kwargs.pop("add_generation_prompt", True)
    return ChatRequest(messages=msgs, tools=tools, parse_tools=parse, parallel_tool_calls=parallel,
                       template_kwargs=kwargs, add_generation_prompt=add_gen)


def _tool_setup(tools, tool_choice, parallel) -> tuple[list | None, bool, bool]:
    """(tools for the template, parse tool calls?, parallel calls?) from OpenAI-style fields."""
    if tools is not None and not isinstance(tools, list):
        raise RequestError("'tools' must be a list")
    tools = [t for t in tools or [] if isinstance(t, dict)]
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError("'parallel_tool_calls' must be a boolean")
    parallel = True if parallel is None else parallel
    if not tools:
        return None, False, parallel
    if tool_choice == "none":
        return None, False, parallel
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function") if isinstance(tool_choice.get("function"), dict) else tool_choice
        name = fn.get("name")
        if isinstance(name, str):
            keep = [t for t in tools if _tool_name(t) == name]
            if not keep:
                raise RequestError(f"tool_choice names an unknown tool {name!r}")
            tools = keep
    return tools, True, parallel


def _tool_name(t: dict):
    fn = t.get("function") if isinstance(t.get("function"), dict) else t
    return fn.get("name")


def _template_kwargs(body: dict) -> dict:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("'chat_template_kwargs' must be an object")
    kwargs = {k: v for k, v in kwargs.items() if isinstance(k, str) and k not in ("messages", "tools")}
    for key in ("reasoning_effort", "enable_thinking"):  # top-level shortcuts some clients send
        if key in body and key not in kwargs and body[key] is not None:
            kwargs[key] = body[key]
    return kwargs
