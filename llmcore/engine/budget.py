"""A thinking budget: once a generation has spent `tokens` tokens inside its think block,
the block's closing tokens are forced next (``--reasoning-budget``, Anthropic's
``thinking.budget_tokens``).

The engine feeds it every generated token (``after``); ``forced()`` gives the tokens to
emit instead of sampling. The block is known by its opening and closing token sequences
(``<think>`` / ``</think>``, tokenized once by the server)."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass
class ReasoningBudget:
    tokens: int  # thinking tokens allowed
    close: tuple[int, ...]  # the tokens that end the block
    open: tuple[int, ...] = ()  # the tokens that start it (when the model opens it itself)
    starts_inside: bool = False  # the prompt opened the block
    inside: bool = False
    spent: int = 0
    _tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=16))
    _forced: collections.deque = field(default_factory=collections.deque)

    def after(self, token: int) -> None:
        """Account for a generated token (sampled or forced)."""
        self._tail.append(token)
        tail = tuple(self._tail)
        if self.inside:
            if self.close and tail[-len(self.close):] == self.close:
                self.inside = False
                self._forced.clear()
                return
            self.spent += 1
            if self.spent >= self.tokens and not self._forced:
                self._forced.extend(self.close)
        elif self.open and tail[-len(self.open):] == self.open and self.spent == 0:
            self.inside = True

    def forced(self) -> int | None:
        """The next token to emit instead of sampling, if the budget is spent."""
        return self._forced.popleft() if self._forced else None

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Back to the start of the generation."""
        self.inside, self.spent = self.starts_inside, 0
        self._tail.clear()
        self._forced.clear()
