"""qwen35 and qwen35moe (Qwen3.5 / Qwen3.6): gated-DeltaNet + gated-attention hybrids.

    x = token_embd[tokens]
    per layer il:  h = rms_norm(x) * attn_norm
                   x += GatedDeltaNet(h)      if (il + 1) % full_attention_interval != 0
                   x += GatedAttention(h)     otherwise (every 4th layer by default)
                   x += ffn(rms_norm(x) * post_attention_norm)
    logits = output(rms_norm(x) * output_norm)        (tied to token_embd when absent)

- DeltaNet (:mod:`.deltanet`): ``attn_qkv`` [q | k | v] and ``attn_gate`` (z), ``ssm_beta``,
  ``ssm_alpha``, ``ssm_conv1d`` (kernel ``ssm.conv_kernel``), ``ssm_dt.bias``, ``ssm_a``,
  ``ssm_norm``, ``ssm_out``; head dim ``ssm.state_size``, ``ssm.group_count`` q/k heads,
  ``ssm.time_step_rank`` value heads; value head h reads q/k head h % n_qk (the converter
  tiles Hugging Face's grouped value heads).
- attention (:mod:`.gated_attention`): ``attn_q`` per head [query | gate], q/k RMS norms,
  NEOX rope on the first ``rope.dimension_count`` dims of each head. ``rope.dimension_sections``
  is the multimodal rope; for text all its position components are equal, so it is this
  same rotation when the sections cover every rotated pair (checked at load).
- ffn: qwen35 a SwiGLU ``ffn_{gate,up,down}``; qwen35moe a softmax router over
  ``ffn_gate_inp``, top ``expert_used_count`` renormalised, experts ``ffn_{gate,up,down}_exps``
  (or fused ``ffn_gate_up_exps``), plus the shared expert ``ffn_{gate,up,down}_shexp`` scaled
  by sigmoid(h . ``ffn_gate_inp_shexp``).
- every norm weight is used as stored (the converter already added Hugging Face's +1).
- multi-token-prediction layers (``nextn_predict_layers``, appended after the trunk) are not
  run: ``block_count`` counts the trunk only, as llama.cpp does.

Caches: "kv" (block pool over the attention layers) and "rec" (a RecurrentState: conv and
DeltaNet state of each DeltaNet layer; cannot be trimmed, context checkpoints snapshot it).
"""
from __future__ import annotations

import numpy as np

from ..cache import CacheState, KVCacheState
from ..cache.recurrent import RecurrentState
from ..errors import ModelLoadError
from ..gguf_file import GGUFFile, Tensor
from . import register
from .base import Model, ModelArgs, require_tensors
from .blocks import PreNormBlock
from .deltanet import DeltaNetWeights, GatedDeltaNet, require_kernel
from .gated_attention import GatedAttention, split_query_gate
from .layers import Embedding, GatedFFN, tensor_rows
from .moe import MoE, MoEStats


def text_rope_covers_all_pairs(sections, n_rot: int) -> bool:
    """Whether multi-section rope with text positions (p, p, p, 0) rotates every one of the
    n_rot/2 pairs (ggml_rope_multi, interleaved and sequential sections alike): then it is
    plain NEOX rope. A pair that falls in the fourth section would not rotate."""
    s = [int(v) for v in list(sections)[:4]] + [0] * (4 - min(4, len(sections)))
    total = sum(s)
    if total == 0:
        return True
    for i in range(n_rot // 2):
        sector = i % total
        interleaved = ((sector % 3 == 0 and sector < 3 * s[0]) or (sector % 3 == 1 and sector < 3 * s[1])
                       or (sector % 3 == 2 and sector < 3 * s[2]))
        sequential = sector < s[0] + s[1] + s[2]
        if not (interleaved and sequential):
            return False
    return True


def split_fused_experts(t: Tensor) -> tuple[Tensor, Tensor]:
    """(gate, up) of a fused ``ffn_gate_up_exps`` (n_expert, 2*ff, in) tensor."""
    ff = t.shape[1] // 2
    raw = t.raw()
    return (Tensor(t.name + "[gate]", t.ggml_type, (t.shape[0], ff, t.shape[2]), raw[:, :ff]),
            Tensor(t.name + "[up]", t.ggml_type, (t.shape[0], ff, t.shape[2]), raw[:, ff:]))


@register("qwen35")
class Qwen35(Model):
    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, **options):
        super().__init__(g, args, **options)
        require_kernel()  # the DeltaNet kernel (and with it the attention kernels)
        a = self.args
        n_nextn = int(g.arch_key("nextn_predict_layers", 0) or 0)
        if not 0 <= n_nextn < a.n_layer:
            raise ModelLoadError(f"{g.path}: nextn_predict_layers {n_nextn} of {a.n_layer} blocks")
        a.n_layer -= n_nextn  # the MTP blocks after the trunk are skipped
        self.interval = int(g.arch_key("full_attention_interval", 4) or 4)
        self.is_deltanet = [(i + 1) % self.interval != 0 for i in range(a.n_layer)]
        self.ssm_head_dim = int(g.arch_key("ssm.state_size"))
        self.n_qk = int(g.arch_key("ssm.group_count"))
        self.n_v = int(g.arch_key("ssm.time_step_rank"))
        self.conv_kernel = int(g.arch_key("ssm.conv_kernel"))
        if self.n_qk < 1 or self.n_v % self.n_qk:
            raise ModelLoadError(f"{g.path}: {self.n_v} value heads do not divide over {self.n_qk} q/k heads")
        sections = g.arch_key("rope.dimension_sections", None)
        if sections is not None and not text_rope_covers_all_pairs(sections, a.rope_dim):
            raise ModelLoadError(f"{g.path}: rope.dimension_sections {list(sections)} leave some of the "
                                 f"{a.rope_dim // 2} rotated pairs unrotated for text: not supported")
        require_tensors(g, ["token_embd.weight", "output_norm.weight"])
        attn_layers = [i for i in range(a.n_layer) if not self.is_deltanet[i]]
        dn_layers = [i for i in range(a.n_layer) if self.is_deltanet[i]]
        self.pool = self.add_pool("kv", max(1, len(attn_layers)))
        self.embed = Embedding(self.tensor("token_embd.weight"))
        self.blocks = []
        for i in range(a.n_layer):
            p = f"blk.{i}."
            if self.is_deltanet[i]:
                mixer = self.make_deltanet(i, dn_layers.index(i))
            else:
                mixer = self.make_attention(i, attn_layers.index(i))
            self.blocks.append(PreNormBlock(self.norm(p + "attn_norm.weight"), mixer,
                                            self.norm(p + "post_attention_norm.weight"), self.make_ffn(i)))
        self.rec_shapes = [b.mixer.state_shapes() for b in self.blocks if isinstance(b.mixer, GatedDeltaNet)]
        self.head = self.output_head()

    # ---- layers -------------------------------------------------------------------------------
    def head_map(self) -> np.ndarray:
        """Value head h reads q/k head h % n_qk (tiled)."""
        return np.arange(self.n_v) % self.n_qk

    def deltanet_projections(self, i: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(qkv, z, beta, alpha) of DeltaNet layer i in the canonical layout."""
        p = f"blk.{i}."
        return (self.tensor(p + "attn_qkv.weight"), self.tensor(p + "attn_gate.weight"),
                self.tensor(p + "ssm_beta.weight"), self.tensor(p + "ssm_alpha.weight"))

    def make_deltanet(self, i: int, rec_idx: int) -> GatedDeltaNet:
        p = f"blk.{i}."
        qkv, z, beta, alpha = self.deltanet_projections(i)
        w = DeltaNetWeights(qkv=qkv, z=z, beta=beta, alpha=alpha, conv=self.f32(p + "ssm_conv1d.weight"),
                            dt_bias=self.f32(p + "ssm_dt.bias"), ssm_a=self.f32(p + "ssm_a"),
                            norm=self.f32(p + "ssm_norm.weight"), out=self.tensor(p + "ssm_out.weight"))
        return GatedDeltaNet(w, n_qk=self.n_qk, n_v=self.n_v, head_dim=self.ssm_head_dim,
                             head_map=self.head_map(), eps=self.args.norm_eps, rec_idx=rec_idx)

    def make_attention(self, i: int, kv_idx: int) -> GatedAttention:
        a = self.args
        p = f"blk.{i}."
        if self.has(p + "attn_q.weight"):
            wq_full, wk, wv = (self.tensor(p + f"attn_{n}.weight") for n in "qkv")
        else:  # one fused [q+gate | k | v] projection
            t = self.tensor(p + "attn_qkv.weight")
            nq, nk = 2 * a.n_head * a.head_dim, a.n_head_kv * a.head_dim
            wq_full = tensor_rows(t, np.arange(nq), p + "attn_q.weight")
            wk = tensor_rows(t, np.arange(nq, nq + nk), p + "attn_k.weight")
            wv = tensor_rows(t, np.arange(nq + nk, t.shape[0]), p + "attn_v.weight")
        wq, wgate = split_query_gate(wq_full, a.n_head, a.head_dim)
        return GatedAttention(
            wgate=wgate, wq=wq, wk=wk, wv=wv, wo=self.tensor(p + "attn_output.weight"),
            n_head=a.n_head, n_head_kv=a.n_head_kv, head_dim=a.head_dim, head_dim_v=a.head_dim_v,
            group="kv", layer_idx=kv_idx, rope_base=a.rope_base, rope_dim=a.rope_dim, rope_neox=True,
            rope_freq_scale=a.rope_freq_scale, q_norm=self.f32(p + "attn_q_norm.weight"),
            k_norm=self.f32(p + "attn_k_norm.weight"), norm_eps=a.norm_eps, pool=self.pool)

    def make_ffn(self, i: int):
        return self.gated_ffn(i)

    # ---- caches -------------------------------------------------------------------------------
    def make_cache(self) -> dict[str, CacheState]:
        return {"kv": KVCacheState(self.pool),
                "rec": RecurrentState([c for c, _ in self.rec_shapes], [s for _, s in self.rec_shapes])}

    @property
    def state_bytes(self) -> int:
        """Bytes of one sequence's recurrent state (conv + DeltaNet, f32) = one checkpoint's
        recurrent part."""
        return RecurrentState([c for c, _ in self.rec_shapes], [s for _, s in self.rec_shapes]).state_bytes


@register("qwen35moe")
class Qwen35MoE(Qwen35):
    def make_ffn(self, i: int):
        p = f"blk.{i}."
        if not self.has(p + "ffn_gate_inp.weight"):
            return self.gated_ffn(i)
        if self.has(p + "ffn_gate_up_exps.weight"):
            gate, up = split_fused_experts(self.tensor(p + "ffn_gate_up_exps.weight"))
        else:
            gate, up = self.tensor(p + "ffn_gate_exps.weight"), self.tensor(p + "ffn_up_exps.weight")
        shared = shared_gate = None
        if self.has(p + "ffn_up_shexp.weight"):
            shared = GatedFFN(self.tensor(p + "ffn_gate_shexp.weight"), self.tensor(p + "ffn_up_shexp.weight"),
                              self.tensor(p + "ffn_down_shexp.weight"))
            shared_gate = self.optional_f32(p + "ffn_gate_inp_shexp.weight")
        if self.moe_stats is None:
            self.moe_stats = MoEStats()
        return MoE(self.tensor(p + "ffn_gate_inp.weight"), gate, up, self.tensor(p + "ffn_down_exps.weight"),
                   int(self.gguf.arch_key("expert_used_count")), route="softmax_norm", act="silu",
                   shared=shared, shared_gate=shared_gate, stats=self.moe_stats)
