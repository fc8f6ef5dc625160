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

Caches: "kv" (block pool over the attention layers) and "rec" (a
:class:`~llmcore.cache.recurrent.RecurrentState` with one conv state per short-conv layer).
A sequence can therefore only be trimmed where the conv state allows it (see recurrent.py).
"""
from __future__ import annotations

import numpy as np

from ..cache.recurrent import RecurrentState
from ..gguf_file import GGUFFile
from . import register
from .base import ForwardBatch, Model, ModelArgs, require_tensors
from .layers import Attention, Embedding, GatedFFN, OutputHead, RMSNorm
from .. import ssm
from .mamba import _Lin


class ShortConv:
    def __init__(self, m: "LFM2", i: int, rec_idx: int):
        p = f"blk.{i}."
        self.rec_idx = rec_idx
        self.dim = m.args.n_embd
        self.in_proj = _Lin(m.tensor(p + "shortconv.in_proj.weight"))
        self.conv_w = np.ascontiguousarray(m.f32(p + "shortconv.conv.weight").reshape(self.dim, -1))
        self.out_proj = _Lin(m.tensor(p + "shortconv.out_proj.weight"))

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


class Block:
    __slots__ = ("attn_norm", "mixer", "ffn_norm", "ffn", "is_attn")

    def __init__(self, attn_norm, mixer, ffn_norm, ffn, is_attn):
        self.attn_norm, self.mixer, self.ffn_norm, self.ffn = attn_norm, mixer, ffn_norm, ffn
        self.is_attn = is_attn

    def __call__(self, x: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        x += self.mixer(self.attn_norm(x), fb)
        x += self.ffn(self.ffn_norm(x))
        return x


@register("lfm2")
class LFM2(Model):
    arch = "lfm2"

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **cfg):
        super().__init__(g, args, **cfg)
        a = self.args
        kv = g.arch_key("attention.head_count_kv")
        kv = [int(v) for v in kv] if isinstance(kv, (list, tuple)) else [int(kv)] * a.n_layer
        if len(kv) != a.n_layer:
            raise ValueError("lfm2: attention.head_count_kv has the wrong length")
        self.head_count_kv = kv
        self.l_cache = int(g.arch_key("shortconv.l_cache", 3))
        require_tensors(g, ["token_embd.weight", "token_embd_norm.weight"])
        self.embed = Embedding(self.tensor("token_embd.weight"))
        attn_layers = [i for i, n in enumerate(kv) if n > 0]
        conv_layers = [i for i, n in enumerate(kv) if n == 0]
        if len({kv[i] for i in attn_layers}) > 1:
            raise ValueError("lfm2: attention layers with different KV head counts")
        self.pool = None
        if attn_layers:
            self.pool = self.add_kv_pool("kv", len(attn_layers), kv[attn_layers[0]], a.head_dim, a.head_dim_v)
        if conv_layers:
            shapes = [(self.l_cache - 1, a.n_embd)] * len(conv_layers)
            self.add_cache("rec", lambda: RecurrentState(shapes))
        self.blocks = []
        for i in range(a.n_layer):
            p = f"blk.{i}."
            if kv[i] > 0:
                mixer = Attention(
                    wq=self.tensor(p + "attn_q.weight"), wk=self.tensor(p + "attn_k.weight"),
                    wv=self.tensor(p + "attn_v.weight"), wo=self.tensor(p + "attn_output.weight"),
                    n_head=a.n_head, n_head_kv=kv[i], head_dim=a.head_dim, head_dim_v=a.head_dim_v,
                    group="kv", layer_idx=attn_layers.index(i), rope_base=a.rope_base,
                    rope_dim=a.rope_dim, rope_neox=True, rope_freq_scale=a.rope_freq_scale,
                    q_norm=self.f32(p + "attn_q_norm.weight"), k_norm=self.f32(p + "attn_k_norm.weight"),
                    norm_eps=a.norm_eps, pool=self.pool)
            else:
                mixer = ShortConv(self, i, conv_layers.index(i))
            ffn = GatedFFN(self.tensor(p + "ffn_gate.weight"), self.tensor(p + "ffn_up.weight"),
                           self.tensor(p + "ffn_down.weight"))
            self.blocks.append(Block(RMSNorm(self.f32(p + "attn_norm.weight"), a.norm_eps), mixer,
                                     RMSNorm(self.f32(p + "ffn_norm.weight"), a.norm_eps), ffn, kv[i] > 0))
        out_w = self.tensor("output.weight") if self.has("output.weight") else self.tensor("token_embd.weight")
        self.head = OutputHead(RMSNorm(self.f32("token_embd_norm.weight"), a.norm_eps), out_w)

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's conv state (fixed-size; = one checkpoint's conv part)."""
        n_conv = sum(1 for n in self.head_count_kv if n == 0)
        return n_conv * (self.l_cache - 1) * self.args.n_embd * 4

    def _forward(self, fb: ForwardBatch, all_logits: bool) -> np.ndarray:
        x = self.embed(fb.tokens)
        for blk in self.blocks:
            x = blk(x, fb)
        if not all_logits:
            x = x[fb.last_rows]
        return self.head(x)
