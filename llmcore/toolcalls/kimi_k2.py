"""Kimi K2 calls, in one section of special-token blocks:

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{..}<|tool_call_end|>
    ...<|tool_calls_section_end|>

The call id is ``functions.NAME:INDEX``; the arguments are JSON. Blocks are read by
``blocks.py``."""
from __future__ import annotations

import re

from .blocks import BlockCalls
from .formats import register
from .jsontext import DECODER, sanitize

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, CALL_END, ARGS_BEGIN = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"
_ID_RE = re.compile(r"\s*(?:functions\.)?([\w.\-]+?)(?::\d+)?\s*$")


@register
class KimiK2(BlockCalls):
    name = "kimi_k2"
    needs_special = True
    section_open, section_close = SECTION_BEGIN, SECTION_END
    call_open, call_close = CALL_BEGIN, CALL_END

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return SECTION_BEGIN in template

    def parse_body(self, body: str):
        head, sep, args = body.partition(ARGS_BEGIN)
        m = _ID_RE.match(head)
        if not sep or m is None:
            return None
        args = args.strip() or "{}"
        obj, end = DECODER.raw_decode(args)
        if not isinstance(obj, dict) or args[end:].strip():
            return None
        return [(m.group(1), sanitize(args))]

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, per_tool

        call = per_tool(tools, lambda name, params: f"{w.lit(CALL_BEGIN + 'functions.' + name + ':')} /[0-9]+/ "
                                                     f"{w.lit(ARGS_BEGIN)} {w.json(params)} {w.lit(CALL_END)}")
        return CallSyntax(open=SECTION_BEGIN, call=call, close=w.lit(SECTION_END))
