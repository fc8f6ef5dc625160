"""qwen3moe (Qwen3-30B-A3B style): qwen3's attention (q/k RMS norms, NeoX rope) with every
FFN replaced by a routed mixture of experts (:class:`moe.MoE`):

    h = rms_norm(x) * ffn_norm
    probs = softmax(h @ ffn_gate_inp.T); top-k (``expert_used_count``), renormalised
    x += sum_k w_k * ffn_down_exps[e_k](silu(ffn_gate_exps[e_k](h)) * ffn_up_exps[e_k](h))

Expert tensors are 3-D (n_expert, out, in). Layers that carry a dense ``ffn_gate.weight``
instead of ``ffn_gate_inp.weight`` get a plain gated FFN. ``model.stats()`` (and
``model.moe_stats``) count experts computed and skipped over all layers.
"""
from __future__ import annotations

from . import register
from .qwen3 import Qwen3


@register("qwen3moe")
class Qwen3MoE(Qwen3):
    route = "softmax_norm"  # qwen3moe renormalises the top-k probabilities (norm_topk_prob)

    def make_ffn(self, i: int):
        if not self.has(f"blk.{i}.ffn_gate_inp.weight"):
            return self.gated_ffn(i)
        return self.experts(i, route=self.route, act="silu")
