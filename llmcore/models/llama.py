"""llama (SmolLM2, Llama 2/3, Mistral-style dense): the graph recipe.

    x = token_embd[tokens]
    per layer:  x += attn_output(attention(rope(q), rope(k), v))  on rms_norm(x) * attn_norm
                x += ffn_down(silu(ffn_gate(h)) * ffn_up(h))     with h = rms_norm(x) * ffn_norm
    logits = output(rms_norm(x) * output_norm)      (output tied to token_embd when absent)

Rope: "normal" ordering (pairs 2i, 2i+1); the GGUF converter permuted q/k for it.
"""
from __future__ import annotations

import numpy as np

from ..gguf_file import GGUFFile
from . import register
from .base import ForwardBatch, Model, ModelArgs
from . import layers as L
from .layers import Attention, Embedding, GatedFFN, OutputHead, RMSNorm


class Block:
    """One pre-norm transformer block: attention + gated FFN."""

    __slots__ = ("attn_norm", "attn", "ffn_norm", "ffn")

    def __init__(self, attn_norm, attn, ffn_norm, ffn):
        self.attn_norm, self.attn, self.ffn_norm, self.ffn = attn_norm, attn, ffn_norm, ffn

    def __call__(self, x: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        x += self.attn(self.attn_norm(x), fb)
        x += self.ffn(self.ffn_norm(x))
        return x


@register("llama")
class Llama(Model):
    arch = "llama"
    rope_neox = False
    qk_norm = False

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **cfg):
        super().__init__(g, args, **cfg)
        a = self.args
        self.embed = Embedding(self.tensor("token_embd.weight"))
        self.pool = self.add_kv_pool("kv", a.n_layer, a.n_head_kv, a.head_dim, a.head_dim_v)
        self.blocks = [self.make_block(i) for i in range(a.n_layer)]
        out_w = self.tensor("output.weight") if self.has("output.weight") else self.tensor("token_embd.weight")
        self.head = OutputHead(RMSNorm(self.f32("output_norm.weight"), a.norm_eps), out_w)

    def make_attention(self, i: int) -> Attention:
        a = self.args
        p = f"blk.{i}."
        qn = kn = None
        if self.qk_norm:
            qn, kn = self.f32(p + "attn_q_norm.weight"), self.f32(p + "attn_k_norm.weight")
        biases = None
        if self.has(p + "attn_q.bias"):
            biases = [self.f32(p + f"attn_{n}.bias") if self.has(p + f"attn_{n}.bias") else None
                      for n in "qkv"]
        return Attention(
            wq=self.tensor(p + "attn_q.weight"), wk=self.tensor(p + "attn_k.weight"),
            wv=self.tensor(p + "attn_v.weight"), wo=self.tensor(p + "attn_output.weight"),
            n_head=a.n_head, n_head_kv=a.n_head_kv, head_dim=a.head_dim, head_dim_v=a.head_dim_v,
            group="kv", layer_idx=i, rope_base=a.rope_base, rope_dim=a.rope_dim,
            rope_neox=self.rope_neox, rope_freq_scale=a.rope_freq_scale,
            q_norm=qn, k_norm=kn, norm_eps=a.norm_eps, biases=biases, pool=self.pool)

    def make_block(self, i: int) -> Block:
        a = self.args
        p = f"blk.{i}."
        ffn = GatedFFN(self.tensor(p + "ffn_gate.weight"), self.tensor(p + "ffn_up.weight"),
                       self.tensor(p + "ffn_down.weight"))
        return Block(RMSNorm(self.f32(p + "attn_norm.weight"), a.norm_eps), self.make_attention(i),
                     RMSNorm(self.f32(p + "ffn_norm.weight"), a.norm_eps), ffn)

    def _forward(self, fb: ForwardBatch, all_logits: bool) -> np.ndarray:
        x = self.embed(fb.tokens)
        blocks = self.blocks
        if not all(isinstance(b, Block) and b.attn_norm.weight is not None and b.ffn_norm.weight is not None
                   for b in blocks):
            for blk in blocks:
                x = blk(x, fb)
        else:
            # residual stream with fused (x += y; h = rms_norm(x)) steps; h and the block
            # outputs y live in scratch for decode-sized batches
            n, d = x.shape
            h = L.scratch("llama.h", n, d)
            y = L.scratch("llama.y", n, d)
            b0 = blocks[0]
            L.rms_norm_into(x, b0.attn_norm.weight, b0.attn_norm.eps, h)
            last = len(blocks) - 1
            for i, blk in enumerate(blocks):
                blk.attn(h, fb, out=y)
                L.rms_norm_into(x, blk.ffn_norm.weight, blk.ffn_norm.eps, h, add=y)
                ffn = blk.ffn
                if isinstance(ffn, GatedFFN):
                    ffn(h, out=y)
                    yy = y
                else:
                    yy = ffn(h)
                if i < last:
                    nxt = blocks[i + 1].attn_norm
                    L.rms_norm_into(x, nxt.weight, nxt.eps, h, add=yy)
                else:
                    x += yy
        if not all_logits and fb.n_tokens != fb.n_seqs:
            x = x[fb.last_rows]
        return self.head(x)
