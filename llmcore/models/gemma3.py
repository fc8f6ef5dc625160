"""gemma3: interleaved sliding-window attention (5 local : 1 global).

    x = token_embd[tokens] * sqrt(n_embd)
    per layer (local iff il % pattern < pattern - 1, pattern 6):
        h = attn_norm(x)
        q, k = rope_neox(q_norm(q)), rope_neox(k_norm(k))       per head, before rope
        o = attention(q, k, v) * 1/sqrt(key_length)              window on local layers
        x += post_attention_norm(attn_output(o))
        x += post_ffw_norm(ffn_down(gelu(ffn_gate(h2)) * ffn_up(h2)))   h2 = ffn_norm(x)
    logits = output(output_norm(x))                 output tied to token_embd when absent
    (soft-capped when ``final_logit_softcapping`` is set)

Local layers: rope base 10000 (no scaling); global layers: ``rope.freq_base`` and the
GGUF rope scaling. Norm weights are used as stored (the converter baked in the +1).

Cache (:mod:`.sliding_window`): global layers in the "kv" pool (full KV), local layers in
the "swa" pool (only the window per sequence). Model options: ``swa_full=True`` keeps full
KV on local layers (then trimming always works); ``swa_slack`` (tokens, default 0) keeps
that many tokens beyond the window.
"""
from __future__ import annotations

import math

from ..cache import CacheState
from ..gguf_file import GGUFFile
from . import register
from .base import Model, ModelArgs
from .blocks import PreNormBlock
from .layers import Embedding
from .sliding_window import SlidingWindowLayers

LOCAL_ROPE_BASE = 10000.0


def local_layers(g: GGUFFile, n_layer: int, window: int) -> list[bool]:
    """Which layers are local: ``attention.sliding_window_pattern`` as per-layer flags, or
    as a period p (default 6: every p-th layer is global); none without a window."""
    pat = g.arch_key("attention.sliding_window_pattern", None)
    if isinstance(pat, (list, tuple)):  # per-layer flags (True: local)
        flags = [bool(x) and window > 0 for x in pat][:n_layer]
        return flags + [False] * (n_layer - len(flags))
    p = int(pat or 6)
    return [window > 0 and p > 1 and (i % p) < p - 1 for i in range(n_layer)]


@register("gemma3")
class Gemma3(Model):
    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, *, swa_full: bool = False,
                 swa_slack: int = 0, **options):
        super().__init__(g, args, **options)
        a = self.args
        self.window = int(a.sliding_window)
        self.swa_full = bool(swa_full)
        self.layout = SlidingWindowLayers(self, local_layers(g, a.n_layer, self.window), self.window,
                                          full=self.swa_full, slack=swa_slack)
        self.is_local = self.layout.is_local
        self.embed = Embedding(self.tensor("token_embd.weight"), scale=math.sqrt(a.n_embd))
        self.blocks = [self.make_block(i) for i in range(a.n_layer)]
        self.head = self.output_head(softcap=float(g.arch_key("final_logit_softcapping", 0.0) or 0.0))

    def make_block(self, i: int) -> PreNormBlock:
        p = f"blk.{i}."
        slot, local = self.layout.slots[i], self.is_local[i]
        attn = self.attention(i, slot.pool, slot.index, rope_neox=True, qk_norm=True, window=slot.window,
                              rope_base=LOCAL_ROPE_BASE if local else None,
                              rope_freq_scale=1.0 if local else None)
        return PreNormBlock(self.norm(p + "attn_norm.weight"), attn,
                            self.norm(p + "ffn_norm.weight"), self.gated_ffn(i, act="gelu"),
                            mixer_post_norm=self.norm(p + "post_attention_norm.weight"),
                            ffn_post_norm=self.norm(p + "post_ffw_norm.weight"))

    def make_cache(self) -> dict[str, CacheState]:
        return self.layout.make_cache()
