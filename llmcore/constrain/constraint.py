"""``Constraint``: one request's grammar matcher, next to its sampler.

Made from a grammar string (``grammar.py``) in a request's worker thread, where a
grammar that does not compile is a ``GrammarError`` before any work; the engine then
asks it for the next token's mask (``masks.py``), and feeds it each sampled token.
"""
from __future__ import annotations

from .grammar import GrammarError
from .vocab import GrammarVocab


class Constraint:
    def __init__(self, vocab: GrammarVocab, grammar: str, what: str = "grammar"):
        import llguidance

        self.vocab = vocab
        self.grammar = grammar
        self.matcher = llguidance.LLMatcher(vocab.lltokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"{what}: {_first_line(self.matcher.get_error())}")

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    def consume(self, token: int) -> bool:
        """Advance by a sampled token; False when the grammar does not allow it."""
        return bool(self.matcher.consume_token(int(token)))

    @property
    def stopped(self) -> bool:
        """Nothing but end-of-generation may follow (the grammar is complete)."""
        return self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        return self.matcher.is_accepting()

    @property
    def error(self) -> str:
        return _first_line(self.matcher.get_error()) if self.matcher.is_error() else ""

    def reset(self) -> None:
        """Back to the start (a request that starts over after waiting for memory)."""
        self.matcher.reset()


def _first_line(msg: str) -> str:
    msg = (msg or "").strip()
    return msg.splitlines()[0] if msg else "the grammar is not valid"
