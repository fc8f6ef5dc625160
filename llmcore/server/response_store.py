"""Past Responses kept for ``previous_response_id``: each as the conversation so far, in
Responses input items (its input, then its output turned into input). In memory only,
bounded by count and by characters; the oldest go first. A request naming a response not
kept here (never stored, ``store: false``, evicted, or from before a restart) is a 400."""
from __future__ import annotations

import collections
import json
import threading

from ..errors import RequestError


class UnknownResponseError(RequestError):
    """previous_response_id names no response kept here (HTTP 400)."""


def output_as_input(output: list[dict]) -> list[dict]:
    """A response's output items as the input items that continue the conversation."""
    items = []
    for it in output:
        kind = it.get("type")
        if kind == "message":
            text = "".join(p.get("text", "") for p in it.get("content") or [] if isinstance(p, dict))
            items.append({"type": "message", "role": "assistant", "content": text})
        elif kind == "function_call":
            items.append({"type": "function_call", "call_id": it.get("call_id"), "name": it.get("name"),
                          "arguments": it.get("arguments") or "{}"})
        elif kind == "reasoning":
            items.append({"type": "reasoning", "content": [p for p in it.get("content") or []
                                                            if isinstance(p, dict)]})
    return items


class ResponseStore:
    def __init__(self, max_entries: int = 256, max_chars: int = 32 * 1024 * 1024):
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._items: collections.OrderedDict[str, tuple[list[dict], int]] = collections.OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, conversation: list[dict]) -> None:
        size = len(json.dumps(conversation, ensure_ascii=False))
        if size > self.max_chars:
            return  # too big to keep: a later request naming it gets the 400
        with self._lock:
            self._items[response_id] = (conversation, size)
            self._chars += size
            while self._items and (len(self._items) > self.max_entries or self._chars > self.max_chars):
                _, (_, n) = self._items.popitem(last=False)
                self._chars -= n

    def get(self, response_id: str) -> list[dict]:
        with self._lock:
            got = self._items.get(response_id)
            if got is not None:
                self._items.move_to_end(response_id)
        if got is None:
            raise UnknownResponseError(
                f"previous_response_id {response_id!r}: no such response here (this server keeps the "
                f"last {self.max_entries} stored responses in memory)")
        return list(got[0])

    def __len__(self) -> int:
        return len(self._items)
