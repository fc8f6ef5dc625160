"""qwen3moe (Qwen3-30B-A3B style): qwen3's attention (q/k RMS norms, NeoX rope) with every
FFN replaced by a routed mixture of experts (:class:`moe.MoE`):

    h = rms_norm(x) * ffn_norm
    probs = softmax(h @ ffn_gate_inp.T); top-k (``expert_used_count``), renormalised
    x += sum_k w_k * ffn_down_exps[e_k](silu(ffn_gate_exps[e_k](h)) * ffn_up_exps[e_k](h))

Expert tensors are 3-D (n_expert, out, in). Layers that carry a dense ``ffn_gate.weight``
instead of ``ffn_gate_inp.weight`` get a plain gated FFN. ``model.moe_stats`` counts experts
computed and skipped over all layers (reset it to measure one step).
"""
from __future__ import annotations

from ..gguf_file import GGUFFile
from . import register
from .base import ModelArgs
from .layers import GatedFFN, RMSNorm
from .llama import Block
from .moe import MoE, MoEStats
from .qwen3 import Qwen3


@register("qwen3moe")
class Qwen3MoE(Qwen3):
    arch = "qwen3moe"
    route = "softmax_norm"  # qwen3moe renormalises the top-k probabilities (norm_topk_prob)

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **cfg):
        self.moe_stats = MoEStats()
        self.n_expert = int(g.arch_key("expert_count"))
        self.n_expert_used = int(g.arch_key("expert_used_count"))
        super().__init__(g, args, **cfg)

    def make_ffn(self, i: int):
        p = f"blk.{i}."
        if not self.has(p + "ffn_gate_inp.weight"):
            return GatedFFN(self.tensor(p + "ffn_gate.weight"), self.tensor(p + "ffn_up.weight"),
                            self.tensor(p + "ffn_down.weight"))
        return MoE(self.tensor(p + "ffn_gate_inp.weight"), self.tensor(p + "ffn_gate_exps.weight"),
                   self.tensor(p + "ffn_up_exps.weight"), self.tensor(p + "ffn_down_exps.weight"),
                   self.n_expert_used, route=self.route, act="silu", stats=self.moe_stats)

    def make_block(self, i: int) -> Block:
        a = self.args
        p = f"blk.{i}."
        return Block(RMSNorm(self.f32(p + "attn_norm.weight"), a.norm_eps), self.make_attention(i),
                     RMSNorm(self.f32(p + "ffn_norm.weight"), a.norm_eps), self.make_ffn(i))
