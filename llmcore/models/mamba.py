"""mamba and mamba2: attention-free recurrent models (selective state-space layers).

Each layer is a pre-norm block without FFN. mamba (Mamba-1), on h = rms_norm(x) * attn_norm:
    x_in, z = split(ssm_in(h), d_inner)
    xc = silu(conv1d_causal(x_in; ssm_conv1d.weight (d_inner, K), .bias; conv state K-1 rows))
    dt, B, C = split(ssm_x(xc), [dt_rank, d_state, d_state])   (rms-normed if ssm.dt_b_c_rms)
    dt = ssm_dt(dt) + ssm_dt.bias
    y = selective_scan(state (d_inner, d_state); xc, softplus(dt), A = ssm_a, B, C) + xc * ssm_d
    x += ssm_out(y * silu(z))
mamba2, on the same h:
    z, xBC, dt = split(ssm_in(h), [d_inner, d_inner + 2*n_group*d_state, n_head])
    xBC = silu(conv1d_causal(xBC) + bias); x_in, B, C = split(xBC)
    y = ssd_scan(state (n_head, head_dim, d_state); x_in, softplus(dt + ssm_dt.bias), A (n_head,),
                 B, C (n_group, d_state); head h uses group h // (n_head/n_group)) + x_in * D[h]
    y = group_rms_norm(y * silu(z), n_group) * ssm_norm;  x += ssm_out(y)
logits = output(rms_norm(x) * output_norm)  (output tied to token_embd when absent).
``ssm_a`` stores -exp(A_log) and has no ``.weight`` suffix (nor does ``ssm_d``).

State: one :class:`~llmcore.cache.recurrent.RecurrentState` per sequence (cache group
"rec"). Batched forward: the Linears run over all tokens of all segments together; the conv
and the scan run per segment on that sequence's state, updated in place.

Kernels: ``llmcore.ssm`` (pyx/ssm.pyx; conv1d, mamba_scan, mamba2_scan, with a NumPy
fallback there).
"""
from __future__ import annotations

import numpy as np

from .. import nn, quant, ssm
from ..cache import CacheState
from ..cache.recurrent import RecurrentState
from ..gguf_file import GGUFFile
from . import register
from .base import Model, ModelArgs, require_tensors
from .batch import ForwardBatch
from .blocks import PreNormBlock
from .layers import Embedding


# ---- mamba (Mamba-1) -------------------------------------------------------------------------
class MambaMixer:
    """One Mamba-1 selective-SSM layer on the normed input (its state: layer i of the
    sequence's "rec" cache)."""

    def __init__(self, m: "Mamba", i: int):
        p = f"blk.{i}."
        a = m.args
        self.i = i
        self.d_inner, self.d_state, self.dt_rank = m.d_inner, m.d_state, m.dt_rank
        self.ssm_in = quant.Linear(m.tensor(p + "ssm_in.weight"))
        self.conv_w = np.ascontiguousarray(m.f32(p + "ssm_conv1d.weight").reshape(self.d_inner, -1))
        self.conv_b = m.optional_f32(p + "ssm_conv1d.bias")
        self.ssm_x = quant.Linear(m.tensor(p + "ssm_x.weight"))
        dt_b = m.optional_f32(p + "ssm_dt.bias")
        self.ssm_dt = quant.Linear(m.tensor(p + "ssm_dt.weight"), dt_b)
        self.A = np.ascontiguousarray(m.f32(p + "ssm_a").reshape(self.d_inner, self.d_state))
        self.D = m.f32(p + "ssm_d").reshape(self.d_inner)
        self.ssm_out = quant.Linear(m.tensor(p + "ssm_out.weight"))
        self.dt_b_c_rms = m.dt_b_c_rms
        self.eps = a.norm_eps

    def __call__(self, h: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        di, ds, r = self.d_inner, self.d_state, self.dt_rank
        xz = self.ssm_in(h)
        xs, z = xz[:, :di], xz[:, di:]
        xc = np.empty((h.shape[0], di), dtype=np.float32)
        ss = fb.seg_start
        states = [s.caches["rec"].layer(self.i) for s in fb.seqs]
        for k, (conv, _) in enumerate(states):
            r0, r1 = int(ss[k]), int(ss[k + 1])
            ssm.conv1d(xs[r0:r1], conv, self.conv_w, self.conv_b, silu=True, out=xc[r0:r1])
        dbc = self.ssm_x(xc)
        dt, B, C = dbc[:, :r], dbc[:, r:r + ds], dbc[:, r + ds:r + 2 * ds]
        if self.dt_b_c_rms:
            dt, B, C = (nn.rms_norm(np.ascontiguousarray(t), None, self.eps) for t in (dt, B, C))
        dt = self.ssm_dt(dt)
        y = np.empty_like(xc)
        for k, (_, st) in enumerate(states):
            r0, r1 = int(ss[k]), int(ss[k + 1])
            ssm.mamba_scan(st, xc[r0:r1], dt[r0:r1], self.A, B[r0:r1], C[r0:r1], D=self.D,
                           z=z[r0:r1], out=y[r0:r1])
        return self.ssm_out(y)


@register("mamba")
class Mamba(Model):
    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **options):
        super().__init__(g, args, **options)
        a = self.args
        self.d_inner = int(g.arch_key("ssm.inner_size"))
        self.d_state = int(g.arch_key("ssm.state_size"))
        self.d_conv = int(g.arch_key("ssm.conv_kernel"))
        self.dt_rank = int(g.arch_key("ssm.time_step_rank"))
        self.dt_b_c_rms = bool(g.arch_key("ssm.dt_b_c_rms", False))
        require_tensors(g, ["token_embd.weight", "output_norm.weight"])
        self.embed = Embedding(self.tensor("token_embd.weight"))
        self.blocks = [PreNormBlock(self.norm(f"blk.{i}.attn_norm.weight"), self.make_mixer(i))
                       for i in range(a.n_layer)]
        self.head = self.output_head()

    def make_mixer(self, i: int):
        return MambaMixer(self, i)

    def state_shapes(self):
        """Per layer: the conv state (K-1, channels) and the scan state shapes."""
        n = self.args.n_layer
        return [(self.d_conv - 1, self.d_inner)] * n, [(self.d_inner, self.d_state)] * n

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's recurrent state (= one checkpoint)."""
        return RecurrentState(*self.state_shapes()).state_bytes

    def make_cache(self) -> dict[str, CacheState]:
        return {"rec": RecurrentState(*self.state_shapes())}


# ---- mamba2 ----------------------------------------------------------------------------------
class Mamba2Mixer:
    """One Mamba-2 (SSD) layer on the normed input (its state: layer i of the sequence's
    "rec" cache)."""

    def __init__(self, m: "Mamba2", i: int):
        p = f"blk.{i}."
        a = m.args
        self.i = i
        self.d_inner, self.d_state = m.d_inner, m.d_state
        self.n_head, self.n_group = m.n_head_ssm, m.n_group
        self.head_dim = self.d_inner // self.n_head
        self.conv_dim = self.d_inner + 2 * self.n_group * self.d_state
        self.ssm_in = quant.Linear(m.tensor(p + "ssm_in.weight"))
        self.conv_w = np.ascontiguousarray(m.f32(p + "ssm_conv1d.weight").reshape(self.conv_dim, -1))
        self.conv_b = m.optional_f32(p + "ssm_conv1d.bias")
        self.dt_b = m.f32(p + "ssm_dt.bias").reshape(self.n_head)
        self.A = m.f32(p + "ssm_a").reshape(self.n_head)
        self.D = m.f32(p + "ssm_d").reshape(self.n_head)
        self.ssm_norm = np.ascontiguousarray(m.f32(p + "ssm_norm.weight").reshape(-1))
        self.ssm_out = quant.Linear(m.tensor(p + "ssm_out.weight"))
        self.eps = a.norm_eps

    def __call__(self, h: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        n = h.shape[0]
        di, ds, nh, ng, hd = self.d_inner, self.d_state, self.n_head, self.n_group, self.head_dim
        zxbcdt = self.ssm_in(h)
        z = zxbcdt[:, :di]
        xbc_in = zxbcdt[:, di:di + self.conv_dim]
        dt = zxbcdt[:, di + self.conv_dim:di + self.conv_dim + nh]
        xbc = np.empty((n, self.conv_dim), dtype=np.float32)
        ss = fb.seg_start
        states = [s.caches["rec"].layer(self.i) for s in fb.seqs]
        for k, (conv, _) in enumerate(states):
            r0, r1 = int(ss[k]), int(ss[k + 1])
            ssm.conv1d(xbc_in[r0:r1], conv, self.conv_w, self.conv_b, silu=True, out=xbc[r0:r1])
        xs = xbc[:, :di]
        B = xbc[:, di:di + ng * ds]
        C = xbc[:, di + ng * ds:]
        y = np.empty((n, di), dtype=np.float32)
        for k, (_, st) in enumerate(states):
            r0, r1 = int(ss[k]), int(ss[k + 1])
            ssm.mamba2_scan(st, xs[r0:r1], dt[r0:r1], self.A, B[r0:r1], C[r0:r1], D=self.D,
                            z=z[r0:r1], dt_bias=self.dt_b, out=y[r0:r1])
        y = nn.rms_norm(np.ascontiguousarray(y.reshape(n * ng, di // ng)), None, self.eps).reshape(n, di)
        y *= self.ssm_norm
        return self.ssm_out(y)


@register("mamba2")
class Mamba2(Mamba):
    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **options):
        self.n_head_ssm = int(g.arch_key("ssm.time_step_rank"))
        self.n_group = int(g.arch_key("ssm.group_count", 1) or 1)
        super().__init__(g, args, **options)

    def make_mixer(self, i: int):
        return Mamba2Mixer(self, i)

    def state_shapes(self):
        n = self.args.n_layer
        conv_dim = self.d_inner + 2 * self.n_group * self.d_state
        hd = self.d_inner // self.n_head_ssm
        return [(self.d_conv - 1, conv_dim)] * n, [(self.n_head_ssm, hd, self.d_state)] * n
