"""qwen3next (Qwen3-Next, Qwen3-Coder-Next): qwen35moe's recipe (:mod:`.qwen35`) with the
value heads grouped instead of tiled and two older tensor layouts.

- value head h reads q/k head h // (n_v / n_qk) (Hugging Face's order, kept by the converter);
- ``ssm_ba`` fuses beta and alpha: rows per q/k head [beta (r) | alpha (r)], r = n_v / n_qk;
- earlier conversions fuse the input projection into ``ssm_in``: rows per q/k head
  [q (D) | k (D) | v (r*D) | z (r*D)] (today's files have ``attn_qkv`` + ``attn_gate``);
- plain NEOX rope on the first ``rope.dimension_count`` dims (no sections).

Both layouts are reordered into the canonical [q | k | v], z, beta, alpha rows at load time,
so the layer itself is the shared :class:`~.deltanet.GatedDeltaNet`.
"""
from __future__ import annotations

import numpy as np

from ..gguf_file import Tensor
from . import register
from .layers import tensor_rows
from .qwen35 import Qwen35MoE


@register("qwen3next")
class Qwen3Next(Qwen35MoE):
    def head_map(self) -> np.ndarray:
        """Value head h reads q/k head h // (n_v / n_qk) (grouped)."""
        return np.arange(self.n_v) // (self.n_v // self.n_qk)

    def deltanet_projections(self, i: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        p = f"blk.{i}."
        D, n_qk, r = self.ssm_head_dim, self.n_qk, self.n_v // self.n_qk
        if self.has(p + "ssm_in.weight"):
            t = self.tensor(p + "ssm_in.weight")
            head = np.arange(n_qk)[:, None] * (2 * D + 2 * r * D)  # first row of each q/k head
            q = (head + np.arange(D)).reshape(-1)
            k = (head + D + np.arange(D)).reshape(-1)
            v = (head + 2 * D + np.arange(r * D)).reshape(-1)
            z = (head + (2 + r) * D + np.arange(r * D)).reshape(-1)
            qkv_t = tensor_rows(t, np.concatenate([q, k, v]), p + "ssm_in.weight[qkv]")
            z_t = tensor_rows(t, z, p + "ssm_in.weight[z]")
        else:
            qkv_t, z_t = self.tensor(p + "attn_qkv.weight"), self.tensor(p + "attn_gate.weight")
        ba = self.tensor(p + "ssm_ba.weight")
        h = np.arange(self.n_v)
        beta_rows = (h // r) * 2 * r + h % r
        return (qkv_t, z_t, tensor_rows(ba, beta_rows, p + "ssm_ba.weight[beta]"),
                tensor_rows(ba, beta_rows + r, p + "ssm_ba.weight[alpha]"))
