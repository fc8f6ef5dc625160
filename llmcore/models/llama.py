"""llama (SmolLM2, Llama 2/3, Mistral-style dense): the graph recipe.

    x = token_embd[tokens]
    per layer:  x += attn_output(attention(rope(q), rope(k), v))  on rms_norm(x) * attn_norm
                x += ffn_down(silu(ffn_gate(h)) * ffn_up(h))     with h = rms_norm(x) * ffn_norm
    logits = output(rms_norm(x) * output_norm)      (output tied to token_embd when absent)

Rope: "normal" ordering (pairs 2i, 2i+1); the GGUF converter permuted q/k for it.
Cache: one "kv" pool over every layer, full KV per sequence.
"""
from __future__ import annotations

from ..cache import CacheState, KVCacheState
from ..gguf_file import GGUFFile
from . import register
from .base import Model, ModelArgs
from .blocks import PreNormBlock
from .layers import Embedding


@register("llama")
class Llama(Model):
    rope_neox = False  # rope pairs (2i, 2i+1); True: (i, i + n_rot/2)
    qk_norm = False  # per-head RMS norms on q and k before rope

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **options):
        super().__init__(g, args, **options)
        a = self.args
        self.pool = self.add_pool("kv", a.n_layer)
        self.embed = Embedding(self.tensor("token_embd.weight"))
        self.blocks = [self.make_block(i) for i in range(a.n_layer)]
        self.head = self.output_head()

    def make_block(self, i: int) -> PreNormBlock:
        p = f"blk.{i}."
        attn = self.attention(i, self.pool, rope_neox=self.rope_neox, qk_norm=self.qk_norm)
        return PreNormBlock(self.norm(p + "attn_norm.weight"), attn,
                            self.norm(p + "ffn_norm.weight"), self.make_ffn(i))

    def make_ffn(self, i: int):
        return self.gated_ffn(i)

    def make_cache(self) -> dict[str, CacheState]:
        return {"kv": KVCacheState(self.pool)}
