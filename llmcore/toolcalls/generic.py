"""The generic format, for models whose chat template has no tools section (SmolLM2):
the tools and the call syntax go into the system prompt (``system_prompt``), and the
model answers either in plain text or with one JSON object,

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}

(``{"tool_call": {..}}`` and llama.cpp's generic ``{"response": "..."}`` are read too).
An output that starts with ``{`` is held back until its object closes (each character
scanned once), then decoded once: calls, or the response text as content; anything
else is content as written. Earlier turns are shown to the template in the same
syntax (``render_messages``): calls as that JSON, tool results as user turns.
"""
from __future__ import annotations

import json
from typing import Sequence

from .formats import Format, ParseOptions, register
from .jsontext import DECODER, JsonScan
from .output import Output


def system_prompt(tools: Sequence[dict], forced: str | None = None) -> str:
    """What the model is told about the tools. `forced`: "required", or a tool name."""
    from .grammar import tool_name, tool_parameters

    defs = [{"name": tool_name(t), "description": (t.get("function") or t).get("description", ""),
             "parameters": tool_parameters(t)} for t in tools if tool_name(t)]
    example = '{"tool_calls": [{"name": "<tool name>", "arguments": {<the arguments>}}]}'
    lines = ["You can call these tools (each with a JSON schema of its arguments):",
             "\n".join(json.dumps(d, ensure_ascii=False) for d in defs), ""]
    if forced == "required":
        lines.append(f"Answer with a tool call, as this JSON object and nothing else:\n{example}")
    elif forced:
        lines.append(f"Answer with a call of {forced}, as this JSON object and nothing else:\n{example}")
    else:
        lines.append("To call tools, answer with only this JSON object:\n" + example
                     + "\nOtherwise answer in plain text.")
    return "\n".join(lines)


def render_messages(messages: list[dict], tools: Sequence[dict], forced: str | None) -> list[dict]:
    """The conversation for a template without tools: the tool text in the system
    message, calls as the JSON the model writes, tool results as user turns."""
    out: list[dict] = []
    sys_text = system_prompt(tools, forced)
    msgs = list(messages)
    if msgs and msgs[0].get("role") in ("system", "developer") and isinstance(msgs[0].get("content"), str):
        out.append({"role": "system", "content": msgs[0]["content"] + "\n\n" + sys_text})
        msgs = msgs[1:]
    else:
        out.append({"role": "system", "content": sys_text})
    for m in msgs:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function") or {}
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        pass
                calls.append({"name": fn.get("name"), "arguments": args})
            text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
            content = m.get("content") if isinstance(m.get("content"), str) else ""
            out.append({"role": "assistant", "content": (content + "\n" if content else "") + text})
        elif role == "tool":
            body = m.get("content")
            body = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
            out.append({"role": "user", "content": json.dumps(
                {"tool_response": {"tool_call_id": m.get("tool_call_id"), "content": body}}, ensure_ascii=False)})
        else:
            out.append({k: v for k, v in m.items() if k != "tool_calls"})
    return out


@register
class Generic(Format):
    name = "generic"

    _UNDECIDED, _JSON, _TEXT, _AFTER = range(4)

    def __init__(self, out: Output, opts: ParseOptions):
        super().__init__(out, opts)
        self._state = self._UNDECIDED
        self._lead = ""
        self._raw: list[str] = []
        self._scan = JsonScan()

    def feed(self, text: str, final: bool) -> None:
        if self._state == self._UNDECIDED:
            self._lead += text
            s = self._lead.lstrip()
            if not s and not final:
                return
            if s.startswith("{"):
                self._state, text = self._JSON, s
            else:
                self._state, text = self._TEXT, self._lead
            self._lead = ""
        if self._state == self._TEXT:
            self.out.add_content(text)
            return
        if self._state == self._AFTER:
            if text.strip():
                self.out.add_content(text)
            return
        _, close = self._scan.feed(text)
        self._raw.append(text if close < 0 else text[:close])
        if close < 0 and not final:
            return
        raw = "".join(self._raw)
        if not self._settle(raw):
            self.out.add_content(raw)
        self._state = self._AFTER
        if close >= 0 and text[close:].strip():
            self.out.add_content(text[close:])

    def _settle(self, raw: str) -> bool:
        try:
            obj, _ = DECODER.raw_decode(raw)
        except ValueError:
            return False
        if not isinstance(obj, dict):
            return False
        calls = obj.get("tool_calls")
        if isinstance(obj.get("tool_call"), dict):
            calls = [obj["tool_call"]]
        if isinstance(calls, list) and calls:
            ok = [c for c in calls if isinstance(c, dict) and isinstance(c.get("name"), str)]
            if len(ok) != len(calls):
                return False
            for c in ok:
                args = c.get("arguments", {})
                self.out.start_call(c["name"])
                self.out.end_call(args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
            return True
        if isinstance(obj.get("response"), str) and len(obj) == 1:
            self.out.add_content(obj["response"])
            return True
        return False

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, call_object_schema

        return CallSyntax(open='{"tool_calls": [', call=w.json(call_object_schema(tools)), sep='", "',
                          close='"]}"', lazy=False, plain=w.rule(r"/([^{](.|\n)*)?/"))
