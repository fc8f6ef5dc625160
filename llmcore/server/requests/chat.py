"""The chat request: an OpenAI chat/completions body, checked and read once.

Anthropic Messages and Responses bodies are translated into this shape first
(requests/anthropic.py, requests/responses.py), so every chat-style API shares it."""
from __future__ import annotations

from dataclasses import dataclass

from ...chat import IMAGE_PART_TYPES, SPECIAL_VARIABLES
from ...errors import ImagesNotSupportedError, RequestError
from .constraints import CONSTRAINT_FIELDS
from .fields import GENERATION_FIELDS
from .schema import AnyOf, Bool, Enum, FieldError, Int, List, Map, Obj, Str


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    tools: list[dict] | None  # what the template gets; None: no tools offered (or tool_choice "none")
    parse_tools: bool  # look for tool calls in the output
    parallel_tool_calls: bool
    template_kwargs: dict  # extra template variables (enable_thinking, reasoning_effort, ...)
    add_generation_prompt: bool = True
    forced_tool: str | None = None  # tool_choice "required", or the name of the function it names


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
        if isinstance(c, list) and any(isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES for p in c):
            raise ImagesNotSupportedError(f"messages[{msgs.index(m)}]")
    tools, parse, parallel = _tool_setup(body.get("tools"), body.get("tool_choice"),
                                         body.get("parallel_tool_calls"))
    kwargs = _template_kwargs(body)
    add_gen = kwargs.pop("add_generation_prompt", True)
    return ChatRequest(messages=msgs, tools=tools, parse_tools=parse, parallel_tool_calls=parallel,
                       template_kwargs=kwargs, add_generation_prompt=add_gen,
                       forced_tool=_forced(tools, body.get("tool_choice")))


def _forced(tools, tool_choice) -> str | None:
    """"required", the name of the one function tool_choice names, or None ("auto")."""
    if not tools:
        return None
    if tool_choice == "required":
        return "required"
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function") if isinstance(tool_choice.get("function"), dict) else tool_choice
        if isinstance(fn.get("name"), str):
            return fn["name"]
    return None


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
    """The request's template variables. The special-token strings (bos_token, ...) and
    the template's globals come from the model, never from a request (400); `messages`
    and `tools` are the call's own and are dropped. Which of the rest a template gets is
    decided by what it reads (`template_variables`)."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("'chat_template_kwargs' must be an object")
    for k in kwargs:
        if k in SPECIAL_VARIABLES:
            raise FieldError(f"chat_template_kwargs.{k}", "left out (the server sets it from the model)")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("messages", "tools")}
    for key in ("reasoning_effort", "enable_thinking"):  # top-level shortcuts some clients send
        if key in body and key not in kwargs and body[key] is not None:
            kwargs[key] = body[key]
    return kwargs


def template_variables(kwargs: dict, template) -> dict:
    """The variables of `kwargs` the template reads (`ChatTemplate.request_variables`);
    clients send variables meant for other templates (enable_thinking to a model without
    thinking): those are dropped, not refused. A template that cannot tell gets them all."""
    known = getattr(template, "request_variables", None)
    if known is None:
        return kwargs
    return {k: v for k, v in kwargs.items() if k in known}


# ---- the schema (requests/schema.py) ----------------------------------------------------

_PART = AnyOf((Str(), Obj({"type": Str(), "text": Str()}, name="a content part")))
CONTENT = AnyOf((Str(), List(_PART, name="a list of content parts")), name="a string, a list of content parts or null")
_TOOL_CALL = Obj({"id": Str(), "type": Str(), "function": Obj({
    "name": Str(), "arguments": AnyOf((Str(), Map()), name="a string or an object")})})
MESSAGE = Obj({
    "role": Str(), "content": CONTENT, "name": Str(), "tool_call_id": Str(),
    "tool_calls": List(_TOOL_CALL), "reasoning_content": Str(),
}, required=("role",), name="a message object")
TOOL = Obj({"type": Str(), "function": Obj({"name": Str(), "description": Str(), "parameters": Map()})},
           name="a tool object")
TOOL_CHOICE = AnyOf((Enum(("auto", "none", "required")),
                     Obj({"type": Str(), "function": Obj({"name": Str()})})),
                    name="'auto', 'none', 'required' or an object naming a function")
TEMPLATE_KWARGS = Map()  # checked by name in _template_kwargs; values go to the template as they are

CHAT_FIELDS = {
    "messages": List(MESSAGE, min_items=1), "tools": List(TOOL), "tool_choice": TOOL_CHOICE,
    "parallel_tool_calls": Bool(), "chat_template_kwargs": TEMPLATE_KWARGS,
    "reasoning_effort": Str(), "enable_thinking": Bool(), "user": Str(), **CONSTRAINT_FIELDS,
    "reasoning_format": Enum(("none", "deepseek", "auto")), "reasoning_budget": Int(lo=-1),
}
CHAT = Obj({**GENERATION_FIELDS, **CHAT_FIELDS}, required=("messages",))
APPLY_TEMPLATE = CHAT  # POST /apply-template: a chat request, rendered only
