"""Chat templates: the GGUF's Jinja template, rendered the way Hugging Face does.

    tmpl = ChatTemplate.from_gguf(gf, tokenizer)
    prompt = tmpl.render(messages, add_generation_prompt=True, tools=None, **extra)

The environment is Jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks
and the loop-controls extension; `tojson` does not HTML-escape (ensure_ascii=False, indent,
separators, sort_keys); `raise_exception(msg)` and `strftime_now(fmt)` are globals; and
`bos_token`, `eos_token` (plus `pad_token`, `unk_token`) are the vocabulary's strings.
Extra keyword arguments become template variables (e.g. enable_thinking=False).

Messages are OpenAI-style dicts. A content given as a list of parts is flattened: the
text parts are joined with newlines (other part types are refused). Tool-call arguments
given as a JSON string are handed to the template as an object, because templates
render them with `| tojson`. An assistant turn's reasoning (`reasoning_content`, or
`reasoning`) reaches the template as `reasoning_content` and `thinking`.

A GGUF without `tokenizer.chat_template` (or with one that does not compile) gets ChatML,
and a line on the "llmcore" logger says so. Every template error is a RequestError.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any, Mapping, Sequence

from .errors import RequestError

log = logging.getLogger("llmcore")

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] if message['content'] is string else '')"
    " + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_TEXT_PART_TYPES = {"text", "input_text", "output_text"}


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _make_env():
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def flatten_content(content: Any, where: str = "message") -> Any:
    """A list of content parts -> one string (text parts joined with newlines)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, (list, tuple)):
        raise RequestError(f"{where}: content must be a string or a list of content parts")
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, Mapping):
            raise RequestError(f"{where}: each content part must be an object")
        ptype = part.get("type", "text")
        if ptype not in _TEXT_PART_TYPES:
            raise RequestError(f"{where}: content part type {ptype!r} is not supported (text only)")
        text = part.get("text")
        if not isinstance(text, str):
            raise RequestError(f"{where}: a text content part needs a string 'text'")
        texts.append(text)
    return "\n".join(texts)


def _normalize_tool_calls(calls: Any) -> Any:
    if not isinstance(calls, list):
        return calls
    out = []
    for call in calls:
        if isinstance(call, Mapping):
            call = dict(call)
            fn = call.get("function")
            if isinstance(fn, Mapping):
                fn = dict(fn)
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        parsed = json.loads(args) if args.strip() else {}
                    except ValueError:
                        parsed = None
                    if isinstance(parsed, dict):
                        fn["arguments"] = parsed
                call["function"] = fn
        out.append(call)
    return out


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Validate OpenAI-style messages and put them in the shape templates expect."""
    if not isinstance(messages, (list, tuple)):
        raise RequestError("messages must be a list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise RequestError(f"messages[{i}] must be an object")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise RequestError(f"messages[{i}]: missing 'role'")
        msg = dict(m)
        msg["content"] = flatten_content(m.get("content"), where=f"messages[{i}]")
        if "tool_calls" in msg:
            msg["tool_calls"] = _normalize_tool_calls(msg["tool_calls"])
        if role == "assistant":
            # reasoning sent back (interleaved thinking): `reasoning_content` (Qwen3, DeepSeek
            # templates) or `reasoning`; gpt-oss templates read `thinking`
            r = msg.get("reasoning_content")
            if not isinstance(r, str) or not r:
                r = msg.get("reasoning") if isinstance(msg.get("reasoning"), str) else None
            if r:
                msg["reasoning_content"] = r
                msg.setdefault("thinking", r)
        out.append(msg)
    return out


class ChatTemplate:
    """A compiled chat template with the vocabulary's special-token strings."""

    def __init__(
        self,
        source: str | None,
        bos_token: str = "",
        eos_token: str = "",
        pad_token: str | None = None,
        unk_token: str | None = None,
    ):
        from jinja2.exceptions import TemplateError

        self.env = _make_env()
        self.is_fallback = False
        if not source:
            log.info("chat template: the model has none, using ChatML")
            source, self.is_fallback = CHATML_TEMPLATE, True
        try:
            self.template = self.env.from_string(source)
        except TemplateError as e:
            log.warning("chat template: the model's template does not compile (%s), using ChatML", e)
            source, self.is_fallback = CHATML_TEMPLATE, True
            self.template = self.env.from_string(source)
        self.source = source
        self.special = {"bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token, "unk_token": unk_token}

    @classmethod
    def from_gguf(cls, gf, tokenizer=None, name: str | None = None) -> "ChatTemplate":
        """The GGUF's `tokenizer.chat_template` (or `tokenizer.chat_template.<name>`)."""
        meta = gf.meta if hasattr(gf, "meta") else gf
        source = None
        if name:
            source = meta.get(f"tokenizer.chat_template.{name}")
            if source is None:
                log.warning("chat template %r not in the model, using the default one", name)
        if source is None:
            source = meta.get("tokenizer.chat_template")

        def text(tid):
            if tokenizer is None or tid is None:
                return None
            return tokenizer.token_text(tid)

        return cls(
            source,
            bos_token=(text(getattr(tokenizer, "bos_id", None)) or ""),
            eos_token=(text(getattr(tokenizer, "eos_id", None)) or ""),
            pad_token=text(getattr(tokenizer, "pad_id", None)),
            unk_token=text(getattr(tokenizer, "unk_id", None)),
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages`. Raises RequestError on any template error."""
        from jinja2.exceptions import TemplateError

        msgs = normalize_messages(messages)
        ctx = dict(self.special)
        ctx.update(extra)
        ctx.update(messages=msgs, tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt)
        try:
            return self.template.render(**ctx)
        except TemplateError as e:
            raise RequestError(f"chat template error: {e}") from None
        except RequestError:
            raise
        except Exception as e:  # the template did something the data does not allow
            raise RequestError(f"chat template error: {type(e).__name__}: {e}") from None
