"""gpt-oss harmony messages:

    <|channel|>analysis<|message|>..<|end|>                          reasoning
    <|start|>assistant<|channel|>commentary to=functions.X ..<|message|>{..}<|call|>   a call
    <|start|>assistant<|channel|>final<|message|>..<|return|>        content

A message's body ends at ``<|end|>``, ``<|call|>``, ``<|return|>``, ``<|start|>`` or the next
``<|channel|>``; a recipient (``to=``) in its header, which starts at the ``<|start|>``
before the channel if there is one, makes it a call. Text outside messages is dropped.

This format splits reasoning itself: until the first ``<|channel|>`` the output is read
as any other (a leading think block, then content), but a start that could still be a
harmony header is waited for.
"""
from __future__ import annotations

import re

from .formats import Format, ParseOptions, PlainContent, Stage, register
from .jsontext import JsonScan, sanitize
from .output import Output
from .reasoning import ReasoningSplit
from .scan import MarkerScan

CHANNEL, MESSAGE, START = "<|channel|>", "<|message|>", "<|start|>"
_TERMINATORS = ("<|end|>", "<|call|>", "<|return|>", START, CHANNEL)
_CHANNEL_RE = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT_RE = re.compile(r"to=([\w.\-]+)")


@register
class Harmony(Format):
    name = "harmony"
    needs_special = True
    own_reasoning = True

    @staticmethod
    def detects(template: str, arch: str) -> bool:
        return "<|channel|>" in template or arch in ("gpt-oss", "gptoss", "gpt_oss")

    @classmethod
    def call_syntax(cls, tools, w, template: str = ""):
        from .grammar import CallSyntax, per_tool

        call = per_tool(tools, lambda name, params: f"{w.lit(name + ' <|constrain|>json<|message|>')} {w.json(params)}")
        # <|channel|> opens every message (analysis, final): only a forced call is constrained;
        # the call ends with <|call|>, an end-of-generation token
        return CallSyntax(open=CHANNEL + "commentary to=functions.", call=call, lazy=False)

    _WAIT, _PLAIN, _SEEK, _HEADER, _BODY, _DONE = range(6)

    def __init__(self, out: Output, opts: ParseOptions):
        super().__init__(out, opts)
        self._state = self._WAIT
        self._buf = ""  # undecided text (WAIT), text between messages (SEEK), a header (HEADER)
        self._plain: Stage = PlainContent(out)
        if opts.parse_reasoning:
            self._plain = ReasoningSplit(out, self._plain, opts.start_in_reasoning)
        self._plain_raw: list[str] = []  # the output so far, while it is read as plain text
        self._plain_channel = MarkerScan([CHANNEL])
        self._body = MarkerScan(_TERMINATORS)
        self._header_from = 0  # where the channel starts in the header being read
        self._kind = ""  # of the message being read: "call", "reasoning" or "content"
        self._body_parts: list[str] = []  # a call's body
        self._args_started = False  # ... has had more than spaces
        self._args_spaces = ""  # ... spaces at its end so far
        self._args_scan = JsonScan()  # ... streamed with raw control characters escaped
        self._steps = {self._WAIT: self._wait, self._PLAIN: self._plain_text, self._SEEK: self._seek,
                       self._HEADER: self._header, self._BODY: self._message}

    @property
    def in_reasoning(self) -> bool:
        if self._state == self._PLAIN:
            return self._plain.in_reasoning
        return self._state == self._BODY and self._kind == "reasoning"

    def feed(self, text: str, final: bool) -> None:
        rest: str | None = text
        while rest is not None and self._state != self._DONE:
            rest = self._steps[self._state](rest, final)

    # each step returns the text left for the next state, or None to wait for more

    def _wait(self, text: str, final: bool) -> str | None:
        """Before the first <|channel|>: wait while the output could still open a header."""
        s = self._buf + text
        if CHANNEL not in s:
            t = s.lstrip()
            if not final and (not t or CHANNEL.startswith(t) or START.startswith(t) or t.startswith(START)):
                self._buf = s
                return None
            self._state = self._PLAIN
        else:
            self._state = self._SEEK
        self._buf = ""
        return s

    def _plain_text(self, text: str, final: bool) -> str | None:
        """Output that does not open with a header: reasoning and content as for other
        formats, until a <|channel|> turns up (then messages are read from the start)."""
        self._plain_raw.append(text)
        f = self._plain_channel.feed(text)
        if f.marker is None:
            self._plain.feed(f.before + (self._plain_channel.flush() if final else ""), final)
            return None
        self._plain.feed(f.before, False)
        self._state = self._SEEK
        rest, self._plain_raw = "".join(self._plain_raw), []
        return rest

    def _seek(self, text: str, final: bool) -> str | None:
        """Up to the next <|channel|> (keeping the <|start|> before it, which opens the header)."""
        s = self._buf + text
        ch = s.find(CHANNEL)
        if ch < 0:
            start = s.rfind(START)
            self._buf = s[start:] if start >= 0 else s[-(len(CHANNEL) - 1):]
            return None
        start = s.rfind(START, 0, ch)
        self._buf = ""
        self._state = self._HEADER
        self._header_from = ch - (start if start >= 0 else ch)  # where the channel is in the header
        return s[start if start >= 0 else ch:]

    def _header(self, text: str, final: bool) -> str | None:
        """Up to <|message|>: the channel and the recipient."""
        s = self._buf + text
        msg = s.find(MESSAGE, self._header_from)
        if msg < 0:
            self._buf = s
            return None
        header, self._buf = s[:msg], ""
        cm = _CHANNEL_RE.search(header)
        to = _RECIPIENT_RE.search(header)
        if to and self.opts.parse_tools:
            name = to.group(1)
            self._kind = "call"
            self.out.start_call(name[len("functions."):] if name.startswith("functions.") else name)
            self._body_parts, self._args_started, self._args_spaces = [], False, ""
            self._args_scan = JsonScan()
        elif (cm.group(1) if cm else "") == "analysis":
            self._kind = "reasoning"
        else:  # final, or commentary meant for the user
            self._kind = "content"
        self._state = self._BODY
        return s[msg + len(MESSAGE):]

    def _message(self, text: str, final: bool) -> str | None:
        """A message body, up to its terminator (or the end of the output)."""
        f = self._body.feed(text)
        body = f.before
        done = f.marker is not None
        if not done and final:
            body += self._body.flush()
            done = True
        if self._kind == "call":
            self._body_parts.append(body)
            if done:
                args = sanitize("".join(self._body_parts).strip())
                self.out.end_call(args or "{}")
            else:  # spaces at either end are not part of the arguments
                if not self._args_started:
                    body = body.lstrip()
                    self._args_started = bool(body)
                core = body.rstrip()
                if core:
                    body, self._args_spaces = self._args_spaces + core, body[len(core):]
                    self.out.add_args(self._args_scan.feed(body, sanitize=True, stop_at_close=False)[0])
                else:
                    self._args_spaces += body
        elif self._kind == "reasoning":
            self.out.add_reasoning(body)
        else:
            self.out.add_content(body)
        if not done:
            return None
        self._state = self._SEEK
        if f.marker == CHANNEL:
            return CHANNEL + f.after
        if f.marker is None:
            self._state = self._DONE
            return None
        return f.after
