"""``FragmentCache``: the ids of text fragments already tokenized, for prompts that repeat.

llama.cpp tokenizes a text piece by piece: special tokens are cut out first and every
fragment between them is tokenized on its own (``Tokenizer.encode``). A fragment's ids
depend on its text and on whether it follows a special token, nothing else, so they can
be kept: a chat history sent again with one more turn (every turn of an agent loop) is
then looked up message by message instead of tokenized again.

Fragments shorter than ``min_chars`` are not kept (tokenizing them is as cheap as the
lookup); the least recently used ones go when the kept text passes ``max_chars``.
"""
from __future__ import annotations

import threading
from array import array
from collections import OrderedDict

DEFAULT_MIN_CHARS = 64
DEFAULT_MAX_CHARS = 8 << 20  # ~8 MB of text (its ids take about as much)


class FragmentCache:
    """LRU map (fragment text, follows a special token) -> token ids; thread-safe (prompts
    are tokenized in worker threads)."""

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS, min_chars: int = DEFAULT_MIN_CHARS):
        self.max_chars = max_chars
        self.min_chars = min_chars
        self._map: OrderedDict[tuple[str, bool], array] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._map)

    def wants(self, text: str) -> bool:
        return self.min_chars <= len(text) <= self.max_chars

    def get(self, text: str, after_special: bool) -> array | None:
        key = (text, after_special)
        with self._lock:
            ids = self._map.get(key)
            if ids is None:
                self.misses += 1
                return None
            self._map.move_to_end(key)
            self.hits += 1
            return ids

    def put(self, text: str, after_special: bool, ids: list[int]) -> None:
        key = (text, after_special)
        with self._lock:
            if key in self._map:
                return
            self._map[key] = array("i", ids)
            self._chars += len(text)
            while self._chars > self.max_chars and self._map:
                (old, _), _ids = self._map.popitem(last=False)
                self._chars -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._map.clear()
            self._chars = 0
