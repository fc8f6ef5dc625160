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

The template comes with the model file, so it is not trusted: besides Jinja2's sandbox, a
render can be given `RenderLimits` (a time limit and a size limit on the text it builds,
for the output and for every string or list its operators, string methods and filters
make): past them it stops with `TemplateLimitError`. The variables a request may set are
the ones the template reads (`request_variables`), never the special-token strings.
"""
from __future__ import annotations

import ctypes
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Sequence

from .errors import ImagesNotSupportedError, RequestError

log = logging.getLogger("llmcore")

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] if message['content'] is string else '')"
    " + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Gemma's turns (llama-server's built-in "gemma"): for GGUFs of the family that carry no
# template of their own; a system message opens the first user turn
GEMMA_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set first_prefix = messages[0]['content'] + '\n\n' %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set first_prefix = '' %}{%- set turns = messages %}{%- endif %}"
    "{%- for message in turns %}"
    "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n'"
    " + (first_prefix if loop.first else '') + (message['content'] if message['content'] is string else '') | trim"
    " + '<end_of_turn>\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}"
)

# --chat-template NAME when the GGUF has no template of that name
BUILTIN_TEMPLATES = {"chatml": CHATML_TEMPLATE, "gemma": GEMMA_TEMPLATE}

_TEXT_PART_TYPES = {"text", "input_text", "output_text"}
IMAGE_PART_TYPES = frozenset({"image_url", "image", "input_image"})  # OpenAI, Anthropic, Responses


# what a template gets from the server, never from a request's chat_template_kwargs
SPECIAL_VARIABLES = frozenset({
    "bos_token", "eos_token", "pad_token", "unk_token", "raise_exception", "strftime_now",
    "range", "dict", "lipsum", "cycler", "joiner", "namespace",
})


@dataclass(frozen=True)
class RenderLimits:
    """How far one render may go: `max_chars` of output (and of any string or list built on
    the way), `timeout_s` of time. None: no limit."""

    max_chars: int | None = None
    timeout_s: float | None = None


class TemplateLimitError(RequestError):
    """A render passed its RenderLimits (too slow, or too much text)."""


class TemplateOutputTooLarge(TemplateLimitError):
    """A render built more text than RenderLimits.max_chars."""

    def __init__(self, max_chars: int):
        super().__init__(f"chat template error: the template built more than {max_chars} characters")
        self.max_chars = max_chars


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False):
    if isinstance(indent, int) and indent > 64:  # each nesting level repeats it
        raise TemplateLimitError("chat template error: tojson indent above 64")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


# ---- limits on what one render builds ------------------------------------------------------

_active = threading.local()  # .max_chars of the render running on this thread


def _cap() -> int | None:
    return getattr(_active, "max_chars", None)


def _check_size(n: int) -> None:
    cap = _cap()
    if cap is not None and n > cap:
        raise TemplateOutputTooLarge(cap)


def _size(v: Any) -> int:
    return len(v) if isinstance(v, (str, list, tuple)) else 0


def _check_int_args(args, kwargs) -> None:
    """A size given as a number (ljust(10**9), indent(10**9), '%0999999999d') is refused
    before anything is built."""
    cap = _cap()
    if cap is None:
        return
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and a > cap:
            raise TemplateOutputTooLarge(cap)


_FORMAT_WIDTH = re.compile(r"[%:][^a-zA-Z%{}]*?(\d{7,})")


def _check_format(fmt: Any) -> None:
    """Widths and precisions written in a format string ('%0999999999d', '{:>999999999}')."""
    cap = _cap()
    if cap is None or not isinstance(fmt, str):
        return
    for m in _FORMAT_WIDTH.finditer(fmt):
        if int(m.group(1)) > cap:
            raise TemplateOutputTooLarge(cap)


def _checked_replace(s, old, new, count=-1):
    s, old, new = str(s), str(old), str(new)
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    _check_size(len(s) + n * max(0, len(new) - len(old)))
    return s.replace(old, new, count)


def _checked_join_size(items, sep) -> None:
    items = list(items) if not isinstance(items, (list, tuple)) else items
    _check_size(len(str(sep)) * max(0, len(items) - 1) + sum(_size(x) for x in items))


# the filters and str methods whose number arguments are sizes of what they build
_SIZED_FILTERS = frozenset({"center", "indent", "batch", "slice", "format"})
_SIZED_STR_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})


def _limited_filter(name: str, f):
    """`f` with the size checks. It takes the context (pass_context) whatever `f` takes, so
    Jinja never runs it at compile time on constants ('x' | center(10**10) would build its
    string while the model loads, before any limit applies)."""
    from jinja2 import pass_context

    wants = getattr(getattr(f, "jinja_pass_arg", None), "name", None)

    @pass_context
    def checked(context, *args, **kwargs):
        if _cap() is not None:
            if name in _SIZED_FILTERS:
                _check_int_args(args[1:], kwargs)
            if name == "format" and args:
                _check_format(args[0])
            elif name == "replace" and len(args) >= 3:
                _checked_replace(*args[:3], *(args[3:4] or [kwargs.get("count", -1)]))
            elif name == "join" and args and isinstance(args[0], (list, tuple)):
                _checked_join_size(args[0], args[1] if len(args) > 1 else kwargs.get("d", ""))
        first = {"context": (context,), "eval_context": (context.eval_ctx,),
                 "environment": (context.environment,)}.get(wants, ())
        out = f(*first, *args, **kwargs)
        _check_size(_size(out))
        return out

    checked.__name__ = getattr(f, "__name__", name)
    return checked


def _limited_env_class():
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node, frame):  # `a ~ b`: size-checked (doubling a string in a loop)
            self.write("environment.checked_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class LimitedSandbox(ImmutableSandboxedEnvironment):
        """The sandbox plus size checks on everything that can build a large value."""

        code_generator_class = LimitedCodeGenerator
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        def checked_concat(self, parts) -> str:
            out = "".join(map(str, parts))
            _check_size(len(out))
            return out

        def call_binop(self, context, operator, left, right):
            if _cap() is not None:
                if operator == "*":
                    for seq, n in ((left, right), (right, left)):
                        if _size(seq) and isinstance(n, int):
                            _check_size(_size(seq) * max(0, n))
                elif operator == "+":
                    _check_size(_size(left) + _size(right))
                elif operator == "**" and isinstance(left, int) and isinstance(right, int) \
                        and abs(left) > 1 and right > 4096:
                    raise TemplateLimitError("chat template error: exponent too large")
                elif operator == "%" and isinstance(left, str):
                    _check_format(left)
                    if "*" in left:  # '%*d' % (width, x)
                        _check_int_args(right if isinstance(right, tuple) else (right,), {})
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
            if _cap() is not None:
                name = getattr(__obj, "__name__", "")
                owner = getattr(__obj, "__self__", None)
                if isinstance(owner, str) and name in _SIZED_STR_METHODS:
                    _check_int_args(args, kwargs)
                elif isinstance(owner, str) and name == "replace" and len(args) >= 2:
                    _checked_replace(owner, *args[:2], *(args[2:3] or [kwargs.get("count", -1)]))
                elif isinstance(owner, str) and name == "join" and args:
                    _checked_join_size(list(args[0]) if not isinstance(args[0], (list, tuple)) else args[0], owner)
            out = super().call(__context, __obj, *args, **kwargs)
            _check_size(_size(out))
            return out

        def wrap_str_format(self, value):
            fmt = super().wrap_str_format(value)
            if fmt is None:
                return None
            template = value.__self__

            def checked(*args, **kwargs):
                _check_format(template)
                _check_int_args(args, kwargs)
                return fmt(*args, **kwargs)

            return checked

    return LimitedSandbox


# ---- the time limit -------------------------------------------------------------------------


class _Interrupted(BaseException):
    """Raised inside a render past its time limit (a BaseException: template code and the
    filters it calls catch Exception)."""


class _Deadline:
    """Interrupts the rendering thread when `timeout_s` passes: a timer thread raises
    _Interrupted in it (CPython's PyThreadState_SetAsyncExc, the only way to stop a Jinja
    loop that calls nothing). An interrupt sent as the render ends is taken before leaving."""

    def __init__(self, timeout_s: float):
        self.ident = threading.get_ident()
        self.lock = threading.Lock()
        self.state = "running"  # running -> interrupting -> done
        self.timer = threading.Timer(timeout_s, self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        with self.lock:
            if self.state != "running":
                return
            self.state = "interrupting"
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.ident),
                                                       ctypes.py_object(_Interrupted))

    def __enter__(self) -> "_Deadline":
        self.timer.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.timer.cancel()
        with self.lock:
            in_flight = self.state == "interrupting" and exc_type is not _Interrupted
            self.state = "done"
        if in_flight:  # sent but not arrived yet: it must arrive here, not in the caller
            try:
                while True:
                    time.sleep(0.0005)
            except _Interrupted:
                pass
            raise _Interrupted()
        return False


def _make_env():
    from jinja2.ext import loopcontrols

    env = _limited_env_class()(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals.pop("lipsum", None)  # lipsum(10**9): no chat template needs it
    env.filters["tojson"] = _tojson
    env.filters = {name: _limited_filter(name, f) for name, f in env.filters.items()}
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
        if ptype in IMAGE_PART_TYPES:
            raise ImagesNotSupportedError(where)
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


def _special_strings(tokenizer) -> dict:
    def text(tid):
        if tokenizer is None or tid is None:
            return None
        return tokenizer.token_text(tid)

    return dict(bos_token=text(getattr(tokenizer, "bos_id", None)) or "",
                eos_token=text(getattr(tokenizer, "eos_id", None)) or "",
                pad_token=text(getattr(tokenizer, "pad_id", None)),
                unk_token=text(getattr(tokenizer, "unk_id", None)))


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
        # what a request's chat_template_kwargs may set (add_generation_prompt is read apart)
        self.request_variables = self._free_variables(source) - SPECIAL_VARIABLES - {"messages", "tools"}

    @property
    def reads_tools(self) -> bool:
        """Whether the template renders `tools` (else the server writes them into the
        system prompt in the generic format)."""
        return "tools" in self._free_variables(self.source)

    def _free_variables(self, source: str) -> frozenset[str]:
        """The variables the template reads without setting them (enable_thinking, ...)."""
        from jinja2 import meta

        return frozenset(meta.find_undeclared_variables(self.env.parse(source)))

    @classmethod
    def from_source(cls, source: str, tokenizer=None) -> "ChatTemplate":
        """A template's text (an override) with the vocabulary's special-token strings;
        one that does not compile is a ModelLoadError (an override must not fall back)."""
        from jinja2.exceptions import TemplateError

        from .errors import ModelLoadError

        try:
            _make_env().from_string(source)
        except TemplateError as e:
            raise ModelLoadError(f"the chat template does not compile: {e}") from None
        return cls(source, **_special_strings(tokenizer))

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
        return cls(source, **_special_strings(tokenizer))

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        limits: RenderLimits | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages`. Raises RequestError on any template error,
        TemplateLimitError past `limits`."""
        from jinja2.exceptions import TemplateError

        msgs = normalize_messages(messages)
        ctx = dict(self.special)
        ctx.update(extra)
        ctx.update(messages=msgs, tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt)
        limits = limits or RenderLimits()
        try:
            if limits.timeout_s is None:
                return self._generate(ctx, limits.max_chars)
            try:
                with _Deadline(limits.timeout_s):
                    return self._generate(ctx, limits.max_chars)
            except _Interrupted:
                raise TemplateLimitError(
                    f"chat template error: rendering took longer than {limits.timeout_s:g} s") from None
        except TemplateError as e:
            raise RequestError(f"chat template error: {e}") from None
        except RequestError:
            raise
        except Exception as e:  # the template did something the data does not allow
            raise RequestError(f"chat template error: {type(e).__name__}: {e}") from None

    def _generate(self, ctx: dict, max_chars: int | None) -> str:
        _active.max_chars = max_chars  # set every time: an interrupt may have skipped a reset
        if max_chars is None:
            return self.template.render(**ctx)
        try:
            parts, n = [], 0
            for chunk in self.template.generate(**ctx):
                n += len(chunk)
                if n > max_chars:
                    raise TemplateOutputTooLarge(max_chars)
                parts.append(chunk)
            return "".join(parts)
        finally:
            _active.max_chars = None
