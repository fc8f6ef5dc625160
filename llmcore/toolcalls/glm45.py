"""GLM-4.5 / 4.6 calls: a block per call, arguments as key / value pairs:

    <tool_call>NAME
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

A value is taken as its schema type asks (a string stays a string, anything else is
parsed as JSON when it is JSON), as Qwen3-Coder's are. Blocks are read by ``blocks.py``."""
from __future__ import annotations

import json
import re

from .blocks import BlockCalls
from .formats import register
from .xmlcall import schema_types, xml_value

_PAIR_RE = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


@register
class Glm45(BlockCalls):
    name = "glm45"
    needs_special = True
    call_open, call_close = "<tool_call>", "</tool_call>"

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return "<arg_key>" in template

    def parse_body(self, body: str):
        name, _, rest = body.strip().partition("\n")
        name = name.strip()
        if not name or "<" in name or " " in name:
            return None
        leftover = _PAIR_RE.sub("", rest)
        if leftover.strip():
            return None
        types = schema_types(self.opts.tools, name)
        args = {k.strip(): xml_value(v, types.get(k.strip())) for k, v in _PAIR_RE.findall(rest)}
        return [(name, json.dumps(args, ensure_ascii=False))]

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, per_tool

        def call(name: str, params: dict) -> str:
            items = []
            required = set(params.get("required") or ())
            for key, schema in (params.get("properties") or {}).items():
                schema = schema if isinstance(schema, dict) else {}
                value = (w.text_until("</arg_value>") if schema.get("type") == "string"
                         else f"{w.json(schema)} {w.lit('</arg_value>')}")
                item = f"{w.lit(f'<arg_key>{key}</arg_key>' + chr(10) + '<arg_value>')} {value} \"\\n\""
                items.append(item if key in required else f"({item})?")
            return f"{w.lit(name + chr(10))} {' '.join(items)}"

        return CallSyntax(open="<tool_call>", call=per_tool(tools, call), close=w.lit("</tool_call>"),
                          sep='"\\n"', per_call=True)
