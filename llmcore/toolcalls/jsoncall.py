"""A JSON tool-call object as it streams in: ``{"name": .., "arguments": {..}}`` (also
``"parameters"``, or an OpenAI-style ``{"type": "function", "function": {..}}``).

``JsonCall`` is fed the text of one call (from where the object may start) and says at
each point what it is so far:

- ``PENDING``: it may become a call, its name is not known yet;
- ``CALL``: a call named ``name``; ``take_args()`` gives the argument text that arrived
  since the last take (the raw JSON of the arguments object as far as it goes, raw
  control characters escaped), ``done`` once the whole object has been read;
- ``NOT_A_CALL``: not a call object so far (``settled`` once it can never become one).

While the object is unfinished its name and arguments are read from the front (name
first, then the arguments key); once it closes it is decoded whole, which settles the
name and arguments. Every character is scanned a bounded number of times, and the
object is decoded once, when its brackets balance.
"""
from __future__ import annotations

import json
import re

import regex

from .jsontext import DECODER, JsonScan, sanitize

PENDING, CALL, NOT_A_CALL = "pending", "call", "not a call"

_NAME_RE = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGS_RE = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_ARGS_KEY_RE = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
# the same two patterns for partial matching: can a text that does not match yet grow into a match?
_NAME_PARTIAL = regex.compile(_NAME_RE.pattern)
_ARGS_PARTIAL = regex.compile(_ARGS_RE.pattern)
# how an object that is (or wraps) a call can begin, spaces removed
_CALL_HEADS = ('{"name":"', '{"type":', '{"function":')
_HEAD_LEN = max(len(k) for k in _CALL_HEADS)


def _first_nonspace(text: str, n: int) -> str:
    got: list[str] = []
    for c in text:
        if not c.isspace():
            got.append(c)
            if len(got) == n:
                break
    return "".join(got)


def _may_be_call(head: str) -> bool:
    return any(k.startswith(head) or head.startswith(k) for k in _CALL_HEADS)


class JsonCall:
    """See the module docstring."""

    def __init__(self) -> None:
        self._raw: list[str] = []  # everything fed
        self._n = 0
        self.start = -1  # index of the opening brace
        self.name: str | None = None
        self.done = False
        self.arguments: str | None = None  # the whole arguments, once done
        self.end = -1  # index just past the object, once done
        self._not_a_call = False  # settled
        self._outer: JsonScan | None = None  # the whole object, until it closes (then decoded once)
        self._head = ""  # text so far, while the name may still come
        self._head_chars = ""  # its first non-space characters
        self._name_possible = True
        self._after_name = ""  # text after the name, while the arguments key may still come
        self._args_key_possible = True
        self._args: JsonScan | None = None  # the arguments object being read
        self._args_start = -1
        self._args_closed = False  # the arguments object decoded: nothing more belongs to it
        self._args_failed = False  # it closed but does not decode: the rest of the text counts
        self._args_parts: list[str] = []
        self._args_taken = 0

    # --- state -------------------------------------------------------------------------
    @property
    def state(self) -> str:
        if self.name is not None:
            return CALL
        if self._not_a_call or self.start >= 0 and not _may_be_call(self._head_chars):
            return NOT_A_CALL
        return PENDING

    @property
    def settled(self) -> bool:
        """NOT_A_CALL for good (the object cannot still decode into a call)."""
        return self._not_a_call or self.state == NOT_A_CALL and self._outer is None

    def take_args(self) -> str:
        """Argument text (as far as it goes) since the last take."""
        parts = self._args_parts
        if self._args_taken == len(parts):
            return ""
        new = "".join(parts[self._args_taken:])
        self._args_taken = len(parts)
        return new

    def args_so_far(self) -> str:
        """All the argument text read from the front so far."""
        return "".join(self._args_parts)

    def text(self) -> str:
        """Everything fed."""
        if len(self._raw) > 1:
            self._raw[:] = ["".join(self._raw)]
        return self._raw[0] if self._raw else ""

    def rest(self) -> str:
        """The text fed after the object's end (once done)."""
        return self.text()[self.end:] if self.end >= 0 else ""

    # --- feeding -----------------------------------------------------------------------
    def feed(self, chunk: str) -> None:
        if not chunk:
            return
        offset = self._n
        self._raw.append(chunk)
        self._n += len(chunk)
        if self.done or self._not_a_call:
            return
        if self.start < 0:
            j = len(chunk) - len(chunk.lstrip())
            if j == len(chunk):
                self._head += chunk
                return
            if chunk[j] != "{":
                self._not_a_call = True
                return
            self.start = offset + j
            self._outer = JsonScan()
            scanned = chunk[j:]
        else:
            scanned = chunk
        if self._outer is not None:
            _, close = self._outer.feed(scanned)
            if close >= 0:
                self._outer = None
                if self._decode_whole():
                    return
        self._read_front(chunk)

    def _decode_whole(self) -> bool:
        """The object's brackets balance: decode it. False when it does not decode."""
        s = self.text()
        try:
            obj, end = DECODER.raw_decode(s, self.start)
        except ValueError:  # not valid JSON: read from the front for good
            return False
        fn = obj.get("function") if isinstance(obj.get("function"), dict) else obj
        name = fn.get("name")
        if not isinstance(name, str):
            self._not_a_call = True
            self.name = None
            return True
        args = fn.get("arguments", fn.get("parameters"))
        m = _ARGS_KEY_RE.search(s, self.start, end)
        if isinstance(args, str):
            a = args
        elif args is None:
            a = "{}"
        elif m and s[m.end()] == "{":
            _, aend = DECODER.raw_decode(s, m.end())
            a = sanitize(s[m.end():aend])
        else:
            a = json.dumps(args, ensure_ascii=False)
        if self.name is None:
            self.name = name
        self.arguments, self.end, self.done = a, end, True
        return True

    def _read_front(self, chunk: str) -> None:
        """The unfinished object: its name, then its arguments, from the front."""
        if self.name is None:
            if len(self._head_chars) < _HEAD_LEN:
                self._head_chars += _first_nonspace(chunk, _HEAD_LEN - len(self._head_chars))
            if not self._name_possible:
                return
            self._head += chunk
            m = _NAME_RE.match(self._head)
            if m is not None:
                try:
                    self.name = json.loads('"' + m.group(1) + '"')
                except ValueError:  # an invalid escape: no name this object can decode to
                    m = None
            if m is None:
                if not _NAME_PARTIAL.match(self._head, partial=True):
                    self._name_possible = False
                    self._head = ""
                return
            chunk, self._head = self._head[m.end():], ""
        if self._args is None:
            if not self._args_key_possible:
                return
            self._after_name += chunk
            am = _ARGS_RE.match(self._after_name)
            if am is None or am.end() == len(self._after_name):  # the key, or the spaces after it, may go on
                if am is None and not _ARGS_PARTIAL.match(self._after_name, partial=True):
                    self._args_key_possible = False
                    self._after_name = ""
                return
            chunk, self._after_name = self._after_name[am.end():], ""
            self._args_key_possible = False
            if chunk[0] != "{":
                return  # a string or other value: given whole when the object is done
            self._args = JsonScan()
            self._args_start = self._n - len(chunk)
        if self._args_closed:
            return
        text, close = self._args.feed(chunk, sanitize=True, stop_at_close=not self._args_failed)
        self._args_parts.append(text)
        if close >= 0:
            try:
                DECODER.raw_decode(self.text(), self._args_start)
                self._args_closed = True
            except ValueError:  # not valid JSON: the rest of the text counts as arguments too
                self._args_failed = True
                rest, _ = self._args.feed(chunk[close:], sanitize=True, stop_at_close=False)
                self._args_parts.append(rest)
