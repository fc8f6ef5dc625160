"""gemma3: interleaved sliding-window attention (5 local : 1 global).

    x = token_embd[tokens] * sqrt(n_embd)
    per layer (local iff il % pattern < pattern - 1, pattern 6):
        h = attn_norm(x)
        q, k = rope_neox(q_norm(q)), rope_neox(k_norm(k))       per head, before rope
        o = attention(q, k, v) * 1/sqrt(key_length)              window on local layers
        x += post_attention_norm(attn_output(o))
        x += post_ffw_norm(ffn_down(gelu(ffn_gate(h2)) * ffn_up(h2)))   h2 = ffn_norm(x)
    logits = output(output_norm(x))                 output tied to token_embd when absent

Local layers: rope base 10000 (no scaling); global layers: ``rope.freq_base`` and the
GGUF rope scaling. Norm weights are used as stored (the converter baked in the +1).

Cache: global layers share the "kv" pool (full KV); local layers the "swa" pool, whose
per-sequence state keeps only the window (:class:`~llmcore.cache.swa.SWAKVCacheState`).
Model option ``swa_full=True`` keeps full KV on local layers instead (then trimming always
works). ``swa_slack`` (tokens, default 0) keeps that many tokens beyond the window.
"""
from __future__ import annotations

import math

import numpy as np

from ..cache import KVCacheState
from ..cache.swa import SWAKVCacheState
from ..gguf_file import GGUFFile
from . import register
from .base import ForwardBatch, Model, ModelArgs
from .layers import Attention, Embedding, GatedFFN, OutputHead, RMSNorm

LOCAL_ROPE_BASE = 10000.0


class Gemma3Block:
    __slots__ = ("attn_norm", "attn", "post_attn_norm", "ffn_norm", "ffn", "post_ffn_norm")

    def __init__(self, attn_norm, attn, post_attn_norm, ffn_norm, ffn, post_ffn_norm):
        self.attn_norm, self.attn, self.post_attn_norm = attn_norm, attn, post_attn_norm
        self.ffn_norm, self.ffn, self.post_ffn_norm = ffn_norm, ffn, post_ffn_norm

    def __call__(self, x: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        x += self.post_attn_norm(self.attn(self.attn_norm(x), fb))
        x += self.post_ffn_norm(self.ffn(self.ffn_norm(x)))
        return x


def split_pools(model: Model, n_global: int, n_local: int) -> tuple[int | None, int | None]:
    """max_kv_bytes split between a full and a windowed pool, by layer count."""
    mb = model.max_kv_bytes
    if mb is None or mb < 0:
        return mb, mb
    total = max(1, n_global + n_local)
    return mb * n_global // total, mb * n_local // total


class SWAModel(Model):
    """Base for models mixing full ("kv" group) and sliding-window ("swa" group) layers.

    Model options (cfg): ``swa_full`` (keep full KV on local layers), ``swa_slack`` (tokens
    kept beyond the window). Subclasses call :meth:`setup_swa` with the per-layer flags; it
    creates the pools and ``self.layer_slots[i] = (group, layer_idx_in_group, pool)``.
    """

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **cfg):
        self.swa_full = bool(cfg.pop("swa_full", False))
        self.swa_slack = int(cfg.pop("swa_slack", 0))
        super().__init__(g, args, **cfg)
        self.window = int(self.args.sliding_window)

    def setup_swa(self, is_local: list[bool]) -> None:
        a = self.args
        self.is_local = list(is_local)
        n_local = sum(self.is_local)
        n_global = a.n_layer - n_local
        mb_g, mb_l = split_pools(self, n_global, n_local)
        self.kv_pool = self.add_kv_pool("kv", n_global, a.n_head_kv, a.head_dim, a.head_dim_v,
                                        max_bytes=mb_g) if n_global else None
        self.swa_pool = None
        if n_local:
            if self.swa_full:
                factory = KVCacheState
            else:
                window, slack = self.window, self.swa_slack

                def factory(pool):
                    return SWAKVCacheState(pool, window, slack)
            self.swa_pool = self.add_kv_pool("swa", n_local, a.n_head_kv, a.head_dim, a.head_dim_v,
                                             state_factory=factory, max_bytes=mb_l)
        self.layer_slots = []
        gi = li = 0
        for loc in self.is_local:
            if loc:
                self.layer_slots.append(("swa", li, self.swa_pool))
                li += 1
            else:
                self.layer_slots.append(("kv", gi, self.kv_pool))
                gi += 1

    def forward(self, batch, all_logits: bool = False) -> np.ndarray:
        logits = super().forward(batch, all_logits)
        if not self.swa_full:  # free the blocks the next step can no longer see
            for s, _ in batch:
                c = s.caches.get("swa")
                if isinstance(c, SWAKVCacheState):
                    c.evict()
        return logits


@register("gemma3")
class Gemma3(SWAModel):
    arch = "gemma3"

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **cfg):
        super().__init__(g, args, **cfg)
        a = self.args
        pat = g.arch_key("attention.sliding_window_pattern", None)
        if isinstance(pat, (list, tuple)):  # per-layer flags (True: local)
            is_local = [bool(x) and self.window > 0 for x in pat][: a.n_layer]
            is_local += [False] * (a.n_layer - len(is_local))
        else:
            p = int(pat or 6)
            is_local = [self.window > 0 and p > 1 and (i % p) < p - 1 for i in range(a.n_layer)]
        self.setup_swa(is_local)
        self.embed = Embedding(self.tensor("token_embd.weight"), scale=math.sqrt(a.n_embd))
        self.blocks = [self.make_block(i, *self.layer_slots[i]) for i in range(a.n_layer)]
        out_w = self.tensor("output.weight") if self.has("output.weight") else self.tensor("token_embd.weight")
        softcap = float(g.arch_key("final_logit_softcapping", 0.0) or 0.0)
        self.head = OutputHead(RMSNorm(self.f32("output_norm.weight"), a.norm_eps), out_w, softcap=softcap)

    def make_block(self, i: int, group: str, layer_idx: int, pool) -> Gemma3Block:
        a = self.args
        p = f"blk.{i}."
        local = group == "swa"
        attn = Attention(
            wq=self.tensor(p + "attn_q.weight"), wk=self.tensor(p + "attn_k.weight"),
            wv=self.tensor(p + "attn_v.weight"), wo=self.tensor(p + "attn_output.weight"),
            n_head=a.n_head, n_head_kv=a.n_head_kv, head_dim=a.head_dim, head_dim_v=a.head_dim_v,
            group=group, layer_idx=layer_idx,
            rope_base=LOCAL_ROPE_BASE if local else a.rope_base, rope_dim=a.rope_dim, rope_neox=True,
            rope_freq_scale=1.0 if local else a.rope_freq_scale,
            q_norm=self.f32(p + "attn_q_norm.weight"), k_norm=self.f32(p + "attn_k_norm.weight"),
            norm_eps=a.norm_eps, scale=1.0 / math.sqrt(a.head_dim),
            window=self.window if local else 0, pool=pool)
        eps = a.norm_eps
        ffn = GatedFFN(self.tensor(p + "ffn_gate.weight"), self.tensor(p + "ffn_up.weight"),
                       self.tensor(p + "ffn_down.weight"), act="gelu")
        return Gemma3Block(RMSNorm(self.f32(p + "attn_norm.weight"), eps), attn,
                           RMSNorm(self.f32(p + "post_attention_norm.weight"), eps),
                           RMSNorm(self.f32(p + "ffn_norm.weight"), eps), ffn,
                           RMSNorm(self.f32(p + "post_ffw_norm.weight"), eps))

    def _forward(self, fb: ForwardBatch, all_logits: bool) -> np.ndarray:
        x = self.embed(fb.tokens)
        for blk in self.blocks:
            x = blk(x, fb)
        if not all_logits:
            x = x[fb.last_rows]
        return self.head(x)
