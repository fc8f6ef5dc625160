"""Model output -> reasoning, content and tool calls, per model family (stream or not).

    fmt = detect_format(template_source, arch)           # "hermes", "qwen3coder", ...
    p = OutputParser(fmt, tools=tools, start_in_reasoning=prompt_ends_in_think(prompt_text))
    for text in pieces:
        for d in p.feed(text): ...                          # Delta objects
    for d in p.finish(): ...
    p.content, p.reasoning, p.calls                         # the whole result

Deltas: Delta("reasoning", text), Delta("content", text), Delta("call", index=i, id=...,
name=...) once per call, then Delta("args", index=i, text=fragment) (fragments concatenate
into the call's JSON arguments string).

Formats (the markup never reaches `content`):
- hermes: `<tool_call>{"name": .., "arguments": {..}}</tool_call>` (Qwen2.5/3, Hermes,
  SmolLM2-style ChatML); inside the block a Qwen3-Coder `<function=..>` body also works.
- qwen3coder: `<tool_call><function=NAME><parameter=ARG>value</parameter></function></tool_call>`
  (the wrapper is optional); values are converted with the tool's JSON-schema types.
- llama3: the whole output is `{"name": .., "parameters": {..}}` (optionally after
  `<|python_tag|>`, several separated by `;`).
- mistral: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]` or `[TOOL_CALLS]name[ARGS]{..}`.
- harmony (gpt-oss): `<|channel|>analysis<|message|>..` = reasoning,
  `<|channel|>commentary to=functions.X ..<|message|>{..}<|call|>` = call, `final` = content.
Every format also splits a leading `<think>..</think>` into reasoning.

The parser re-parses the whole text at each feed and emits what is new, so the streamed
deltas always add up to exactly the non-streamed result, wherever the text was split.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

FORMATS = ("hermes", "qwen3coder", "llama3", "mistral", "harmony")
NEEDS_SPECIAL = {"mistral", "harmony"}  # their markers are control tokens: decode them as text

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_DEC = json.JSONDecoder(strict=False)  # models put raw newlines in code strings


def detect_format(template: str | None, arch: str | None = None) -> str:
    """The tool-call format a model uses, from its chat template text (and architecture)."""
    t = template or ""
    a = (arch or "").lower()
    if "<|channel|>" in t or a in ("gpt-oss", "gptoss", "gpt_oss"):
        return "harmony"
    if "<function=" in t and "<parameter=" in t:
        return "qwen3coder"
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or ("ipython" in t and "parameters" in t):
        return "llama3"
    return "hermes"


def prompt_ends_in_think(prompt: str) -> bool:
    """A template that opens the think block itself (model output starts inside it)."""
    tail = prompt.rstrip()
    return tail.endswith(THINK_OPEN)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class Delta:
    kind: str  # reasoning | content | call | args
    text: str = ""
    index: int = 0
    id: str = ""
    name: str = ""


@dataclass
class ToolCall:
    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class _Call:  # a call as parsed so far
    name: str | None
    args: str  # JSON arguments so far (a prefix of the final string)
    done: bool


@dataclass
class _Parsed:
    reasoning: str = ""
    content: str = ""
    calls: list[_Call] = field(default_factory=list)
    in_reasoning: bool = False


# ---- helpers ------------------------------------------------------------------------------

def _held(text: str, markers) -> int:
    """How many characters at the end of text could start one of the markers."""
    n = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), n, -1):
            if text.endswith(m[:k]):
                n = k
                break
    return n


def _sanitize(s: str) -> str:
    """Raw control characters inside JSON strings escaped (char by char, so the result of a
    prefix is a prefix of the result of the whole)."""
    if not any(c < " " for c in s):
        return s
    out, in_str, esc = [], False, False
    for c in s:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
            elif c < " ":
                c = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c, "\\u%04x" % ord(c))
        elif c == '"':
            in_str = True
        out.append(c)
    return "".join(out)


_NAME_RE = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS_KEY_RE = re.compile(r'"(?:arguments|parameters)"\s*:\s*')


def _json_call(s: str) -> tuple[_Call | None, int]:
    """A JSON tool call at the start of s: the call so far and the end of its object (-1
    while unfinished). None when s cannot be (the start of) a call object."""
    i = len(s) - len(s.lstrip())
    if i == len(s):
        return _Call(None, "", False), -1
    if s[i] != "{":
        return None, -1
    try:
        obj, end = _DEC.raw_decode(s, i)
    except ValueError:
        obj, end = None, -1
    if isinstance(obj, dict):
        fn = obj.get("function") if isinstance(obj.get("function"), dict) else obj
        name = fn.get("name")
        if not isinstance(name, str):
            return None, -1
        args = fn.get("arguments", fn.get("parameters"))
        m = _ARGS_KEY_RE.search(s, i, end)
        if isinstance(args, str):
            a = args
        elif args is None:
            a = "{}"
        elif m and s[m.end()] == "{":
            _, aend = _DEC.raw_decode(s, m.end())
            a = _sanitize(s[m.end():aend])
        else:
            a = json.dumps(args, ensure_ascii=False)
        return _Call(name, a, True), end
    if obj is not None:
        return None, -1
    # unfinished object
    m = _NAME_RE.match(s, 0)
    if not m:
        head = re.sub(r"\s+", "", s[i:])
        for key in ('{"name":"', '{"type":', '{"function":'):
            if key.startswith(head) or head.startswith(key):
                return _Call(None, "", False), -1
        return None, -1
    name = json.loads('"' + m.group(1) + '"')
    rest = s[m.end():]
    am = re.match(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*', rest)
    if not am:
        return _Call(name, "", False), -1
    a = rest[am.end():]
    if not a.startswith("{"):
        return _Call(name, "", False), -1  # a string or other value: given whole when done
    try:
        _, aend = _DEC.raw_decode(a)
        a = a[:aend]
    except ValueError:
        pass
    return _Call(name, _sanitize(a), False), -1


def _schema_types(tools, name: str) -> dict:
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and fn.get("name") == name:
            props = ((fn.get("parameters") or fn.get("input_schema") or {}).get("properties") or {})
            return {k: (v.get("type") if isinstance(v, dict) else None) for k, v in props.items()}
    return {}


def _xml_value(raw: str, typ) -> object:
    v = raw[1:] if raw.startswith("\n") else raw
    v = v[:-1] if v.endswith("\n") else v
    if typ == "string" or (isinstance(typ, list) and "string" in typ and len(typ) == 1):
        return v
    try:
        return json.loads(v)
    except ValueError:
        return v


_FUNC_RE = re.compile(r"\s*<function=([^>\n]+)>")
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _xml_call(s: str, tools) -> tuple[_Call | None, int]:
    """A Qwen3-Coder `<function=..>` call at the start of s (end of `</function>` or -1)."""
    if not s.strip():
        return _Call(None, "", False), -1
    m = _FUNC_RE.match(s)
    if not m:
        head = s.lstrip()
        if "<function=".startswith(head) or (head.startswith("<function=") and ">" not in head):
            return _Call(None, "", False), -1
        return None, -1
    name = m.group(1).strip()
    types = _schema_types(tools, name)
    close = s.find("</function>", m.end())
    body = s[m.end():close if close >= 0 else len(s)]
    items = [f"{json.dumps(k.strip(), ensure_ascii=False)}: "
             f"{json.dumps(_xml_value(v, types.get(k.strip())), ensure_ascii=False)}"
             for k, v in _PARAM_RE.findall(body)]
    args = "{" + ", ".join(items)
    if close >= 0:
        return _Call(name, args + "}", True), close + len("</function>")
    return _Call(name, args, False), -1


# ---- the parser ---------------------------------------------------------------------------

class OutputParser:
    def __init__(self, fmt: str = "hermes", tools=None, parse_tools: bool | None = None,
                 start_in_reasoning: bool = False, parse_reasoning: bool = True,
                 parallel: bool = True):
        self.fmt = fmt if fmt in FORMATS else "hermes"
        self.tools = tools or []
        self.parse_tools = bool(self.tools) if parse_tools is None else parse_tools
        self.start_in_reasoning = start_in_reasoning
        self.parse_reasoning = parse_reasoning
        self.parallel = parallel
        self.text = ""
        self._r = 0  # reasoning characters emitted
        self._c = 0  # content characters emitted
        self._calls: list[ToolCall] = []  # calls whose name was emitted
        self._a: list[int] = []  # argument characters emitted per call
        self.result = _Parsed()

    # public results
    @property
    def reasoning(self) -> str:
        return self.result.reasoning

    @property
    def content(self) -> str:
        return self.result.content

    @property
    def calls(self) -> list[ToolCall]:
        return [c for c in self._calls]

    @property
    def in_reasoning(self) -> bool:
        return self.result.in_reasoning

    def feed(self, text: str) -> list[Delta]:
        if not text:
            return []
        self.text += text
        return self._update(self._parse(self.text, final=False))

    def finish(self) -> list[Delta]:
        return self._update(self._parse(self.text, final=True))

    def parse_all(self, text: str) -> "OutputParser":
        """The whole output at once (non-streaming)."""
        self.text += text
        self._update(self._parse(self.text, final=True))
        return self

    # diff of two successive parses
    def _update(self, p: _Parsed) -> list[Delta]:
        out: list[Delta] = []
        self.result = p
        if len(p.reasoning) > self._r:
            out.append(Delta("reasoning", p.reasoning[self._r:]))
            self._r = len(p.reasoning)
        if len(p.content) > self._c:
            out.append(Delta("content", p.content[self._c:]))
            self._c = len(p.content)
        calls = p.calls if self.parallel else p.calls[:1]
        for i, c in enumerate(calls):
            if c.name is None:
                break
            if i >= len(self._calls):
                tc = ToolCall(c.name, "")
                self._calls.append(tc)
                self._a.append(0)
                out.append(Delta("call", index=i, id=tc.id, name=c.name))
            tc = self._calls[i]
            if len(c.args) > self._a[i] and c.args.startswith(tc.arguments[:self._a[i]]):
                frag = c.args[self._a[i]:]
                tc.arguments = c.args
                self._a[i] = len(c.args)
                out.append(Delta("args", frag, index=i))
            if not c.done:
                break
        return out

    # whole-text parse
    def _parse(self, text: str, final: bool) -> _Parsed:
        p = _Parsed()
        if self.fmt == "harmony":
            if "<|channel|>" in text:
                self._harmony(text, final, p)
                return p
            t = text.lstrip()
            if not final and (not t or "<|channel|>".startswith(t) or t.startswith("<|start|>")):
                return p  # a harmony header may be coming
        rest = text
        if self.parse_reasoning:
            rest = self._think(text, final, p)
            if rest is None:
                return p
        if self.parse_tools:
            self._tools(rest, final, p)
        else:
            self._add_content(p, rest, final, [])
        return p

    def _think(self, text: str, final: bool, p: _Parsed) -> str | None:
        """Split a leading think block; returns the text after it (None: still inside)."""
        if self.start_in_reasoning:
            body = text
        else:
            s = text.lstrip()
            if s.startswith(THINK_OPEN):
                body = s[len(THINK_OPEN):]
            elif not final and THINK_OPEN.startswith(s):
                return None  # could still become "<think>"
            else:
                return text
        end = body.find(THINK_CLOSE)
        if end < 0:
            if not final:
                body = body[:len(body) - _held(body, [THINK_CLOSE])]
                p.in_reasoning = True
            p.reasoning = body.strip("\n")
            return None if not final else ""
        p.reasoning = body[:end].strip("\n")
        return body[end + len(THINK_CLOSE):].lstrip()

    def _add_content(self, p: _Parsed, s: str, final: bool, markers) -> None:
        if not final:
            s = s[:len(s) - _held(s, markers)] if markers else s
        p.content += s

    def _tools(self, s: str, final: bool, p: _Parsed) -> None:
        fmt = self.fmt
        if fmt in ("hermes", "qwen3coder"):
            self._tagged(s, final, p)
        elif fmt == "llama3":
            self._llama3(s, final, p)
        elif fmt == "mistral":
            self._mistral(s, final, p)
        else:
            self._add_content(p, s, final, [])

    def _tagged(self, s: str, final: bool, p: _Parsed) -> None:
        markers = ["<tool_call>"] + (["<function="] if self.fmt == "qwen3coder" else [])
        pos = 0
        while True:
            starts = [(s.find(m, pos), m) for m in markers]
            starts = [(i, m) for i, m in starts if i >= 0]
            if not starts:
                tail = s[pos:]
                if not final:
                    tail = tail[:len(tail) - _held(tail, markers)]
                p.content += tail if (tail.strip() or not p.calls) else ""
                return
            i, m = min(starts)
            pre = s[pos:i]
            p.content += pre if not p.calls else (pre if pre.strip() else "")
            body_start = i + (len(m) if m == "<tool_call>" else 0)
            body = s[body_start:]
            close = body.find("</tool_call>") if m == "<tool_call>" else -1
            inner = body[:close] if close >= 0 else body
            call, end = _json_call(inner)
            if call is None:
                call, end = _xml_call(inner, self.tools)
            if call is None:  # not a call after all: keep the text
                if close >= 0 or final:
                    p.content += s[i:body_start + (close if close >= 0 else len(body))]
                    pos = body_start + (close if close >= 0 else len(body))
                    continue
                return  # wait for more
            if m == "<tool_call>":
                if close >= 0:
                    if not call.done:  # closed without a complete call: repair as far as we can
                        call.done = call.name is not None
                        if call.done and not call.args:
                            call.args = "{}"
                        elif call.done and not _valid_json(call.args):
                            call.args = _close_json(call.args)
                    if call.name is None:
                        p.content += s[i:body_start + close + len("</tool_call>")]
                    else:
                        p.calls.append(call)
                    pos = body_start + close + len("</tool_call>")
                    continue
                if final and call.name is not None:
                    if not call.done:
                        call.args = _close_json(call.args or "{}")
                        call.done = True
                    p.calls.append(call)
                    return
                if final:
                    p.content += s[i:]
                    return
                p.calls.append(call)
                return
            # bare <function=...> (qwen3coder without the wrapper)
            if end >= 0:
                p.calls.append(call)
                pos = end
                continue
            if final:
                if call.name is not None:
                    call.args += "}" if call.args.startswith("{") else "{}"
                    call.done = True
                    p.calls.append(call)
                else:
                    p.content += s[i:]
                return
            p.calls.append(call)
            return

    def _llama3(self, s: str, final: bool, p: _Parsed) -> None:
        tag = "<|python_tag|>"
        t = s.lstrip()
        if t.startswith(tag):
            t = t[len(tag):]
        elif not final and t and tag.startswith(t):
            return
        pos = 0
        while True:
            rest = t[pos:]
            if not rest.strip():
                return
            call, end = _json_call(rest)
            if call is None or (final and not call.done):
                if p.calls:
                    return  # trailing junk after calls: dropped
                self._add_content(p, s, final, [])
                return
            p.calls.append(call)
            if not call.done:
                return
            pos += end
            nxt = t[pos:].lstrip()
            if nxt.startswith(";"):
                pos = len(t) - len(nxt) + 1
            elif nxt:
                pos = len(t) - len(nxt)

    def _mistral(self, s: str, final: bool, p: _Parsed) -> None:
        tag = "[TOOL_CALLS]"
        i = s.find(tag)
        if i < 0:
            self._add_content(p, s, final, [tag])
            return
        p.content += s[:i]
        rest = s[i + len(tag):]
        while True:
            r = rest.lstrip()
            if r.startswith(tag):
                rest = r[len(tag):]
                continue
            if r.startswith("["):  # [{"name":..,"arguments":..}, ...]
                j = 1
                while True:
                    r2 = r[j:].lstrip()
                    if not r2 or r2.startswith("]"):
                        return
                    try:
                        obj, end = _DEC.raw_decode(r, len(r) - len(r2))
                    except ValueError:
                        return  # unfinished: calls appear when complete
                    if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                        args = obj.get("arguments", obj.get("parameters", {}))
                        a = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                        p.calls.append(_Call(obj["name"], a, True))
                    j = end
                    r3 = r[j:].lstrip()
                    if r3.startswith(","):
                        j = len(r) - len(r3) + 1
            m = re.match(r"([\w.\-]+)\[ARGS\]", r)
            if not m:
                return
            a = r[m.end():]
            if not a.startswith("{"):
                p.calls.append(_Call(m.group(1), "", False))
                return
            try:
                _, aend = _DEC.raw_decode(a)
            except ValueError:
                if final:
                    p.calls.append(_Call(m.group(1), _close_json(_sanitize(a)), True))
                else:
                    p.calls.append(_Call(m.group(1), _sanitize(a), False))
                return
            p.calls.append(_Call(m.group(1), _sanitize(a[:aend]), True))
            rest = a[aend:]

    _H_TERM = re.compile(r"<\|(?:end|call|return)\|>|<\|start\|>|<\|channel\|>")

    def _harmony(self, text: str, final: bool, p: _Parsed) -> None:
        pos = 0
        while True:
            ch = text.find("<|channel|>", pos)
            if ch < 0:
                return
            head_start = text.rfind("<|start|>", pos, ch)
            msg = text.find("<|message|>", ch)
            if msg < 0:
                return  # header not complete yet
            header = text[head_start if head_start >= 0 else ch:msg]
            cm = re.search(r"<\|channel\|>\s*(\w+)", header)
            channel = cm.group(1) if cm else ""
            to = re.search(r"to=([\w.\-]+)", header)
            body_start = msg + len("<|message|>")
            tm = self._H_TERM.search(text, body_start)
            body = text[body_start:tm.start() if tm else len(text)]
            done = tm is not None or final
            if not done:
                body = body[:len(body) - _held(body, ["<|end|>", "<|call|>", "<|return|>", "<|start|>", "<|channel|>"])]
            if to and self.parse_tools:
                name = to.group(1)
                name = name[len("functions."):] if name.startswith("functions.") else name
                args = _sanitize(body.strip() if done else body.lstrip())
                if done and not args:
                    args = "{}"
                p.calls.append(_Call(name, args, done))
            elif channel == "analysis":
                p.reasoning += body
                p.in_reasoning = not done
            else:  # final, or commentary meant for the user
                p.content += body
            if tm is None:
                return
            pos = tm.end() if tm.group(0) != "<|channel|>" else tm.start()


def _valid_json(s: str) -> bool:
    try:
        json.loads(s)
        return True
    except ValueError:
        return False


def _close_json(s: str) -> str:
    """Close an unfinished JSON object (strings, arrays, objects) as a best effort."""
    stack, in_str, esc = [], False, False
    for c in s:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
        elif c in "}]" and stack:
            stack.pop()
    out = s + ('"' if in_str else "")
    out = out.rstrip().rstrip(",")
    if out.endswith(":"):
        out += " null"
    out += "".join(reversed(stack))
    return out if _valid_json(out) else (s if _valid_json(s) else "{}")


def parse_output(text: str, fmt: str = "hermes", tools=None, **kw) -> OutputParser:
    """Non-streaming parse of a whole output."""
    return OutputParser(fmt, tools=tools, **kw).parse_all(text)
