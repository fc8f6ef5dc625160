"""llama-server's native /completion: one object per chunk, the last with `stop: true`."""
from __future__ import annotations

from ...engine import Engine, FinalEvent, GenParams, Task, TokenEvent
from ..errors import openai_error
from ..prompt import Prompt
from ..sse import SSEEvent
from .base import Encoder
from .logprobs import native_probs


def generation_settings(eng: Engine, params: GenParams | None = None) -> dict:
    """The settings a request ran with (the engine's defaults without one), as /props and
    /completion show them."""
    gp = params
    sp = gp.sampling if gp else eng.cfg.sampling
    d = sp.to_dict()
    d.update({
        "n_ctx": eng.n_ctx_slot,
        "n_predict": gp.n_predict if gp else eng.cfg.n_predict,
        "stop": gp.stop if gp else [],
        "ignore_eos": gp.ignore_eos if gp else False,
        "cache_prompt": gp.cache_prompt if gp else True,
        "id_slot": gp.id_slot if gp else -1,
        "model": eng.model_name,
    })
    return d


class NativeEncoder(Encoder):
    def __init__(self, eng: Engine, prompt: Prompt, params: GenParams, task: Task,
                 return_tokens: bool):
        self.eng = eng
        self.params = params
        self.task = task  # its slot id, once the engine picked one
        self.n_prompt = len(prompt.tokens)
        self.return_tokens = return_tokens
        self.want_probs = params.sampling.n_probs > 0
        self.n_predicted = 0  # streamed so far
        self.text = ""
        self.tokens: list[int] = []
        self.samples: list = []

    def _final(self, content: str, tokens: list[int], final: FinalEvent, samples) -> dict:
        d = {
            "index": 0, "content": content, "tokens": tokens if self.return_tokens else [],
            "id_slot": final.slot_id, "stop": True, "model": self.eng.model_name,
            "tokens_predicted": final.n_predicted, "tokens_evaluated": final.n_prompt,
            "generation_settings": generation_settings(self.eng, self.params), "prompt": "",
            "has_new_line": "\n" in content, "truncated": final.truncated,
            "stop_type": final.stop_type, "stopping_word": final.stopping_word,
            "tokens_cached": final.n_prompt + final.n_predicted,
            "timings": final.timings.to_dict(),
        }
        if self.want_probs:
            d["completion_probabilities"] = native_probs(self.eng.tokenizer, samples)
        return d

    def token(self, ev: TokenEvent) -> list[SSEEvent]:
        self.n_predicted += len(ev.tokens)
        if not ev.text and not self.return_tokens and not self.want_probs:
            return []
        chunk = {"index": 0, "content": ev.text, "tokens": ev.tokens if self.return_tokens else [],
                 "stop": False, "id_slot": self.task.slot_id, "tokens_predicted": self.n_predicted,
                 "tokens_evaluated": self.n_prompt}
        if self.want_probs:
            chunk["completion_probabilities"] = native_probs(self.eng.tokenizer, ev.samples)
        return [SSEEvent(chunk)]

    def final(self, ev: FinalEvent) -> list[SSEEvent]:
        return [SSEEvent(self._final("", [], ev, []))]

    def error(self, exc: BaseException) -> list[SSEEvent]:
        return [SSEEvent(openai_error(exc)[1])]  # llama-server sends no [DONE]

    def collect(self, ev: TokenEvent) -> None:
        self.text += ev.text
        self.tokens += ev.tokens
        self.samples += ev.samples

    def body(self, ev: FinalEvent) -> dict:
        return self._final(self.text, self.tokens, ev, self.samples)
