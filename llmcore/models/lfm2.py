"""lfm2 (Liquid LFM2): hybrid of short-convolution layers and attention layers.

``lfm2.attention.head_count_kv`` is a per-layer array: 0 marks a short-conv layer, > 0 an
attention layer with that many KV heads. Per layer, on h = rms_norm(x) * attn_norm:
    attention layer:  llama/qwen3-style GQA with per-head q/k RMS norms, NeoX rope
                      (``rope.freq_base``), KV in the "kv" block pool (attention layers only)
    short-conv layer: b, c, xx = split(shortconv.in_proj(h), 3)
                      y = c * conv1d_causal(b * xx; shortconv.conv.weight (n_embd, L), no bias)
                      o = shortconv.out_proj(y)          conv state: the last L-1 inputs b*xx
    x += o;  x += ffn_down(silu(ffn_gate(h2)) * ffn_up(h2)),  h2 = rms_norm(x) * ffn_norm
logits = output(rms_norm(x) * token_embd_norm)   (the final norm is ``token_embd_norm``;
output tied to token_embd when ``output.weight`` is absent).

Caches: "kv" (block pool over the attention layers, full KV) and "rec" (a
:class:`~llmcore.cache.recurrent.RecurrentState` with one conv state per short-conv layer).
A sequence can therefore only be trimmed where the conv state allows it (see recurrent.py).
"""
from __future__ import annotations

import numpy as np

from .. import quant, ssm
from ..cache import CacheState, KVCacheState
from ..cache.recurrent import RecurrentState
from ..gguf_file import GGUFFile
from . import register
from .base import Model, ModelArgs, require_tensors
from .batch import ForwardBatch
from .blocks import PreNormBlock
from .layers import Embedding


class ShortConv:
    """lfm2's gated short convolution (see the module docstring); its conv state is layer
    ``rec_idx`` of the sequence's "rec" cache."""

    def __init__(self, m: "LFM2", i: int, rec_idx: int):
        p = f"blk.{i}."
        self.rec_idx = rec_idx
        self.dim = m.args.n_embd
        self.in_proj = quant.Linear(m.tensor(p + "shortconv.in_proj.weight"))
        self.conv_w = np.ascontiguousarray(m.f32(p + "shortconv.conv.weight").reshape(self.dim, -1))
        self.out_proj = quant.Linear(m.tensor(p + "shortconv.out_proj.weight"))

    def __call__(self, h: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        d = self.dim
        bcx = self.in_proj(h)
        bx = bcx[:, :d] * bcx[:, 2 * d:3 * d]
        y = np.empty_like(bx)
        ss = fb.seg_start
        for k, s in enumerate(fb.seqs):
            r0, r1 = int(ss[k]), int(ss[k + 1])
            conv, _ = s.caches["rec"].layer(self.rec_idx)
            ssm.conv1d(bx[r0:r1], conv, self.conv_w, out=y[r0:r1])
        y *= bcx[:, d:2 * d]
        return self.out_proj(y)


@register("lfm2")
class LFM2(Model):
    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **options):
        super().__init__(g, args, **options)
        a = self.args
        kv = g.arch_key("attention.head_count_kv")
        kv = [int(v) for v in kv] if isinstance(kv, (list, tuple)) else [int(kv)] * a.n_layer
        if len(kv) != a.n_layer:
            raise ValueError("lfm2: attention.head_count_kv has the wrong length")
        self.head_count_kv = kv
        self.l_cache = int(g.arch_key("shortconv.l_cache", 3))
        require_tensors(g, ["token_embd.weight", "token_embd_norm.weight"])
        attn_layers = [i for i, n in enumerate(kv) if n > 0]
        conv_layers = [i for i, n in enumerate(kv) if n == 0]
        if len({kv[i] for i in attn_layers}) > 1:
            raise ValueError("lfm2: attention layers with different KV head counts")
        self.pool = self.add_pool("kv", len(attn_layers), kv[attn_layers[0]]) if attn_layers else None
        self.conv_shapes = [(self.l_cache - 1, a.n_embd)] * len(conv_layers)
        self.embed = Embedding(self.tensor("token_embd.weight"))
        self.blocks = []
        for i in range(a.n_layer):
            p = f"blk.{i}."
            if kv[i] > 0:
                mixer = self.attention(i, self.pool, attn_layers.index(i), rope_neox=True, qk_norm=True,
                                       n_head_kv=kv[i])
            else:
                mixer = ShortConv(self, i, conv_layers.index(i))
            self.blocks.append(PreNormBlock(self.norm(p + "attn_norm.weight"), mixer,
                                            self.norm(p + "ffn_norm.weight"), self.gated_ffn(i)))
        self.head = self.output_head(norm="token_embd_norm.weight")

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's conv state (fixed-size; = one checkpoint's conv part)."""
        return RecurrentState(self.conv_shapes).state_bytes

    def make_cache(self) -> dict[str, CacheState]:
        caches: dict[str, CacheState] = {}
        if self.pool is not None:
            caches["kv"] = KVCacheState(self.pool)
        if self.conv_shapes:
            caches["rec"] = RecurrentState(self.conv_shapes)
        return caches
