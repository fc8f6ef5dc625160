"""What the OpenAI chat and text encoders share: the head of every object, usage, and
the in-band error."""
from __future__ import annotations

from ... import __version__
from ...engine import FinalEvent
from ..errors import openai_error
from ..sse import DONE, SSEEvent
from .base import new_id, now

FINGERPRINT = f"llmcore-{__version__}"


def head(id_prefix: str, model: str) -> dict:
    return {"id": new_id(id_prefix), "created": now(), "model": model, "system_fingerprint": FINGERPRINT}


def usage(final: FinalEvent) -> dict:
    return {
        "prompt_tokens": final.n_prompt,
        "completion_tokens": final.n_predicted,
        "total_tokens": final.n_prompt + final.n_predicted,
        "prompt_tokens_details": {"cached_tokens": final.timings.cache_n},
    }


def stream_error(exc: BaseException) -> list[SSEEvent]:
    """Headers are out: the error as a `data:` frame, then [DONE]."""
    return [SSEEvent(openai_error(exc)[1]), DONE]
