"""mamba and mamba2: attention-free recurrent models (selective state-space layers).

mamba (Mamba-1), per layer, on h = rms_norm(x) * attn_norm:
    x_in, z = split(ssm_in(h), d_inner)
    xc = silu(conv1d_causal(x_in; ssm_conv1d.weight (d_inner, K), .bias; conv state K-1 rows))
    dt, B, C = split(ssm_x(xc), [dt_rank, d_state, d_state])   (rms-normed if ssm.dt_b_c_rms)
    dt = ssm_dt(dt) + ssm_dt.bias
    y = selective_scan(state (d_inner, d_state); xc, softplus(dt), A = ssm_a, B, C) + xc * ssm_d
    x += ssm_out(y * silu(z))
mamba2, per layer:
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
from ..cache.recurrent import RecurrentState
from ..gguf_file import GGUFFile
from . import register
from .base import ForwardBatch, Model, ModelArgs, require_tensors
from .layers import Embedding, OutputHead, RMSNorm


class _Lin:
    """quant.Linear, or a float32 matmul for tiny F32 matrices the kernels may not take."""

    def __init__(self, tensor, bias=None):
        self.bias = None if bias is None else np.asarray(bias, np.float32)
        try:
            self.lin = quant.Linear(tensor, bias=self.bias)
            self.w = None
        except Exception:
            self.lin = None
            self.w = np.ascontiguousarray(tensor.dequantize(), dtype=np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.lin is not None:
            return self.lin(x)
        y = x @ self.w.T
        return y + self.bias if self.bias is not None else y


# ---- mamba (Mamba-1) -------------------------------------------------------------------------
class MambaLayer:
    def __init__(self, m: "Mamba", i: int):
        p = f"blk.{i}."
        a = m.args
        self.i = i
        self.d_inner, self.d_state, self.dt_rank = m.d_inner, m.d_state, m.dt_rank
        self.norm = RMSNorm(m.f32(p + "attn_norm.weight"), a.norm_eps)
        self.ssm_in = _Lin(m.tensor(p + "ssm_in.weight"))
        self.conv_w = np.ascontiguousarray(m.f32(p + "ssm_conv1d.weight").reshape(self.d_inner, -1))
        self.conv_b = m.f32(p + "ssm_conv1d.bias") if m.has(p + "ssm_conv1d.bias") else None
        self.ssm_x = _Lin(m.tensor(p + "ssm_x.weight"))
        dt_b = m.f32(p + "ssm_dt.bias") if m.has(p + "ssm_dt.bias") else None
        self.ssm_dt = _Lin(m.tensor(p + "ssm_dt.weight"), dt_b)
        self.A = np.ascontiguousarray(m.f32(p + "ssm_a").reshape(self.d_inner, self.d_state))
        self.D = m.f32(p + "ssm_d").reshape(self.d_inner)
        self.ssm_out = _Lin(m.tensor(p + "ssm_out.weight"))
        self.dt_b_c_rms = m.dt_b_c_rms
        self.eps = a.norm_eps

    def __call__(self, x: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        di, ds, r = self.d_inner, self.d_state, self.dt_rank
        xz = self.ssm_in(self.norm(x))
        xs, z = xz[:, :di], xz[:, di:]
        xc = np.empty((x.shape[0], di), dtype=np.float32)
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
    arch = "mamba"

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **cfg):
        super().__init__(g, args, **cfg)
        a = self.args
        self.d_inner = int(g.arch_key("ssm.inner_size"))
        self.d_state = int(g.arch_key("ssm.state_size"))
        self.d_conv = int(g.arch_key("ssm.conv_kernel"))
        self.dt_rank = int(g.arch_key("ssm.time_step_rank"))
        self.dt_b_c_rms = bool(g.arch_key("ssm.dt_b_c_rms", False))
        require_tensors(g, ["token_embd.weight", "output_norm.weight"])
        self.embed = Embedding(self.tensor("token_embd.weight"))
        self.layers = self.make_layers()
        conv_shapes, ssm_shapes = self.state_shapes()
        self.add_cache("rec", lambda: RecurrentState(conv_shapes, ssm_shapes))
        out_w = self.tensor("output.weight") if self.has("output.weight") else self.tensor("token_embd.weight")
        self.head = OutputHead(RMSNorm(self.f32("output_norm.weight"), a.norm_eps), out_w)

    def make_layers(self):
        return [MambaLayer(self, i) for i in range(self.args.n_layer)]

    def state_shapes(self):
        n = self.args.n_layer
        return [(self.d_conv - 1, self.d_inner)] * n, [(self.d_inner, self.d_state)] * n

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's recurrent state (= one checkpoint)."""
        conv, ssm = self.state_shapes()
        return sum(int(np.prod(c)) * 4 + int(np.prod(s)) * 4 for c, s in zip(conv, ssm))

    def _forward(self, fb: ForwardBatch, all_logits: bool) -> np.ndarray:
        x = self.embed(fb.tokens)
        for layer in self.layers:
            x += layer(x, fb)
        if not all_logits:
            x = x[fb.last_rows]
        return self.head(x)


# ---- mamba2 ----------------------------------------------------------------------------------
class Mamba2Layer:
    def __init__(self, m: "Mamba2", i: int):
        p = f"blk.{i}."
        a = m.args
        self.i = i
        self.d_inner, self.d_state = m.d_inner, m.d_state
        self.n_head, self.n_group = m.n_head_ssm, m.n_group
        self.head_dim = self.d_inner // self.n_head
        self.conv_dim = self.d_inner + 2 * self.n_group * self.d_state
        self.norm = RMSNorm(m.f32(p + "attn_norm.weight"), a.norm_eps)
        self.ssm_in = _Lin(m.tensor(p + "ssm_in.weight"))
        self.conv_w = np.ascontiguousarray(m.f32(p + "ssm_conv1d.weight").reshape(self.conv_dim, -1))
        self.conv_b = m.f32(p + "ssm_conv1d.bias") if m.has(p + "ssm_conv1d.bias") else None
        self.dt_b = m.f32(p + "ssm_dt.bias").reshape(self.n_head)
        self.A = m.f32(p + "ssm_a").reshape(self.n_head)
        self.D = m.f32(p + "ssm_d").reshape(self.n_head)
        self.ssm_norm = np.ascontiguousarray(m.f32(p + "ssm_norm.weight").reshape(-1))
        self.ssm_out = _Lin(m.tensor(p + "ssm_out.weight"))
        self.eps = a.norm_eps

    def __call__(self, x: np.ndarray, fb: ForwardBatch) -> np.ndarray:
        n = x.shape[0]
        di, ds, nh, ng, hd = self.d_inner, self.d_state, self.n_head, self.n_group, self.head_dim
        zxbcdt = self.ssm_in(self.norm(x))
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
    arch = "mamba2"

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **cfg):
        self.n_head_ssm = int(g.arch_key("ssm.time_step_rank"))
        self.n_group = int(g.arch_key("ssm.group_count", 1) or 1)
        super().__init__(g, args, **cfg)

    def make_layers(self):
        return [Mamba2Layer(self, i) for i in range(self.args.n_layer)]

    def state_shapes(self):
        n = self.args.n_layer
        conv_dim = self.d_inner + 2 * self.n_group * self.d_state
        hd = self.d_inner // self.n_head_ssm
        return [(self.d_conv - 1, conv_dim)] * n, [(self.n_head_ssm, hd, self.d_state)] * n
