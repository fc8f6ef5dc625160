"""Constrained decoding: which tokens may come next, so the output fits a grammar.

Built on llguidance (Lark grammars with inline JSON schemas, regexes, GBNF converted to
Lark); the token masks are computed off the engine thread while the forward runs.

- ``vocab.py``: ``GrammarVocab``, the model's vocabulary as llguidance sees it (built once
  per tokenizer: token bytes, special tokens marked);
- ``grammar.py``: what a request asks for (``json_schema``, ``json_object``, Lark, GBNF,
  regex) as one llguidance grammar; ``json_rule`` writes a schema inline for the
  tool-call formats; ``GrammarError`` (HTTP 400) names what llguidance refused;
- ``constraint.py``: ``Constraint``, one request's matcher: the next token's mask, the
  sampled token consumed, stopped / accepting;
- ``masks.py``: ``MaskBatch``, the masks of every constrained slot of a step computed in
  one call on a helper thread while the model runs, then applied to each logits row.

    vocab = GrammarVocab.of(tokenizer)
    c = Constraint(vocab, json_schema_grammar({"type": "object"}))
    pending = MaskBatch(vocab.n_vocab).start([c])     # before model.forward
    row = pending.apply(0, logits_row)                # after it: masked copy
    c.consume(token)
"""
from .constraint import Constraint
from .grammar import GrammarError, gbnf_grammar, json_rule, json_schema_grammar, lark_grammar, regex_grammar
from .masks import MaskBatch, PendingMasks
from .vocab import GrammarVocab

__all__ = ["Constraint", "GrammarError", "GrammarVocab", "MaskBatch", "PendingMasks", "gbnf_grammar",
           "json_rule", "json_schema_grammar", "lark_grammar", "regex_grammar"]
