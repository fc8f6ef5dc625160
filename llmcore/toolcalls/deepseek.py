"""DeepSeek V3 / R1 calls (and V3.1's shorter form), in one section:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {..}
    ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>                          (V3, R1)
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{..}<｜tool▁call▁end｜>...   (V3.1)

Blocks are read by ``blocks.py``; the arguments are JSON (fenced or not)."""
from __future__ import annotations

from .blocks import BlockCalls
from .formats import register
from .jsontext import DECODER, sanitize

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


@register
class DeepSeek(BlockCalls):
    name = "deepseek"
    needs_special = True
    section_open, section_close = CALLS_BEGIN, CALLS_END
    call_open, call_close = CALL_BEGIN, CALL_END

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return "tool▁calls▁begin" in template

    def parse_body(self, body: str):
        head, sep, rest = body.partition(SEP)
        if not sep:
            return None
        head = head.strip()
        if head == "function":  # V3 / R1: the name ends its line, the arguments are fenced
            name, _, rest = rest.partition("\n")
            rest = rest.strip()
            if rest.startswith("```"):
                rest = rest[3:]
                rest = rest[4:] if rest.startswith("json") else rest
                rest = rest.rsplit("```", 1)[0] if "```" in rest else rest
        else:
            name = head
        name, args = name.strip(), rest.strip() or "{}"
        obj, end = DECODER.raw_decode(args)
        if not name or not isinstance(obj, dict) or args[end:].strip():
            return None
        return [(name, sanitize(args))]

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, per_tool

        if "```json" in template:
            def call(name, params):
                return (f"{w.lit(CALL_BEGIN + 'function' + SEP + name + chr(10) + '```json' + chr(10))} "
                        f"{w.json(params)} {w.lit(chr(10) + '```' + CALL_END)}")
        else:
            def call(name, params):
                return f"{w.lit(CALL_BEGIN + name + SEP)} {w.json(params)} {w.lit(CALL_END)}"
        return CallSyntax(open=CALLS_BEGIN, call=per_tool(tools, call), sep='"\\n"', close=w.lit(CALLS_END))
