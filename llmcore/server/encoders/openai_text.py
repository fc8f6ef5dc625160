"""OpenAI text completions (/v1/completions): `text_completion` objects and chunks."""
from __future__ import annotations

from ...engine import Engine, FinalEvent, GenParams, TokenEvent
from ..sse import DONE, SSEEvent
from .base import Encoder
from .logprobs import openai_logprobs
from .openai_common import head, stream_error, usage

OBJECT = "text_completion"


class OpenAITextEncoder(Encoder):
    def __init__(self, eng: Engine, params: GenParams):
        self.tokenizer = eng.tokenizer
        self.want_logprobs = params.sampling.n_probs > 0
        self.head = head("cmpl", eng.model_name)
        self.text = ""
        self.samples: list = []
        self.offset = 0  # characters of completion text before the next streamed token

    def _logprobs(self, samples, start: int = 0):
        """Legacy logprobs; text_offset: where each token starts in the completion text
        (counted from `start`, the characters streamed before these samples)."""
        if not self.want_logprobs:
            return None
        items = openai_logprobs(self.tokenizer, samples)
        offsets, at = [], start
        for x in items:
            offsets.append(at)
            at += len(x["token"])
        return {"tokens": [x["token"] for x in items], "token_logprobs": [x["logprob"] for x in items],
                "top_logprobs": [{t["token"]: t["logprob"] for t in x["top_logprobs"]} for x in items],
                "text_offset": offsets}

    def _chunk(self, text: str, logprobs, finish_reason) -> SSEEvent:
        return SSEEvent({**self.head, "object": OBJECT, "choices": [
            {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}]})

    def token(self, ev: TokenEvent) -> list[SSEEvent]:
        if not ev.text and not (self.want_logprobs and ev.samples):
            return []
        lp = self._logprobs(ev.samples, self.offset)
        if lp is not None:
            self.offset = (lp["text_offset"][-1] + len(lp["tokens"][-1])) if lp["tokens"] else self.offset
        return [self._chunk(ev.text, lp, None)]

    def final(self, ev: FinalEvent) -> list[SSEEvent]:
        # usage always (clients' context meters and benchmarks rely on it)
        return [self._chunk("", None, ev.finish_reason),
                SSEEvent({**self.head, "object": OBJECT, "choices": [], "usage": usage(ev),
                          "timings": ev.timings.to_dict()}),
                DONE]

    def error(self, exc: BaseException) -> list[SSEEvent]:
        return stream_error(exc)

    def collect(self, ev: TokenEvent) -> None:
        self.text += ev.text
        self.samples += ev.samples

    def body(self, ev: FinalEvent) -> dict:
        choice = {"index": 0, "text": self.text, "logprobs": self._logprobs(self.samples),
                  "finish_reason": ev.finish_reason}
        return {**self.head, "object": OBJECT, "choices": [choice], "usage": usage(ev),
                "timings": ev.timings.to_dict()}
