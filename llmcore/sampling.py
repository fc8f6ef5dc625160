"""Token sampling: penalties, top-k, top-p, min-p, temperature, seeded draws, top-n probs.

The order follows llama.cpp's default sampler chain: penalties -> top_k -> top_p ->
min_p -> temperature -> draw. top_p and min_p look at the softmax of the (penalised)
logits before temperature, as llama.cpp does. temperature <= 0 means greedy.

Everything is vectorised NumPy over the vocabulary; one Sampler per request holds the
request's own numpy Generator so a fixed seed gives the same tokens whatever else runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Sequence

import numpy as np

from . import _kernels
from .errors import RequestError

_top_k = _kernels.load("sampling").top_k if _kernels.ENABLED else None


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40  # <= 0: off
    top_p: float = 0.95  # >= 1: off
    min_p: float = 0.05  # <= 0: off
    repeat_penalty: float = 1.0  # 1: off
    repeat_last_n: int = 64  # 0: off, -1: whole context
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = -1  # -1: random
    n_probs: int = 0  # top-n probabilities per generated token
    logit_bias: dict[int, float] = field(default_factory=dict)

    def validate(self) -> "SamplingParams":
        if not np.isfinite(self.temperature):
            raise RequestError("temperature must be a finite number")
        if self.top_p < 0:
            raise RequestError("top_p must be >= 0")
        if self.n_probs < 0:
            raise RequestError("n_probs must be >= 0")
        if self.repeat_penalty <= 0:
            raise RequestError("repeat_penalty must be > 0")
        return self

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["logit_bias"] = [[int(k), float(v)] for k, v in self.logit_bias.items()]
        return d


@dataclass
class TokenProb:
    id: int
    logprob: float


@dataclass
class Sample:
    token: int
    logprob: float  # log-probability of the chosen token under the full distribution
    top: list[TokenProb] | None  # n_probs most likely tokens, or None


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x)
    z = x - m
    return z - np.log(np.sum(np.exp(z)))


def apply_penalties(logits: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    """Repeat (llama.cpp style: divide positive, multiply negative), presence and frequency
    penalties over the last `repeat_last_n` tokens. Returns a new array."""
    if p.repeat_last_n == 0 or not len(history):
        return logits
    if p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0:
        return logits
    last = history if p.repeat_last_n < 0 else history[-p.repeat_last_n:]
    ids, counts = np.unique(np.asarray(last, dtype=np.int64), return_counts=True)
    ok = (ids >= 0) & (ids < logits.shape[0])
    ids, counts = ids[ok], counts[ok]
    out = logits.copy()
    v = out[ids]
    if p.repeat_penalty != 1.0:
        v = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
    v = v - counts * p.frequency_penalty - (counts > 0) * p.presence_penalty
    out[ids] = v
    return out


def candidates(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and their probabilities (at temperature) left after top_k/top_p/min_p.

    Ids come sorted by decreasing logit."""
    n = logits.shape[0]
    k = p.top_k if 0 < p.top_k < n else n
    got = 0
    if k < n and _top_k is not None and logits.dtype == np.float32 and logits.flags.c_contiguous:
        ids, vals = np.empty(k, np.int64), np.empty(k, np.float32)  # one pass (pyx/sampling.pyx)
        got = _top_k(logits, vals, ids)
        ids, lg = ids[:got], vals[:got].astype(np.float64)
    if not got:  # no kernel, no top-k, or nothing but NaN
        ids = np.argpartition(-logits, k - 1)[:k] if k < n else np.arange(n)
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        lg = logits[ids].astype(np.float64)
    probs = np.exp(lg - lg[0])
    probs /= probs.sum()
    keep = len(ids)
    if p.top_p < 1.0:
        # smallest prefix whose mass reaches top_p (at least one token)
        cum = np.cumsum(probs)
        keep = min(keep, int(np.searchsorted(cum, p.top_p, side="left")) + 1)
    if p.min_p > 0.0:
        keep = min(keep, max(1, int(np.count_nonzero(probs[:keep] >= p.min_p * probs[0]))))
    ids, lg = ids[:keep], lg[:keep]
    t = p.temperature
    with np.errstate(over="ignore"):  # a tiny temperature: the others' scores go to -inf (p 0)
        z = (lg - lg[0]) / t
    probs = np.exp(z)
    probs /= probs.sum()
    return ids, probs


class Sampler:
    """Samples one token from a logits row; one instance per request (own RNG)."""

    def __init__(self, params: SamplingParams, n_vocab: int | None = None):
        self.params = params
        seed = params.seed if params.seed is not None and params.seed >= 0 else None
        self.rng = np.random.default_rng(seed)
        self.n_vocab = n_vocab

    @property
    def takes_argmax(self) -> bool:
        """Whether the token sampled from a row is its argmax and nothing else is asked of
        the row (greedy, no logit bias, no penalties, no probabilities): then ``sample`` can
        take an argmax found elsewhere (the decode step's head finds it as it writes the
        logits)."""
        p = self.params
        no_penalty = p.repeat_last_n == 0 or (
            p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0)
        return p.temperature <= 0.0 and not p.logit_bias and p.n_probs <= 0 and no_penalty

    def sample(self, logits: np.ndarray, history: Sequence[int] = (), argmax: int | None = None) -> Sample:
        """A token from the logits row; ``argmax``: the row's argmax when the caller has it
        (used when ``takes_argmax`` and the row is the whole vocabulary)."""
        p = self.params
        if argmax is not None and self.takes_argmax and (self.n_vocab is None or self.n_vocab >= len(logits)):
            return Sample(int(argmax), float("nan"), None)
        logits = np.asarray(logits, dtype=np.float32)
        if self.n_vocab is not None:
            logits = logits[: self.n_vocab]
        if p.logit_bias:
            logits = logits.copy()
            for tok, bias in p.logit_bias.items():
                if 0 <= tok < logits.shape[0]:
                    logits[tok] += bias
        logits = apply_penalties(logits, history, p)
        if p.temperature <= 0.0:
            token = int(np.argmax(logits))
        else:
            ids, probs = candidates(logits, p)
            token = int(ids[0]) if len(ids) == 1 else int(ids[self.rng.choice(len(ids), p=probs)])
        lp = None
        top = None
        if p.n_probs > 0:
            lsm = log_softmax(logits.astype(np.float64))
            n = min(p.n_probs, lsm.shape[0])
            best = np.argpartition(-lsm, n - 1)[:n]
            best = best[np.argsort(-lsm[best], kind="stable")]
            top = [TokenProb(int(i), float(lsm[i])) for i in best]
            lp = float(lsm[token])
        else:
            lp = float("nan")
        return Sample(token, lp, top)
