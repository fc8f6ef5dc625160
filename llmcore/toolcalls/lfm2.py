"""LFM2 calls: a Python list of calls between special tokens,

    <|tool_call_start|>[get_weather(city="Paris"), get_time(zone="CET")]<|tool_call_end|>

Arguments are keyword arguments with Python literal values (strings, numbers, True /
False / None, lists, dicts), read with ``ast.literal_eval``, never evaluated. Blocks are
read by ``blocks.py``."""
from __future__ import annotations

import ast
import json

from .blocks import BlockCalls
from .formats import register

CALL_START, CALL_END = "<|tool_call_start|>", "<|tool_call_end|>"
MAX_BODY = 1 << 20  # characters of one block parsed as Python


def _name(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


@register
class Lfm2(BlockCalls):
    name = "lfm2"
    needs_special = True
    call_open, call_close = CALL_START, CALL_END

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return CALL_START in template

    def parse_body(self, body: str):
        body = body.strip()
        if not body or len(body) > MAX_BODY:
            return None
        tree = ast.parse(body, mode="eval").body
        nodes = tree.elts if isinstance(tree, ast.List) else [tree]
        calls = []
        for n in nodes:
            if not isinstance(n, ast.Call) or n.args or _name(n.func) is None:
                return None
            args = {kw.arg: ast.literal_eval(kw.value) for kw in n.keywords if kw.arg}
            calls.append((_name(n.func), json.dumps(args, ensure_ascii=False)))
        return calls

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, per_tool

        py_str = r'/"(\\\\.|[^"\\\\\n])*"/'

        def value(schema: dict) -> str:
            t = schema.get("type") if isinstance(schema, dict) else None
            if t == "string" and "enum" not in schema:
                return w.rule(py_str)
            if t == "boolean":
                return '("True" | "False")'
            return w.json(schema if isinstance(schema, dict) else {})  # numbers, lists, enums: JSON is Python

        def call(name: str, params: dict) -> str:
            props = params.get("properties") or {}
            required = [k for k in props if k in set(params.get("required") or ())]
            optional = [k for k in props if k not in required]
            items = [f"{w.lit(k + '=')} {value(props[k])}" for k in required]
            items += [f"({w.lit(', ' if required or i else '')} {w.lit(k + '=')} {value(props[k])})?".replace("( ", "(")
                      for i, k in enumerate(optional)]
            body = ' ", " '.join(items[:len(required)])
            tail = " ".join(items[len(required):])
            return f"{w.lit(name + '(')} {body} {tail} \")\"".replace("  ", " ")

        return CallSyntax(open=CALL_START + "[", call=per_tool(tools, call), sep='", "',
                          close=f'"]" {w.lit(CALL_END)}')
