"""Qwen3-Coder XML calls: ``<function=NAME><parameter=ARG>value</parameter></function>``,
in a ``<tool_call>`` block or bare. The blocks are read as in ``hermes.py``; the call
body itself is ``xmlcall.py``."""
from __future__ import annotations

from .formats import register
from .hermes import Hermes


@register
class Qwen3Coder(Hermes):
    name = "qwen3coder"
    bare_functions = True

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return "<function=" in template and "<parameter=" in template
