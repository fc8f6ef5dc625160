"""JSON as models write it: raw control characters inside strings (code with real
newlines), objects that stop half way, text that arrives in pieces.

- ``JsonScan``: an incremental scan of one JSON value that tracks strings and bracket
  depth, so it can say where the top-level object closes and escape raw control
  characters inside strings (``sanitize``) without looking at any character twice;
- ``close_json``: best-effort closing of an unfinished object; ``valid_json``.
"""
from __future__ import annotations

import json
import re

DECODER = json.JSONDecoder(strict=False)  # models put raw newlines in code strings

_OUTSIDE = re.compile(r'["{}\[\]]')  # what changes the state outside a string
_INSIDE = re.compile(r'["\\\x00-\x1f]')  # ... and inside one
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


class JsonScan:
    """Scans one JSON value (starting at its opening bracket) piece by piece."""

    __slots__ = ("in_str", "esc", "depth")

    def __init__(self) -> None:
        self.in_str = False
        self.esc = False  # the previous character was a backslash inside a string
        self.depth = 0

    def feed(self, text: str, sanitize: bool = False, stop_at_close: bool = True) -> tuple[str, int]:
        """Scan `text`. Returns (the text scanned, with raw control characters inside
        strings escaped when `sanitize`; the index in `text` just past the bracket that
        closes the top-level value, or -1). With stop_at_close, scanning stops there."""
        out: list[str] = []
        n = len(text)
        pos = start = 0
        if self.esc and n:
            self.esc = False  # the escaped character is kept as it is
            pos = 1
        while pos < n:
            if self.in_str:
                m = _INSIDE.search(text, pos)
                if m is None:
                    break
                j, c = m.start(), m.group()
                if c == '"':
                    self.in_str = False
                    pos = j + 1
                elif c == "\\":
                    if j + 1 < n:
                        pos = j + 2
                    else:
                        self.esc = True
                        pos = n
                else:
                    if sanitize:
                        out.append(text[start:j])
                        out.append(_ESCAPES.get(c) or "\\u%04x" % ord(c))
                        start = j + 1
                    pos = j + 1
            else:
                m = _OUTSIDE.search(text, pos)
                if m is None:
                    break
                j, c = m.start(), m.group()
                pos = j + 1
                if c == '"':
                    self.in_str = True
                elif c in "{[":
                    self.depth += 1
                else:
                    self.depth -= 1
                    if self.depth == 0 and stop_at_close:
                        out.append(text[start:pos])
                        return "".join(out), pos
        out.append(text[start:])
        return "".join(out) if len(out) > 1 else out[0], -1


def sanitize(s: str) -> str:
    """Raw control characters inside JSON strings escaped (the result of a prefix is a
    prefix of the result of the whole)."""
    if not any(c < " " for c in s):
        return s
    return JsonScan().feed(s, sanitize=True, stop_at_close=False)[0]


def valid_json(s: str) -> bool:
    try:
        json.loads(s)
        return True
    except ValueError:
        return False


def close_json(s: str) -> str:
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
    return out if valid_json(out) else (s if valid_json(s) else "{}")
