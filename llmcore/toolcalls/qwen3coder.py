"""Qwen3-Coder XML calls: ``<function=NAME><parameter=ARG>value</parameter></function>``,
in a ``<tool_call>`` block or bare. The blocks are read as in ``hermes.py``; the call
body itself is ``xmlcall.py``."""
from __future__ import annotations

from .formats import register
from .hermes import NL, Hermes


@register
class Qwen3Coder(Hermes):
    name = "qwen3coder"
    bare_functions = True

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return "<function=" in template and "<parameter=" in template

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, per_tool

        def call(name: str, params: dict) -> str:
            items = []
            required = set(params.get("required") or ())
            for key, schema in (params.get("properties") or {}).items():
                schema = schema if isinstance(schema, dict) else {}
                if schema.get("type") == "string":
                    value = w.text_until(NL + "</parameter>" + NL)
                else:
                    value = f"{w.json(schema)} {w.lit(NL + '</parameter>' + NL)}"
                item = f"{w.lit(f'<parameter={key}>' + chr(10))} {value}"
                items.append(item if key in required else f"({item})?")
            return f"{w.lit(f'<function={name}>' + chr(10))} {' '.join(items)} {w.lit('</function>')}"

        return CallSyntax(open="<tool_call>", call=f"{w.lit(NL)} ({per_tool(tools, call)}) {w.lit(NL)}",
                          close=w.lit("</tool_call>"), sep=w.lit(NL), per_call=True)
