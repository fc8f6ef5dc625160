"""The residual stream every architecture here is built from: pre-norm blocks.

    x = embed(tokens)
    per block:  x += mixer_post_norm(mixer(mixer_norm(x)))     mixer: attention, short conv, SSM
                x += ffn_post_norm(ffn(ffn_norm(x)))           ffn: gated FFN or MoE
    logits = head(x)

The post norms are optional (gemma3 has them) and so is the FFN (mamba's blocks are a mixer
only). :func:`run_blocks` runs a stack with each residual add fused into the norm that
follows it (``x += y; h = rms_norm(x) * w`` in one kernel call, with the sublayer's post
norm of y too where there is one) and, for decode-sized
batches, the activations in scratch: the arithmetic of applying the blocks one by one
(:meth:`PreNormBlock.__call__`), bit for bit, in fewer passes over memory.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from . import layers as L
from .batch import ForwardBatch
from .layers import Attention, GatedFFN, RMSNorm


class Mixer(Protocol):
    """Mixes positions: attention, short conv, SSM. (n, d) normed input -> (n, d) update;
    its per-sequence state is in ``fb.seqs[k].caches[group]``."""

    def __call__(self, h: np.ndarray, fb: ForwardBatch) -> np.ndarray: ...


class FeedForward(Protocol):
    """Per token: gated FFN or MoE. (n, d) normed input -> (n, d) update."""

    def __call__(self, h: np.ndarray) -> np.ndarray: ...


def _post_norm(norm: RMSNorm | None, y: np.ndarray) -> np.ndarray:
    if norm is not None:  # y is the sublayer's own output: normalise it in place
        L.rms_norm_into(y, norm.weight, norm.eps, y)
    return y


class PreNormBlock:
    """One residual block (see the module docstring)."""

    __slots__ = ("mixer_norm", "mixer", "mixer_post_norm", "ffn_norm", "ffn", "ffn_post_norm")

    def __init__(self, mixer_norm: RMSNorm, mixer: Mixer, ffn_norm: RMSNorm | None = None,
                 ffn: FeedForward | None = None, *, mixer_post_norm: RMSNorm | None = None,
                 ffn_post_norm: RMSNorm | None = None):
        if (ffn is None) != (ffn_norm is None):
            raise ValueError("PreNormBlock: an FFN needs its norm, and a norm its FFN")
        self.mixer_norm, self.mixer, self.mixer_post_norm = mixer_norm, mixer, mixer_post_norm
        self.ffn_norm, self.ffn, self.ffn_post_norm = ffn_norm, ffn, ffn_post_norm

    def mix(self, h: np.ndarray, fb: ForwardBatch, out: np.ndarray | None = None,
            post: bool = True) -> np.ndarray:
        """The mixer's residual update for the normed input h (written into `out` by an
        Attention, the mixer that can); post=False leaves the post norm to the caller."""
        m = self.mixer
        y = m(h, fb, out=out) if out is not None and isinstance(m, Attention) else m(h, fb)
        return _post_norm(self.mixer_post_norm, y) if post else y

    def feed_forward(self, h: np.ndarray, out: np.ndarray | None = None, post: bool = True) -> np.ndarray:
        """The FFN's residual update for the normed input h (written into `out` by a
        GatedFFN, the FFN that can); post=False leaves the post norm to the caller."""
        f = self.ffn
        y = f(h, out=out) if out is not None and isinstance(f, GatedFFN) else f(h)
        return _post_norm(self.ffn_post_norm, y) if post else y

    def __call__(self, x: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        """The recipe, one step at a time (x updated in place)."""
        x += self.mix(self.mixer_norm(x), fb)
        if self.ffn is not None:
            x += self.feed_forward(self.ffn_norm(x))
        return x


def _add_norm(x: np.ndarray, h: np.ndarray, upd: np.ndarray, post: RMSNorm | None, nxt: RMSNorm | None) -> None:
    """x += post(upd) (upd normalised in place), then h = nxt(x): one kernel when both norms
    are there (gemma3's post norms), else the two steps."""
    if post is not None and nxt is not None and upd.flags.c_contiguous:
        L.post_add_norm_into(x, upd, post, nxt, h)
        return
    _post_norm(post, upd)
    if nxt is not None:
        L.rms_norm_into(x, nxt.weight, nxt.eps, h, add=upd)
    else:
        x += upd


def run_blocks(blocks: Sequence[PreNormBlock], x: np.ndarray, fb: ForwardBatch) -> np.ndarray:
    """x through every block, each residual add fused with the next norm (x updated in place).

    ``h`` holds the normed input of the next sublayer, ``y`` its output: both in scratch for
    decode-sized batches (the sublayers never keep them).
    """
    n, d = x.shape
    h = L.scratch("residual.h", n, d)
    y = L.scratch("residual.y", n, d)
    norm = blocks[0].mixer_norm
    L.rms_norm_into(x, norm.weight, norm.eps, h)
    last = len(blocks) - 1
    for i, blk in enumerate(blocks):
        upd = blk.mix(h, fb, out=y, post=False)
        if blk.ffn is not None:
            _add_norm(x, h, upd, blk.mixer_post_norm, blk.ffn_norm)
            upd = blk.feed_forward(h, out=y, post=False)
            _add_norm(x, h, upd, blk.ffn_post_norm, blocks[i + 1].mixer_norm if i < last else None)
        else:
            _add_norm(x, h, upd, blk.mixer_post_norm, blocks[i + 1].mixer_norm if i < last else None)
    return x


__all__ = ["FeedForward", "Mixer", "PreNormBlock", "run_blocks"]
