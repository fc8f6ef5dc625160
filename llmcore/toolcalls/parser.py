"""``OutputParser``: a model's output, streamed or whole, as reasoning, content and tool
calls in the model's format.

The text goes through two stages: the leading think block (``reasoning.py``), then the
format (``formats.py`` and one module per format); a format that splits reasoning
itself (harmony) gets the text directly. Each stage passes text on as soon as it is
decided and keeps back only what could still change, so a feed costs the length of its
text: streaming a long tool-call argument is linear in its length.
"""
from __future__ import annotations

from .formats import DEFAULT_FORMAT, FORMATS, ParseOptions, PlainContent, Stage
from .output import Delta, Output, ToolCall
from .reasoning import ReasoningSplit


class OutputParser:
    """Feed the output piece by piece (``feed``; ``finish`` at the end) to get ``Delta``
    lists, or all at once (``parse_all``); the results so far are ``content``,
    ``reasoning`` and ``calls``."""

    def __init__(self, fmt: str = DEFAULT_FORMAT, tools=None, parse_tools: bool | None = None,
                 start_in_reasoning: bool = False, parse_reasoning: bool = True,
                 parallel: bool = True):
        self.fmt = fmt if fmt in FORMATS else DEFAULT_FORMAT
        self.tools = tools or []
        self.parse_tools = bool(self.tools) if parse_tools is None else parse_tools
        self.start_in_reasoning = start_in_reasoning
        self.parse_reasoning = parse_reasoning
        self.parallel = parallel
        self._out = Output(parallel)
        opts = ParseOptions(tools=self.tools, parse_tools=self.parse_tools,
                            start_in_reasoning=start_in_reasoning, parse_reasoning=parse_reasoning)
        kind = FORMATS[self.fmt]
        if kind.own_reasoning:
            self._stage: Stage = kind(self._out, opts)
        else:
            body: Stage = kind(self._out, opts) if self.parse_tools else PlainContent(self._out)
            self._stage = ReasoningSplit(self._out, body, start_in_reasoning) if parse_reasoning else body
        self._finished = False

    @property
    def reasoning(self) -> str:
        return self._out.reasoning

    @property
    def content(self) -> str:
        return self._out.content

    @property
    def calls(self) -> list[ToolCall]:
        return self._out.calls

    @property
    def in_reasoning(self) -> bool:
        """Inside a reasoning block that is still open."""
        return not self._finished and self._stage.in_reasoning

    def feed(self, text: str) -> list[Delta]:
        if not text or self._finished:
            return []
        self._stage.feed(text, False)
        return self._out.take_deltas()

    def finish(self) -> list[Delta]:
        if self._finished:
            return []
        self._finished = True
        self._stage.feed("", True)
        return self._out.take_deltas()

    def parse_all(self, text: str) -> "OutputParser":
        """The whole output at once (non-streaming)."""
        if not self._finished:
            self._finished = True
            self._stage.feed(text, True)
            self._out.take_deltas()
        return self


def parse_output(text: str, fmt: str = DEFAULT_FORMAT, tools=None, **kw) -> OutputParser:
    """Non-streaming parse of a whole output."""
    return OutputParser(fmt, tools=tools, **kw).parse_all(text)
