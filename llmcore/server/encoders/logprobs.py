"""Sampled tokens and their alternatives as JSON (native and OpenAI shapes)."""
from __future__ import annotations


def piece(tokenizer, token: int) -> tuple[str, list[int]]:
    p = tokenizer.token_to_piece(token)
    if isinstance(p, str):
        b = p.encode("utf-8")
        return p, list(b)
    b = bytes(p)
    return b.decode("utf-8", errors="replace"), list(b)


def _entries(tokenizer, samples, with_id: bool) -> list[dict]:
    def entry(token: int, logprob: float) -> dict:
        text, b = piece(tokenizer, token)
        e = {"id": token} if with_id else {}
        e.update(token=text, logprob=logprob, bytes=b)
        return e

    return [{**entry(s.token, s.logprob), "top_logprobs": [entry(t.id, t.logprob) for t in s.top or []]}
            for s in samples]


def native_probs(tokenizer, samples) -> list[dict]:
    """llama-server's native form (with token ids)."""
    return _entries(tokenizer, samples, with_id=True)


def openai_logprobs(tokenizer, samples) -> list[dict]:
    """OpenAI chat ``logprobs.content`` form (no ids)."""
    return _entries(tokenizer, samples, with_id=False)
