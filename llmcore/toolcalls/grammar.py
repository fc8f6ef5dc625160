"""Tool calls as a grammar: the output forced to calls in the model's own syntax whose
arguments fit each tool's JSON schema (``tool_choice`` "required" or a named function),
or a lazy grammar for "auto" that lets the model write freely and constrains it from
the moment it opens a call (llama.cpp's grammar triggers), so a call that comes out
always parses.

Each format says how it writes calls (``Format.call_syntax`` -> ``CallSyntax``, in Lark
written with ``LarkWriter``); ``tool_call_grammar`` puts the pieces together. The Lark
goes to ``llmcore.constrain``; special tokens (``<|tool_call_start|>``) are named by id,
since their bytes never match text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..constrain.grammar import json_rule

ANY_TEXT = r"/(.|\n)*/"


@dataclass(frozen=True)
class CallSyntax:
    """How a format writes calls: `open` (text) starts the calls, `call` is one call in
    Lark, `sep` goes between two calls and `close` after them. With `per_call` each call
    is wrapped in open .. close (Hermes blocks), else the calls share one pair (a list,
    a section). `lazy`: whether "auto" may constrain from `open` on (False when `open`
    also starts other output, e.g. harmony's channels). `plain`: for a format whose calls
    are the whole output, the Lark of an answer that is not a call ("auto" is then
    `plain | calls`)."""

    open: str
    call: str
    close: str = ""
    sep: str = ""
    per_call: bool = False
    lazy: bool = True
    plain: str = ""


class LarkWriter:
    """Writes Lark for a vocabulary: literals (special tokens by id), JSON-schema rules,
    free text, helper rules with fresh names (`rules` holds their definitions).

    `free_ids`: the special tokens free text may hold (a model's think markers can be
    control tokens); end-of-generation tokens are never among them (the grammar's end
    is where they are allowed)."""

    def __init__(self, specials: Mapping[str, int] | None = None, free_ids: Sequence[int] = ()):
        self.specials = dict(specials or {})
        self.free_ids = frozenset(int(i) for i in free_ids)
        self.rules: list[str] = []
        self._n = 0
        self._free: dict[frozenset, str] = {}

    def lit(self, text: str) -> str:
        """`text` as Lark: string literals, with each special token inside named by id."""
        if not text:
            return ""
        best = None
        for s, tid in self.specials.items():
            i = text.find(s) if s else -1
            if i >= 0 and (best is None or i < best[0] or (i == best[0] and len(s) > len(best[1]))):
                best = (i, s, tid)
        if best is None:
            return json.dumps(text, ensure_ascii=False)
        i, s, tid = best
        parts = [self.lit(text[:i]), f"<[{tid}]>", self.lit(text[i + len(s):])]
        return " ".join(p for p in parts if p)

    def is_special(self, text: str) -> bool:
        return text in self.specials

    def json(self, schema: dict) -> str:
        return json_rule(schema)

    def rule(self, body: str, options: str = "") -> str:
        """A new named rule for `body`; returns its name."""
        self._n += 1
        name = f"r{self._n}"
        self.rules.append(f"{name}{'[' + options + ']' if options else ''}: {body}")
        return name

    def free(self, exclude: Sequence[int] = ()) -> str:
        """A rule for free text: any text, and the free special tokens but `exclude`."""
        ids = self.free_ids - frozenset(exclude)
        if ids not in self._free:
            if ids:
                self._free[ids] = self.rule(f"(/(.|\\n)+/ | <[{_ranges(ids)}]>)*")
            else:
                self._free[ids] = self.rule(ANY_TEXT)
        return self._free[ids]

    def text_until(self, end: str) -> str:
        """Any text, then `end` (the first `end` ends it)."""
        if self.is_special(end):
            return f"{self.free([self.specials[end]])} {self.lit(end)}"
        return self.rule(f"/(.|\\n)*{_regex_escape(end)}/", "lazy")

    def alternatives(self, items: Sequence[str]) -> str:
        items = [i for i in items if i]
        if len(items) == 1:
            return items[0]
        return "(" + " | ".join(items) + ")"


def _ranges(ids) -> str:
    """Token ids as llguidance's range list: 3-5,9."""
    out, run = [], []
    for i in sorted(ids):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _regex_escape(text: str) -> str:
    out = []
    for c in text:
        if c.isalnum() or c in " _-:=,\"'<>":
            out.append(c)
        elif c == "\n":
            out.append("\\n")
        elif c == "/":
            out.append("\\/")
        else:
            out.append("\\" + c if c in ".^$*+?()[]{}|\\" else c)
    return "".join(out)


# ---- tools as JSON-schema pieces ---------------------------------------------------------


def tool_name(tool: dict) -> str | None:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def tool_parameters(tool: dict) -> dict:
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    params = fn.get("parameters") or fn.get("input_schema") if isinstance(fn, dict) else None
    return params if isinstance(params, dict) else {"type": "object"}


def call_object_schema(tools: Sequence[dict], args_key: str = "arguments") -> dict:
    """A JSON call object: {"name": one of the tools, args_key: its arguments}."""
    options = [{"type": "object", "properties": {"name": {"const": tool_name(t)}, args_key: tool_parameters(t)},
                "required": ["name", args_key], "additionalProperties": False}
               for t in tools if tool_name(t)]
    return options[0] if len(options) == 1 else {"anyOf": options}


def per_tool(tools: Sequence[dict], make) -> str:
    """Lark alternatives, one per tool: make(name, parameters) -> Lark."""
    return " | ".join(f"({make(tool_name(t), tool_parameters(t))})" for t in tools if tool_name(t))


# ---- the grammar --------------------------------------------------------------------------


def tool_call_grammar(syntax: CallSyntax | None, w: LarkWriter, forced: bool, parallel: bool,
                      reasoning_open: bool = False, reasoning_end: str = "</think>") -> str | None:
    """The Lark grammar of an output with calls in `syntax`: only calls (`forced`), or
    free text in which a call, once opened, must be complete and fit (lazy). None when
    the format cannot do what is asked. `reasoning_open`: the prompt opened a think
    block: its text comes first, up to `reasoning_end`."""
    if syntax is None or (not forced and not syntax.lazy and not syntax.plain):
        return None
    call = w.rule(syntax.call)
    o, c, sep = w.lit(syntax.open), syntax.close, syntax.sep
    if syntax.per_call:
        one = f"{o} {call} {c}".strip()
        group = f"{one} ({sep} {one})*" if parallel else one
        rest = f"{call} {c}".strip()
        rest_group = f"{rest} ({sep} {one})*" if parallel else rest
    else:
        calls = f"{call} ({sep} {call})*" if parallel else call
        group = f"{o} {calls} {c}".strip()
        rest_group = f"{calls} {c}".strip()
    head = w.text_until(reasoning_end) + " " if reasoning_open else ""
    if forced:
        start = f"start: {head}{group}"
    elif not syntax.lazy:
        start = f"start: {head}({syntax.plain} | {group})"
    else:
        trigger = _trigger(w, syntax.open)
        start = f"start: {head}({trigger} {rest_group})* {w.free()}"
    return "\n".join([start, *w.rules]) + "\n"


def _trigger(w: LarkWriter, open_text: str) -> str:
    """Free text that ends with the opening of a call (where constraining starts)."""
    if w.is_special(open_text):
        return f"{w.free([w.specials[open_text]])} {w.lit(open_text)}"
    first = min(((open_text.find(s), s) for s in w.specials if s and s in open_text), default=None)
    if first is not None and first[0] == 0:  # a special token, then text
        s = first[1]
        return f"{w.free([w.specials[s]])} {w.lit(s)} {w.lit(open_text[len(s):])}".strip()
    # text: free text (special tokens and all), then the text ending at the opener
    head = open_text if first is None else open_text[:first[0]]
    lead = w.rule("/(.|\\n)*" + _regex_escape(head) + "/", "lazy")
    return f"{w.free()} {lead} {w.lit(open_text[len(head):])}".strip()
