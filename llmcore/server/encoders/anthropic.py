"""Anthropic Messages (/v1/messages): a `message` with thinking / text / tool_use blocks;
streamed as message_start, content_block_start / _delta / _stop per block, message_delta
and message_stop."""
from __future__ import annotations

import json

from ...engine import Engine, FinalEvent, TokenEvent
from ...toolcalls import Delta
from ..errors import anthropic_error
from ..prompt import Prompt
from ..sse import SSEEvent
from .base import Encoder, new_id
from .chat_output import ChatOutput


def _event(name: str, **fields) -> SSEEvent:
    return SSEEvent({"type": name, **fields}, name=name)


class AnthropicEncoder(Encoder):
    def __init__(self, eng: Engine, prompt: Prompt, model: str):
        self.out = ChatOutput(eng.tokenizer, prompt)
        self.n_prompt = len(prompt.tokens)
        self.head = {"id": new_id("msg").replace("-", "_"), "type": "message", "role": "assistant",
                     "model": model}
        self.index = -1  # of the open content block
        self.open: str | None = None  # its type (thinking, text, tool_use), None when closed

    # ---- streaming ----

    def opening(self) -> list[SSEEvent]:
        return [_event("message_start", message={
            **self.head, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self.n_prompt, "output_tokens": 0,
                      "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}})]

    def _close_block(self) -> list[SSEEvent]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", index=self.index)]

    def _open_block(self, kind: str, block: dict) -> list[SSEEvent]:
        out = self._close_block()
        self.index += 1
        self.open = kind
        return out + [_event("content_block_start", index=self.index, content_block=block)]

    def _send(self, d: Delta) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        if d.kind == "reasoning":
            if self.open != "thinking":
                out = self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            delta = {"type": "thinking_delta", "thinking": d.text}
        elif d.kind == "content":
            if self.open != "text":
                out = self._open_block("text", {"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": d.text}
        elif d.kind == "call":
            return self._open_block("tool_use", {"type": "tool_use", "id": d.id, "name": d.name, "input": {}})
        else:
            delta = {"type": "input_json_delta", "partial_json": d.text}
        return out + [_event("content_block_delta", index=self.index, delta=delta)]

    def token(self, ev: TokenEvent) -> list[SSEEvent]:
        return [e for d in self.out.feed(ev) for e in self._send(d)]

    def final(self, ev: FinalEvent) -> list[SSEEvent]:
        out = [e for d in self.out.finish() for e in self._send(d)]
        out += self._close_block()
        reason, seq = self._stop(ev)
        return out + [_event("message_delta", delta={"stop_reason": reason, "stop_sequence": seq},
                             usage=_usage(ev)),
                      _event("message_stop")]

    def error(self, exc: BaseException) -> list[SSEEvent]:
        return [SSEEvent(anthropic_error(exc)[1], name="error")]

    # ---- one message ----

    def collect(self, ev: TokenEvent) -> None:
        self.out.collect(ev)

    def body(self, ev: FinalEvent) -> dict:
        p = self.out.parse()
        content = []
        if p.reasoning:
            content.append({"type": "thinking", "thinking": p.reasoning, "signature": ""})
        if p.content:
            content.append({"type": "text", "text": p.content})
        for c in p.calls:
            try:
                args = json.loads(c.arguments or "{}")
            except ValueError:
                args = {}
            content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": args})
        reason, seq = self._stop(ev)
        return {**self.head, "content": content, "stop_reason": reason, "stop_sequence": seq,
                "usage": _usage(ev)}

    def _stop(self, final: FinalEvent) -> tuple[str, str | None]:
        if self.out.parser.calls:
            return "tool_use", None
        if final.stop_type == "limit":
            return "max_tokens", None
        if final.stop_type == "word":
            return "stop_sequence", final.stopping_word
        return "end_turn", None


def _usage(final: FinalEvent) -> dict:
    cached = final.timings.cache_n
    return {"input_tokens": max(0, final.n_prompt - cached), "output_tokens": final.n_predicted,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
