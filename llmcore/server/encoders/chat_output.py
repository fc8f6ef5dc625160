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
        try:
            self.dec = tok.stream_decoder(special=True)
        except TypeError:
            self.dec = tok.stream_decoder()

    def __call__(self, ev: TokenEvent) -> str:
        is_eog = getattr(self.tok, "is_eog", None)
        eog = getattr(self.tok, "eog_ids", ())
        out = ""
        for t in ev.tokens:
            if (is_eog(t) if is_eog else t in eog):
                continue
            out += self.dec.feed(t)
        return out


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
        """Keep the text; count reasoning tokens (cheap check on the text so far)."""
        self.text += self.text_of(ev)
        seen = self.text
        if self.prompt.starts_in_reasoning or seen.lstrip().startswith("<think>") \
                or "<|channel|>analysis" in seen:
            closed = "</think>" in seen or "<|channel|>final" in seen or "to=functions" in seen
            if not closed:
                self.reasoning_tokens += len(ev.tokens)

    def parse(self) -> OutputParser:
        return self.parser.parse_all(self.text)

    def finish_reason(self, final: FinalEvent) -> str:
        return "tool_calls" if self.parser.calls else final.finish_reason
