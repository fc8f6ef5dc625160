"""gpt-oss: alternating sliding-window attention with attention sinks, biases, and a
mixture of experts with MXFP4 weights, its own router and clamped SwiGLU.

    x = token_embd[tokens]
    per layer (local iff il % 2 == 0: window ``attention.sliding_window``):
        h = attn_norm(x)
        q, k, v = attn_q/k/v(h) + biases;  q, k = rope_neox(q), rope_neox(k)
        o = attention(q, k, v, scale 1/sqrt(key_length), sinks=attn_sinks)
        x += attn_output(o) + bias
        h = post_attention_norm(x)
        logits = ffn_gate_inp(h) + bias;  top-k logits, weights = softmax over those k
        x += sum_k w_k * (down_k(swiglu_oai(gate_k(h) + bg_k, up_k(h) + bu_k)) + bd_k)
    logits = output(output_norm(x))              (``output.weight`` is separate)

Attention sinks: one extra logit per head that takes part in the softmax with no value
(``nn.attention(..., sinks=)``). swiglu_oai (ggml_swiglu_oai, alpha 1.702, limit 7):
``x = min(g, 7); y = clamp(u, -7, 7); x * sigmoid(1.702 x) * (y + 1)``.

The MoE is :class:`moe.MoE` (token grouping, one batched matmul per active expert) with the
``"softmax_weight"`` router and :func:`swiglu_oai`. Cache (:mod:`.sliding_window`): odd
layers in the full "kv" pool, even ones in the windowed "swa" pool; model options
``swa_full=True`` (full KV on local layers) and ``swa_slack`` as for gemma3.

Not handled: YaRN rope scaling (the released gpt-oss checkpoints set
``rope.scaling.type = yarn``); such files load with a warning and rope without scaling.
"""
from __future__ import annotations

import logging

import numpy as np

from ..cache import CacheState
from ..gguf_file import GGUFFile
from . import register
from .base import Model, ModelArgs
from .blocks import PreNormBlock
from .layers import Embedding
from .sliding_window import SlidingWindowLayers

log = logging.getLogger(__name__)

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def swiglu_oai(g: np.ndarray, u: np.ndarray, alpha: float = SWIGLU_ALPHA,
               limit: float = SWIGLU_LIMIT) -> np.ndarray:
    """gpt-oss clamped SwiGLU on (rows, ff) float32 arrays."""
    x = np.minimum(g, np.float32(limit))
    y = np.clip(u, np.float32(-limit), np.float32(limit))
    out = x / (np.float32(1.0) + np.exp(np.float32(-alpha) * x))
    out *= y + np.float32(1.0)
    return out.astype(np.float32, copy=False)


@register("gpt-oss")
class GptOss(Model):
    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, *, swa_full: bool = False,
                 swa_slack: int = 0, **options):
        super().__init__(g, args, **options)
        a = self.args
        stype = g.arch_key("rope.scaling.type", None)
        if stype not in (None, "none", "linear"):
            log.warning("%s: rope scaling %r is not implemented; rope runs unscaled", g.path, stype)
        self.window = int(a.sliding_window)
        self.swa_full = bool(swa_full)
        self.layout = SlidingWindowLayers(self, [self.window > 0 and i % 2 == 0 for i in range(a.n_layer)],
                                          self.window, full=self.swa_full, slack=swa_slack)
        self.is_local = self.layout.is_local
        self.embed = Embedding(self.tensor("token_embd.weight"))
        self.blocks = [self.make_block(i) for i in range(a.n_layer)]
        self.head = self.output_head()

    def make_block(self, i: int) -> PreNormBlock:
        p = f"blk.{i}."
        slot = self.layout.slots[i]
        attn = self.attention(i, slot.pool, slot.index, rope_neox=True, window=slot.window)
        moe = self.experts(i, route="softmax_weight", act=swiglu_oai)
        return PreNormBlock(self.norm(p + "attn_norm.weight"), attn,
                            self.norm(p + "post_attention_norm.weight"), moe)

    def make_cache(self) -> dict[str, CacheState]:
        return self.layout.make_cache()
