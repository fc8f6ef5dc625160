"""The model contract and the base class every architecture derives from.

A model is a GGUF file read into a stack of pre-norm blocks between a token embedding and
an output head (:mod:`.blocks`), plus the block pools its attention layers write K/V
into. What the engine uses (``llmcore.engine.protocols.LanguageModel``):

- ``arch``, ``n_vocab``, ``n_ctx_train``, ``pools`` (cache group -> BlockPool, created at
  load), ``kv_bytes_per_token``;
- ``new_state()``: a fresh :class:`~llmcore.cache.SeqState` holding ``make_cache()``, the
  per-sequence cache state of each group;
- ``forward(batch, all_logits=False)``: one batched step (:mod:`.batch`), float32 logits;
- ``stats()``: model-level counters (the MoE expert counts), {} for a dense model.

What an architecture defines is in :class:`Model`'s docstring.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import nn
from ..cache import BlockPool, CacheState, SeqState
from ..errors import ModelLoadError
from ..gguf_file import GGUFFile
from .batch import ForwardBatch
from .blocks import PreNormBlock, run_blocks
from .decode_step import DecodeStep, MAX_TOKENS as DECODE_STEP_TOKENS
from .layers import Attention, Embedding, GatedFFN, OutputHead, RMSNorm
from .moe import MoE, MoEStats


@dataclass
class ModelArgs:
    """Hyper-parameters read from GGUF metadata (``{arch}.*`` keys)."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int  # key_length
    head_dim_v: int  # value_length
    n_ff: int
    n_vocab: int
    context_length: int
    norm_eps: float
    rope_base: float = 10000.0
    rope_dim: int = 0  # n_rot; 0 -> head_dim
    rope_freq_scale: float = 1.0
    sliding_window: int = 0

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "ModelArgs":
        a = g.arch

        def key(s, default=...):
            return g.arch_key(s, default)

        n_embd = int(key("embedding_length"))
        n_head = int(key("attention.head_count"))
        n_head_kv = key("attention.head_count_kv", n_head)
        if isinstance(n_head_kv, (list, tuple)):  # per-layer (lfm2...): keep the max here
            n_head_kv = max(int(x) for x in n_head_kv)
        head_dim = int(key("attention.key_length", n_embd // max(1, n_head)))
        head_dim_v = int(key("attention.value_length", head_dim))
        if g.has("token_embd.weight"):
            n_vocab = int(g.tensors["token_embd.weight"].shape[0])
        else:
            n_vocab = int(key("vocab_size", len(g.get("tokenizer.ggml.tokens", []) or [])))
        if g.has("output.weight"):
            n_vocab = int(g.tensors["output.weight"].shape[0])
        n_ff = key("feed_forward_length", 0)
        if isinstance(n_ff, (list, tuple)):
            n_ff = max(int(x) for x in n_ff)
        eps = key("attention.layer_norm_rms_epsilon", None)
        if eps is None:
            eps = key("attention.layer_norm_epsilon", 1e-5)
        freq_scale = 1.0
        stype = key("rope.scaling.type", None)
        factor = key("rope.scaling.factor", None)
        if stype == "linear" and factor:
            freq_scale = 1.0 / float(factor)
        args = cls(
            arch=a,
            n_layer=int(key("block_count")),
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=int(n_head_kv),
            head_dim=head_dim,
            head_dim_v=head_dim_v,
            n_ff=int(n_ff),
            n_vocab=n_vocab,
            context_length=int(key("context_length", 4096)),
            norm_eps=float(eps),
            rope_base=float(key("rope.freq_base", 10000.0)),
            rope_dim=int(key("rope.dimension_count", head_dim)),
            rope_freq_scale=freq_scale,
            sliding_window=int(key("attention.sliding_window", 0) or 0),
        )
        if args.rope_dim <= 0:
            args.rope_dim = args.head_dim
        return args


class Model:
    """Base class: the contract above, and helpers that build the standard layers from
    their GGUF tensor names.

    An architecture (one module, see ``llama.py`` for the shortest) defines:

    - ``__init__(g, args=None, **options)``: ``super().__init__(g, args, **options)``, then
      one block pool per attention-layer group (:meth:`add_pool`), ``self.embed``,
      ``self.blocks`` (:class:`~.blocks.PreNormBlock`) and ``self.head``
      (:meth:`output_head`), built with :meth:`norm`, :meth:`attention`, :meth:`gated_ffn`,
      :meth:`experts`;
    - ``make_cache() -> {group: CacheState}``: the per-sequence state of each cache group
      (``KVCacheState(pool)``, ``SWAKVCacheState(pool, window)``, ``RecurrentState(...)``);
      this is where a group's kind is decided;
    - ``_forward(fb, all_logits)`` only if its graph is not embed -> blocks -> head.

    Construction: ``Cls(gguf_file, args=None, kv_type='f16', block_size=32,
    max_kv_bytes=None, max_kv_blocks=None, **options)``; options an architecture does not
    take (the engine offers all its settings) are ignored.
    """

    arch: str = ""  # set by @register
    embed: Embedding
    blocks: list[PreNormBlock]
    head: OutputHead

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, *, kv_type: str = nn.KV_F16,
                 block_size: int = 32, max_kv_bytes: int | None = None,
                 max_kv_blocks: int | None = None, **options: Any):
        self.gguf = g
        self.args = args if args is not None else ModelArgs.from_gguf(g)
        self.kv_type = kv_type
        self.block_size = block_size
        self.max_kv_bytes = max_kv_bytes
        self.max_kv_blocks = max_kv_blocks
        self.pools: dict[str, BlockPool] = {}
        self.moe_stats: MoEStats | None = None  # shared by the MoE layers (see experts())

    # ---- tensors ------------------------------------------------------------------------------
    def tensor(self, name: str):
        return self.gguf.tensor(name)

    def has(self, name: str) -> bool:
        return self.gguf.has(name)

    def f32(self, name: str) -> np.ndarray:
        """Small tensor (norm weight, bias) as float32."""
        return np.ascontiguousarray(self.gguf.tensor(name).dequantize(), dtype=np.float32)

    def optional_f32(self, name: str) -> np.ndarray | None:
        """:meth:`f32`, or None when the file has no such tensor (optional biases)."""
        return self.f32(name) if self.has(name) else None

    # ---- caches -------------------------------------------------------------------------------
    def add_pool(self, group: str, n_layers: int, n_kv_heads: int | None = None,
                 max_bytes: int | None = None) -> BlockPool:
        """Create the block pool of one attention-layer group (``self.pools[group]``; the
        cache group of the same name holds each sequence's block table into it).

        ``n_kv_heads`` defaults to ``args.n_head_kv``; ``max_bytes`` to the model's
        ``max_kv_bytes`` (a model with several pools may split it).
        """
        a = self.args
        pool = BlockPool(n_layers, n_kv_heads or a.n_head_kv, a.head_dim, a.head_dim_v,
                         block_size=self.block_size, kv_type=self.kv_type,
                         max_bytes=self.max_kv_bytes if max_bytes is None else max_bytes,
                         max_blocks=self.max_kv_blocks, name=group)
        self.pools[group] = pool
        return pool

    def make_cache(self) -> dict[str, CacheState]:  # pragma: no cover - per architecture
        """The per-sequence cache state of each cache group, in a fixed order."""
        raise NotImplementedError

    # ---- layers -------------------------------------------------------------------------------
    def norm(self, name: str) -> RMSNorm:
        return RMSNorm(self.f32(name), self.args.norm_eps)

    def attention(self, i: int, pool: BlockPool, layer_idx: int | None = None, *, rope_neox: bool,
                  qk_norm: bool = False, window: int = 0, rope_base: float | None = None,
                  rope_freq_scale: float | None = None, n_head_kv: int | None = None) -> Attention:
        """Self-attention of layer ``i`` over ``pool`` (its layer ``layer_idx``, default i).

        Tensors ``blk.i.attn_{q,k,v,output}.weight``; with ``qk_norm`` the per-head
        ``attn_q_norm``/``attn_k_norm``; where present the biases ``attn_{q,k,v,output}.bias``
        and the attention sinks ``attn_sinks.weight``. Rope base and scaling default to the
        GGUF's; ``window`` > 0 makes it sliding-window attention.
        """
        a = self.args
        p = f"blk.{i}."
        return Attention(
            wq=self.tensor(p + "attn_q.weight"), wk=self.tensor(p + "attn_k.weight"),
            wv=self.tensor(p + "attn_v.weight"), wo=self.tensor(p + "attn_output.weight"),
            n_head=a.n_head, n_head_kv=n_head_kv or a.n_head_kv, head_dim=a.head_dim,
            head_dim_v=a.head_dim_v, group=pool.name, layer_idx=i if layer_idx is None else layer_idx,
            rope_base=a.rope_base if rope_base is None else rope_base, rope_dim=a.rope_dim,
            rope_neox=rope_neox,
            rope_freq_scale=a.rope_freq_scale if rope_freq_scale is None else rope_freq_scale,
            q_norm=self.f32(p + "attn_q_norm.weight") if qk_norm else None,
            k_norm=self.f32(p + "attn_k_norm.weight") if qk_norm else None,
            norm_eps=a.norm_eps, window=window, sinks=self.optional_f32(p + "attn_sinks.weight"),
            biases=[self.optional_f32(p + f"attn_{n}.bias") for n in "qkv"],
            bo=self.optional_f32(p + "attn_output.bias"), pool=pool)

    def gated_ffn(self, i: int, act: str = "silu") -> GatedFFN:
        """``ffn_down(act(ffn_gate(h)) * ffn_up(h))`` of layer i (act "silu" or "gelu")."""
        p = f"blk.{i}."
        return GatedFFN(self.tensor(p + "ffn_gate.weight"), self.tensor(p + "ffn_up.weight"),
                        self.tensor(p + "ffn_down.weight"), act=act)

    def experts(self, i: int, *, route: str | Callable, act: str | Callable) -> MoE:
        """The routed experts of layer i (:class:`~.moe.MoE`): router ``ffn_gate_inp``,
        experts ``ffn_{gate,up,down}_exps`` (biases where present), ``expert_used_count``
        per token. Every MoE layer counts into ``self.moe_stats`` (what :meth:`stats` reads).
        """
        p = f"blk.{i}."
        if self.moe_stats is None:
            self.moe_stats = MoEStats()
        return MoE(self.tensor(p + "ffn_gate_inp.weight"), self.tensor(p + "ffn_gate_exps.weight"),
                   self.tensor(p + "ffn_up_exps.weight"), self.tensor(p + "ffn_down_exps.weight"),
                   int(self.gguf.arch_key("expert_used_count")), route=route, act=act,
                   router_bias=self.optional_f32(p + "ffn_gate_inp.bias"),
                   gate_bias=self.optional_f32(p + "ffn_gate_exps.bias"),
                   up_bias=self.optional_f32(p + "ffn_up_exps.bias"),
                   down_bias=self.optional_f32(p + "ffn_down_exps.bias"), stats=self.moe_stats)

    def output_head(self, norm: str = "output_norm.weight", softcap: float = 0.0) -> OutputHead:
        """Final RMS norm (tensor ``norm``) and lm_head: ``output.weight``, or the token
        embedding when the file ties the output to it (no ``output.weight``)."""
        w = self.tensor("output.weight") if self.has("output.weight") else self.tensor("token_embd.weight")
        return OutputHead(self.norm(norm), w, softcap=softcap)

    # ---- the contract -------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.args.n_vocab

    @property
    def n_ctx_train(self) -> int:
        return self.args.context_length

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV storage one token costs (all pools; fixed-size state not included)."""
        return sum(p.bytes_per_token for p in self.pools.values())

    def new_state(self) -> SeqState:
        return SeqState(self.make_cache())

    def stats(self) -> dict[str, float]:
        """Counters since load: ``moe_*`` (:class:`~.moe.MoEStats`: layer calls, tokens routed,
        (token, expert) rows, experts computed and skipped, summed over the MoE layers) for
        a model with routed experts; {} otherwise."""
        if self.moe_stats is None:
            return {}
        return {f"moe_{k}": float(v) for k, v in self.moe_stats.as_dict().items()}

    def forward(self, batch: Sequence[tuple[SeqState, Any]], all_logits: bool = False,
                output: str = "logits", n_logits: Sequence[int] | None = None,
                argmax: np.ndarray | None = None) -> np.ndarray:
        """Run one step over several sequences.

        Returns float32 logits (n_segments, n_vocab) for the last token of each segment, or
        (total_tokens, n_vocab) for every token (concatenated in segment order) when
        ``all_logits``, or the last ``n_logits[i]`` positions of each segment i
        (concatenated) when given; with ``output="hidden"`` the final-normed hidden states of every
        token instead, (total_tokens, n_embd) (what embeddings pool). On error (e.g. KV
        cache full) every sequence is left as it was. ``argmax``: an int64 array with one
        entry per logits row, filled with each row's argmax (what greedy decoding takes;
        the fused decode step finds it as its head writes the rows, cheaper than a pass over
        the logits after).
        """
        if not batch:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        seqs = [s for s, _ in batch]
        if len({id(s) for s in seqs}) != len(seqs):
            raise ValueError("forward: a sequence appears twice in one batch")
        toks = [np.asarray(t, dtype=np.int32).reshape(-1) for _, t in batch]
        if any(t.size == 0 for t in toks):
            raise ValueError("forward: empty segment")
        flat = toks[0] if len(toks) == 1 else np.concatenate(toks)
        lo, hi = (int(flat[0]), int(flat[0])) if flat.shape[0] == 1 else (flat.min(), flat.max())
        if lo < 0 or hi >= self.n_vocab:
            raise ValueError(f"forward: token id out of range [0, {self.n_vocab})")
        starts = [s.n_tokens for s in seqs]
        # reserve room in every cache of every sequence, all-or-nothing
        done: list[tuple[Any, int]] = []
        try:
            for s, t in zip(seqs, toks):
                for c in s.caches.values():
                    before = c.n_tokens
                    c.append(len(t))
                    done.append((c, before))
        except Exception:
            for c, before in reversed(done):
                c.trim(before)
            raise
        fb = ForwardBatch(seqs, toks, starts, n_logits)
        if argmax is not None:
            n_rows = fb.n_tokens if all_logits else len(fb.logit_rows)
            if output == "hidden" or argmax.dtype != np.int64 or argmax.shape != (n_rows,):
                for c, before in reversed(done):
                    c.trim(before)
                raise ValueError(f"forward: argmax must be int64 ({n_rows},) and the output logits")
        try:
            if output == "hidden":
                logits = self._hidden(fb)
            elif argmax is not None and type(self)._forward is Model._forward:
                logits = self._forward(fb, all_logits, argmax)
            else:  # (an architecture's own graph: the argmax after)
                logits = self._forward(fb, all_logits)
                if argmax is not None:
                    argmax[:] = np.argmax(logits, axis=1)
        except Exception:
            for c, before in reversed(done):
                c.trim(before)
            raise
        for s, t in zip(seqs, toks):
            s.tokens.extend(t.tolist())
        return logits

    def decode_step(self) -> DecodeStep | None:
        """The fused decode step (:mod:`.decode_step`), built on first use; None when the
        model has a part it does not run."""
        step = self.__dict__.get("_decode_step", False)
        if step is False:
            step = self._decode_step = DecodeStep.build(self)
        return step

    def _forward(self, fb: ForwardBatch, all_logits: bool, argmax: np.ndarray | None = None) -> np.ndarray:
        step = self.decode_step() if fb.n_tokens <= DECODE_STEP_TOKENS else None
        if step is not None:
            rows = np.arange(fb.n_tokens) if all_logits else fb.logit_rows
            return step(fb, self.embed(fb.tokens), rows, argmax)
        x = run_blocks(self.blocks, self.embed(fb.tokens), fb)
        if not all_logits and len(fb.logit_rows) != fb.n_tokens:
            x = x[fb.logit_rows]
        logits = self.head(x)
        if argmax is not None:
            argmax[:] = np.argmax(logits, axis=1)
        return logits

    def _hidden(self, fb: ForwardBatch) -> np.ndarray:
        x = run_blocks(self.blocks, self.embed(fb.tokens), fb)
        norm = getattr(self.head, "norm", None)
        return np.asarray(norm(x) if norm is not None else x, dtype=np.float32)

    def __repr__(self) -> str:
        a = self.args
        return (f"<{type(self).__name__} {a.arch} layers={a.n_layer} embd={a.n_embd} "
                f"heads={a.n_head}/{a.n_head_kv} vocab={a.n_vocab}>")


def require_tensors(g: GGUFFile, names: Sequence[str]) -> None:
    missing = [n for n in names if not g.has(n)]
    if missing:
        raise ModelLoadError(f"{g.path}: missing tensors: {', '.join(missing[:5])}")
