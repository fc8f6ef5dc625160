"""The whole decode step of a model in one kernel call (pyx/step.pyx).

A step of a few tokens (decode, batched decode, speculative verification: at most
:data:`MAX_TOKENS`) through a stack of standard blocks (:class:`~.layers.Attention`
mixer, :class:`~.layers.GatedFFN`, RMS norms, optional post norms; an
:class:`~.layers.OutputHead`) runs every layer inside one parallel region instead of a
dozen kernel calls per layer: with small matrices those calls, not the weights, bounded
generation speed. :meth:`DecodeStep.build` reads the model's layers into a
``step.Program`` once; a model with any other kind of layer (MoE, recurrent mixers,
gated attention), a weight type the fused kernels do not read, or ``LLMCORE_FUSED_STEP=0``
gets None and runs layer by layer, as do larger steps (prefill beyond MAX_TOKENS: a short
prompt, up to 128 tokens, runs here too, where the two threads' wake-ups at a few hundred
separate kernel calls cost as much as its matmuls). The numbers are the layer-by-layer
path's: the same work items compute every output element.
"""
from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import numpy as np

from .. import _kernels, nn
from ..threads import get_num_threads
from .batch import ForwardBatch
from .blocks import PreNormBlock
from .layers import Attention, FusedLinear, GatedFFN, OutputHead, RMSNorm

if TYPE_CHECKING:  # pragma: no cover
    from .base import Model

ENABLED = _kernels.ENABLED and os.environ.get("LLMCORE_FUSED_STEP", "1") != "0"
MAX_TOKENS = 128  # pyx/step.pyx's TOKENS_MAX (larger steps run layer by layer)


class Unsupported(Exception):
    """The model has a part the fused step does not run (the reason is the message)."""


def _module(lin) -> str:
    if lin._packed is None:
        raise Unsupported(f"{lin.name}: no kernel for its weight type")
    return lin._kernel.__name__.rsplit(".", 1)[-1]


def _parts(lin) -> list:
    module = _module(lin)
    if _kernels.load("step").weight_kind(lin._packed, module) is None:
        raise Unsupported(f"{lin.name}: no fused kernel for its weight type")
    return [(lin._packed, module)]


def _fused_parts(fl: FusedLinear) -> tuple[list, np.ndarray | None]:
    """A fused projection's weights (one, or one per part side by side) and its bias."""
    if fl.fused is not None:
        return _parts(fl.fused), fl.fused.bias
    parts = [p for lin in fl.parts for p in _parts(lin)]
    biases = [lin.bias for lin in fl.parts]
    if all(b is None for b in biases):
        return parts, None
    return parts, np.concatenate([np.zeros(lin.out_features, np.float32) if lin.bias is None else lin.bias
                                  for lin in fl.parts])


def _norm(norm: RMSNorm | None) -> tuple[np.ndarray | None, float]:
    if norm is None:
        return None, 0.0
    if norm.weight is None:
        raise Unsupported("an RMS norm without weight")
    return norm.weight, norm.eps


class DecodeStep:
    """A model's fused decode step: ``step(fb, x, rows) -> logits (len(rows), n_vocab)``."""

    def __init__(self, model: "Model"):
        step = _kernels.load("step")
        if step.TOKENS_MAX != MAX_TOKENS:
            raise Unsupported("pyx/step.pyx was built for another step size")
        head = model.head
        if type(head) is not OutputHead or head.norm is None:
            raise Unsupported("the output head is not norm + matmul")
        out_w, out_eps = _norm(head.norm)
        self.softcap = head.softcap
        self.n_vocab = head.proj.out_features
        blocks = model.blocks
        d = model.args.n_embd
        self.prog = prog = step.Program(len(blocks), d, out_w, out_eps, _parts(head.proj), head.proj.out_features)
        self.groups: list[str] = []  # plan id -> cache group
        self.pools = []  # per layer: (its Attention, its BlockPool)
        for i, blk in enumerate(blocks):
            if type(blk) is not PreNormBlock or blk.ffn is None:
                raise Unsupported("a block that is not attention + feed-forward")
            attn, ffn = blk.mixer, blk.ffn
            if type(attn) is not Attention or type(ffn) is not GatedFFN:
                raise Unsupported(f"layer {i}: {type(attn).__name__} / {type(ffn).__name__}")
            q_norm, q_eps = _norm(attn.q_norm)
            k_norm, k_eps = _norm(attn.k_norm)
            if q_norm is not None and k_norm is not None and q_eps != k_eps:
                raise Unsupported("q and k norms with different eps")
            pool = attn.pool
            if pool is None or pool.kv_type not in nn._KV_CODE:
                raise Unsupported("attention without a block pool")
            kt = pool.kv_type
            plan = prog.add_plan(nn._KV_CODE[kt], pool.block_size, nn.kv_row_bytes(kt, attn.head_dim),
                                 nn.kv_row_bytes(kt, attn.head_dim_v), attn.n_head, attn.n_head_kv,
                                 attn.head_dim, attn.head_dim_v, attn.window, pool.k_tiled)
            if plan == len(self.groups):
                self.groups.append(attn.group)
            elif self.groups[plan] != attn.group:
                raise Unsupported("two cache groups with the same attention geometry")
            rope = prog.add_rope(attn.rope_dim, attn.rope_base, attn.rope_freq_scale)
            qkv, qkv_bias = _fused_parts(attn.qkv)
            gu = ffn.gate_up
            if gu.sizes[0] != gu.sizes[-1] or len(gu.sizes) != 2:
                raise Unsupported("gate and up projections of different sizes")
            gate_up, gu_bias = _fused_parts(gu)
            if gu_bias is not None:
                raise Unsupported("a feed-forward with biases")
            an, an_eps = _norm(blk.mixer_norm)
            ap, ap_eps = _norm(blk.mixer_post_norm)
            fn, fn_eps = _norm(blk.ffn_norm)
            fp, fp_eps = _norm(blk.ffn_post_norm)
            prog.set_layer(
                i, attn_norm=an, attn_eps=an_eps, attn_post=ap, attn_post_eps=ap_eps, ffn_norm=fn, ffn_eps=fn_eps,
                ffn_post=fp, ffn_post_eps=fp_eps, qkv=qkv, qkv_bias=qkv_bias, wo=_parts(attn.wo), wo_bias=attn.wo.bias,
                gate_up=gate_up, down=_parts(ffn.down), act=ffn.act_kind, H=attn.n_head, KVH=attn.n_head_kv,
                D=attn.head_dim, Dv=attn.head_dim_v, n_rot=attn.rope_dim, neox=attn.rope_neox, rope_id=rope,
                plan_id=plan, q_norm=q_norm, k_norm=k_norm, qk_eps=q_eps if q_norm is not None else k_eps,
                scale=attn.scale, softcap=attn.softcap, sinks=attn.sinks)
            self.pools.append((attn, pool))
        self._tls = threading.local()  # per calling thread: the step's workspace
        self.distinct_pools = list({id(p): p for _, p in self.pools}.values())
        self._grows = None
        self.prof: np.ndarray | None = None  # float64 (len(step.PHASES),): ns per phase are added (benchmarks)

    @classmethod
    def build(cls, model: "Model") -> "DecodeStep | None":
        """The model's fused step, or None when it has a part the step does not run."""
        if not ENABLED:
            return None
        try:
            return cls(model)
        except Unsupported:
            return None
        except ValueError:  # a shape the Program refuses (block sizes, heads)
            return None

    def _check_pools(self) -> None:
        """Hand the program each layer's (k, v) byte views again when a pool has grown."""
        grows = tuple(pool.n_grows for pool in self.distinct_pools)
        if grows != self._grows:
            self.prog.set_pools([tuple(attn._pool_views(pool)[2:4]) for attn, pool in self.pools])
            self._grows = grows

    def __call__(self, fb: ForwardBatch, x: np.ndarray, rows: np.ndarray,
                 argmax: np.ndarray | None = None) -> np.ndarray:
        """Logits (len(rows), n_vocab) of the step's rows ``rows`` (increasing). ``argmax``
        (int64, len(rows)): filled with each logits row's argmax (np.argmax's), found by the
        head as it writes the rows (pyx/simd_argmax.h) instead of a pass over them after."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        logits = np.empty((rows.shape[0], self.n_vocab), dtype=np.float32)
        self._check_pools()
        work = getattr(self._tls, "work", None)
        if work is None or work.nbytes < self.prog.workspace_bytes(fb.n_tokens):
            work = self._tls.work = np.empty(self.prog.workspace_bytes(max(fb.n_tokens, 8)), np.uint8)
        fused = argmax is not None and not self.softcap  # (a soft cap can tie rows it saturates)
        self.prog.run(np.ascontiguousarray(x, dtype=np.float32), fb.positions, fb.seg_start,
                      [fb.tables_for(g) for g in self.groups], rows, logits,
                      fb.decode_seqs, get_num_threads(), self.prof, work, argmax if fused else None)
        if self.softcap:
            logits = np.tanh(logits / self.softcap) * self.softcap
        if argmax is not None and not fused:
            argmax[:] = np.argmax(logits, axis=1)
        elif argmax is not None:
            for i in np.flatnonzero(argmax < 0):  # a NaN or only -inf in the row: np.argmax decides
                argmax[i] = np.argmax(logits[i])
        return logits


__all__ = ["DecodeStep", "ENABLED", "Unsupported"]
