"""OpenAI chat completions (/v1/chat/completions): `chat.completion` objects and
`chat.completion.chunk`s, with reasoning_content and tool_calls."""
from __future__ import annotations

from ...engine import Engine, FinalEvent, GenParams, TokenEvent
from ...toolcalls import Delta
from ..prompt import Prompt
from ..sse import DONE, SSEEvent
from .base import Encoder
from .chat_output import ChatOutput
from .logprobs import openai_logprobs
from .openai_common import head, stream_error, usage

OBJECT = "chat.completion"
CHUNK = "chat.completion.chunk"


def _delta(d: Delta) -> dict:
    if d.kind == "content":
        return {"content": d.text}
    if d.kind == "reasoning":
        return {"reasoning_content": d.text}
    if d.kind == "call":
        return {"tool_calls": [{"index": d.index, "id": d.id, "type": "function",
                                "function": {"name": d.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": d.index, "function": {"arguments": d.text}}]}


class OpenAIChatEncoder(Encoder):
    def __init__(self, eng: Engine, prompt: Prompt, params: GenParams):
        self.tokenizer = eng.tokenizer
        self.out = ChatOutput(eng.tokenizer, prompt)
        self.want_logprobs = params.sampling.n_probs > 0
        self.head = head("chatcmpl", eng.model_name)
        self.first = True  # the first chunk's delta carries the role
        self.samples: list = []

    def _logprobs(self, samples):
        return {"content": openai_logprobs(self.tokenizer, samples)} if self.want_logprobs else None

    def _chunk(self, delta: dict, logprobs=None) -> SSEEvent:
        if self.first:
            delta = {"role": "assistant", **delta}
            self.first = False
        return SSEEvent({**self.head, "object": CHUNK, "choices": [
            {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}]})

    def _usage(self, ev: FinalEvent) -> dict:
        return {**usage(ev), "completion_tokens_details": {"reasoning_tokens": self.out.reasoning_tokens}}

    def token(self, ev: TokenEvent) -> list[SSEEvent]:
        if not ev.text and not (self.want_logprobs and ev.samples):
            return []
        deltas = [_delta(d) for d in self.out.feed(ev)]
        if not deltas and self.want_logprobs and ev.samples:
            deltas = [{"content": ""}]  # the token's logprobs still go out
        return [self._chunk(delta, self._logprobs(ev.samples) if i == 0 else None)
                for i, delta in enumerate(deltas)]

    def final(self, ev: FinalEvent) -> list[SSEEvent]:
        out = [self._chunk(_delta(d)) for d in self.out.finish()]
        delta = {"role": "assistant", "content": ""} if self.first else {}
        out.append(SSEEvent({**self.head, "object": CHUNK, "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": self.out.finish_reason(ev)}]}))
        # usage always (clients' context meters and benchmarks rely on it)
        out.append(SSEEvent({**self.head, "object": CHUNK, "choices": [], "usage": self._usage(ev),
                             "timings": ev.timings.to_dict()}))
        out.append(DONE)
        return out

    def error(self, exc: BaseException) -> list[SSEEvent]:
        return stream_error(exc)

    def collect(self, ev: TokenEvent) -> None:
        self.out.collect(ev)
        self.samples += ev.samples

    def body(self, ev: FinalEvent) -> dict:
        p = self.out.parse()
        msg = {"role": "assistant", "content": p.content}
        if p.reasoning:
            msg["reasoning_content"] = p.reasoning
        if p.calls:
            msg["tool_calls"] = [c.openai() for c in p.calls]
            msg["content"] = p.content or None
        choice = {"index": 0, "message": msg, "logprobs": self._logprobs(self.samples),
                  "finish_reason": self.out.finish_reason(ev)}
        return {**self.head, "object": OBJECT, "choices": [choice], "usage": self._usage(ev),
                "timings": ev.timings.to_dict()}
