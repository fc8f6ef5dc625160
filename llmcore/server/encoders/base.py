"""What every encoder does: the stream driver (server/stream.py) feeds it engine events.

Streaming: `opening()` once, then `token(ev)` per TokenEvent and `final(ev)` for the
FinalEvent give the SSE events to send; `error(exc)` gives the in-band error events when a
failure comes after the headers. Not streaming: `collect(ev)` per TokenEvent, then
`body(final)` is the JSON answer."""
from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod

from ...engine import FinalEvent, TokenEvent
from ..sse import SSEEvent


class Encoder(ABC):
    def opening(self) -> list[SSEEvent]:
        return []

    @abstractmethod
    def token(self, ev: TokenEvent) -> list[SSEEvent]: ...

    @abstractmethod
    def final(self, ev: FinalEvent) -> list[SSEEvent]: ...

    @abstractmethod
    def error(self, exc: BaseException) -> list[SSEEvent]: ...

    @abstractmethod
    def collect(self, ev: TokenEvent) -> None: ...

    @abstractmethod
    def body(self, ev: FinalEvent) -> dict: ...


def echoed_model(body: dict, eng) -> str:
    """The model name the client sent (Anthropic and Responses answers echo it), or ours."""
    return body.get("model") if isinstance(body.get("model"), str) else eng.model_name


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())
