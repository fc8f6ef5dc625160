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
``"softmax_weight"`` router and :func:`swiglu_oai`. Cache: like gemma3 (see
:class:`gemma3.SWAModel`): odd layers in the full "kv" pool, even ones in the windowed "swa"
pool; ``swa_full=True`` keeps full KV on local layers.

Not handled: YaRN rope scaling (the released gpt-oss checkpoints set
``rope.scaling.type = yarn``); such files load with a warning and rope without scaling.
"""
from __future__ import annotations

import logging
import math

import numpy as np

from ..gguf_file import GGUFFile
from . import register
from .base import ForwardBatch, ModelArgs
from .gemma3 import SWAModel
from .layers import Attention, Embedding, OutputHead, RMSNorm
from .moe import MoE, MoEStats

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


class GptOssBlock:
    __slots__ = ("attn_norm", "attn", "ffn_norm", "moe")

    def __init__(self, attn_norm, attn, ffn_norm, moe):
        self.attn_norm, self.attn, self.ffn_norm, self.moe = attn_norm, attn, ffn_norm, moe

    def __call__(self, x: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        x += self.attn(self.attn_norm(x), fb)
        x += self.moe(self.ffn_norm(x))
        return x


@register("gpt-oss")
class GptOss(SWAModel):
    arch = "gpt-oss"

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **cfg):
        super().__init__(g, args, **cfg)
        a = self.args
        self.moe_stats = MoEStats()
        self.n_expert = int(g.arch_key("expert_count"))
        self.n_expert_used = int(g.arch_key("expert_used_count"))
        stype = g.arch_key("rope.scaling.type", None)
        if stype not in (None, "none", "linear"):
            log.warning("%s: rope scaling %r is not implemented; rope runs unscaled", g.path, stype)
        self.setup_swa([self.window > 0 and i % 2 == 0 for i in range(a.n_layer)])
        self.embed = Embedding(self.tensor("token_embd.weight"))
        self.blocks = [self.make_block(i, *self.layer_slots[i]) for i in range(a.n_layer)]
        out_w = self.tensor("output.weight") if self.has("output.weight") else self.tensor("token_embd.weight")
        self.head = OutputHead(RMSNorm(self.f32("output_norm.weight"), a.norm_eps), out_w)

    def _bias(self, name: str):
        return self.f32(name) if self.has(name) else None

    def make_block(self, i: int, group: str, layer_idx: int, pool) -> GptOssBlock:
        a = self.args
        p = f"blk.{i}."
        attn = Attention(
            wq=self.tensor(p + "attn_q.weight"), wk=self.tensor(p + "attn_k.weight"),
            wv=self.tensor(p + "attn_v.weight"), wo=self.tensor(p + "attn_output.weight"),
            n_head=a.n_head, n_head_kv=a.n_head_kv, head_dim=a.head_dim, head_dim_v=a.head_dim_v,
            group=group, layer_idx=layer_idx, rope_base=a.rope_base, rope_dim=a.rope_dim,
            rope_neox=True, rope_freq_scale=a.rope_freq_scale, scale=1.0 / math.sqrt(a.head_dim),
            window=self.window if group == "swa" else 0, sinks=self._bias(p + "attn_sinks.weight"),
            biases=[self._bias(p + f"attn_{n}.bias") for n in "qkv"],
            bo=self._bias(p + "attn_output.bias"), pool=pool)
        moe = MoE(self.tensor(p + "ffn_gate_inp.weight"), self.tensor(p + "ffn_gate_exps.weight"),
                  self.tensor(p + "ffn_up_exps.weight"), self.tensor(p + "ffn_down_exps.weight"),
                  self.n_expert_used, route="softmax_weight", act=swiglu_oai,
                  router_bias=self._bias(p + "ffn_gate_inp.bias"),
                  gate_bias=self._bias(p + "ffn_gate_exps.bias"), up_bias=self._bias(p + "ffn_up_exps.bias"),
                  down_bias=self._bias(p + "ffn_down_exps.bias"), stats=self.moe_stats)
        return GptOssBlock(RMSNorm(self.f32(p + "attn_norm.weight"), a.norm_eps), attn,
                           RMSNorm(self.f32(p + "post_attention_norm.weight"), a.norm_eps), moe)

    def _forward(self, fb: ForwardBatch, all_logits: bool) -> np.ndarray:
        x = self.embed(fb.tokens)
        for blk in self.blocks:
            x = blk(x, fb)
        if not all_logits:
            x = x[fb.last_rows]
        return self.head(x)
