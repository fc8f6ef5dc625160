"""A chat generation's output as reasoning / content / tool-call deltas (llmcore.toolcalls),
shared by the chat encoders (OpenAI chat, Anthropic, Responses); counts reasoning tokens."""
from __future__ import annotations

from ...engine import FinalEvent, TokenEvent
from ...toolcalls import NEEDS_SPECIAL, Delta, OutputParser
from ..prompt import Prompt


class _SpecialText:
    """Token text with special tokens kept (the harmony/Mistral markers are control
    tokens the engine's decoder drops); end-of-generation tokens are left out."""

    def __init__(self, tok):
        self.tok = tok
        self.dec = tok.stream_decoder(special=True)

    def __call__(self, ev: TokenEvent) -> str:
        return "".join(self.dec.feed(t) for t in ev.tokens if not self.tok.is_eog(t))


_OPENS = ("<|channel|>analysis",)
_CLOSES = ("</think>", "<|channel|>final", "to=functions")
_OVERLAP = max(len(m) for m in _OPENS + _CLOSES) - 1


def _found(text: str, n_old: int, markers: tuple[str, ...]) -> bool:
    """Whether a marker ends in text[n_old:] (text[:n_old] was searched before)."""
    start = max(0, n_old - _OVERLAP)
    return any(text.find(m, start) >= 0 for m in markers)


class ChatOutput:
    """Streaming: `feed(ev)` per event gives deltas, `finish()` the rest. Not streaming:
    `collect(ev)` per event, then `parse()`. Either way `parser` holds the result."""

    def __init__(self, tokenizer, prompt: Prompt):
        self.prompt = prompt
        self.parser = OutputParser(prompt.tool_format, tools=prompt.tools, parse_tools=prompt.parse_tools,
                                   start_in_reasoning=prompt.starts_in_reasoning,
                                   parse_reasoning=prompt.parse_reasoning,
                                   parallel=prompt.parallel_tool_calls)
        self._special = _SpecialText(tokenizer) if prompt.tool_format in NEEDS_SPECIAL else None
        self.text = ""  # collected so far (not streaming)
        self.reasoning_tokens = 0
        self._reasoning_open = prompt.starts_in_reasoning  # collect(): seen a reasoning start
        self._reasoning_closed = False  # ... and its end
        self._think_decided = False  # whether the text starts with <think> is known

    def text_of(self, ev: TokenEvent) -> str:
        return self._special(ev) if self._special is not None else ev.text

    def feed(self, ev: TokenEvent) -> list[Delta]:
        was = self.parser.in_reasoning
        ds = self.parser.feed(self.text_of(ev))
        if was or self.parser.in_reasoning or any(d.kind == "reasoning" for d in ds):
            self.reasoning_tokens += len(ev.tokens)
        return ds

    def finish(self) -> list[Delta]:
        return self.parser.finish()

    def collect(self, ev: TokenEvent) -> None:
        """Keep the text; count reasoning tokens. Markers are looked for in the new text
        only (plus an overlap for one cut between events): linear in the output."""
        n0 = len(self.text)
        self.text += self.text_of(ev)
        if not self._reasoning_open:
            if not self._think_decided:  # only while the text is whitespace and a few chars
                head = self.text.lstrip()
                self._reasoning_open = head.startswith("<think>")
                self._think_decided = len(head) >= 7 or not "<think>".startswith(head)
            self._reasoning_open = self._reasoning_open or _found(self.text, n0, _OPENS)
        if self._reasoning_open and not self._reasoning_closed:
            self._reasoning_closed = _found(self.text, n0, _CLOSES)
            if not self._reasoning_closed:
                self.reasoning_tokens += len(ev.tokens)

    def parse(self) -> OutputParser:
        return self.parser.parse_all(self.text)

    def finish_reason(self, final: FinalEvent) -> str:
        return "tool_calls" if self.parser.calls else final.finish_reason
