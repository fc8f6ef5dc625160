"""Shared model machinery: ModelArgs from GGUF metadata, the batched forward context, and
the Model base class every architecture derives from.

Batched forward (continuous batching): ``model.forward(batch)`` with ``batch`` a list of
``(SeqState, tokens)`` segments. Each segment's tokens are appended at its sequence's
current positions; all tokens of all segments go through each Linear together, and
attention is one ``nn.attention`` call per layer with per-sequence block tables.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import nn
from ..cache import BlockPool, CacheState, KVCacheState, SeqState
from ..errors import ModelLoadError
from ..gguf_file import GGUFFile


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
    extra: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_gguf(cls, g: GGUFFile, **overrides: Any) -> "ModelArgs":
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
        for k, v in overrides.items():
            if hasattr(args, k):
                setattr(args, k, v)
            else:
                args.extra[k] = v
        if args.rope_dim <= 0:
            args.rope_dim = args.head_dim
        return args


class ForwardBatch:
    """Everything the layers need about one batched step, computed once per forward.

    - ``tokens`` int32 (N,), ``positions`` int32 (N,), ``seg_start`` int32 (S+1,)
    - ``seqs``: the SeqStates, ``lengths``: tokens per segment, ``starts``: first position
    - ``block_tables[group]``: int32 (S, max_blocks) padded with 0, per cache group
    - ``last_rows``: int (S,) row index of each segment's last token
    """

    __slots__ = ("tokens", "positions", "seg_start", "seqs", "lengths", "starts",
                 "block_tables", "last_rows", "n_tokens", "n_seqs", "extra")

    def __init__(self, seqs, token_arrays, starts):
        self.seqs = seqs
        self.n_seqs = len(seqs)
        self.lengths = [len(t) for t in token_arrays]
        self.starts = starts
        self.tokens = np.concatenate(token_arrays).astype(np.int32, copy=False) if token_arrays else np.zeros(0, np.int32)
        self.n_tokens = int(self.tokens.shape[0])
        seg = np.zeros(self.n_seqs + 1, dtype=np.int32)
        np.cumsum(self.lengths, out=seg[1:])
        self.seg_start = seg
        if self.n_seqs == 1:
            self.positions = np.arange(starts[0], starts[0] + self.lengths[0], dtype=np.int32)
        elif self.n_tokens == self.n_seqs:  # batched decode: one token per sequence
            self.positions = np.array(starts, dtype=np.int32)
        else:
            off = np.asarray(starts, dtype=np.int32) - seg[:-1]
            self.positions = (np.arange(self.n_tokens, dtype=np.int32)
                              + np.repeat(off, self.lengths).astype(np.int32, copy=False))
        self.last_rows = seg[1:] - 1
        self.block_tables: dict[str, np.ndarray] = {}
        self.extra: dict = {}

    def tables_for(self, group: str) -> np.ndarray:
        bt = self.block_tables.get(group)
        if bt is None:
            tabs = [s.caches[group].block_table for s in self.seqs]
            width = max(1, max(len(t) for t in tabs))
            bt = np.zeros((self.n_seqs, width), dtype=np.int32)
            for i, t in enumerate(tabs):
                bt[i, : len(t)] = t
            self.block_tables[group] = bt
        return bt


def as_tokens(tokens) -> np.ndarray:
    arr = np.asarray(tokens, dtype=np.int32).reshape(-1)
    return arr


class Model:
    """Base class. Subclasses set up layers in ``__init__`` and implement ``_forward``.

    Construction: ``Cls(gguf_file, args=None, kv_type='f16', block_size=32,
    max_kv_bytes=None, max_kv_blocks=None)``.
    Public API: ``new_state()``, ``forward(batch, all_logits=False)``, ``n_vocab``,
    ``n_ctx_train``, ``kv_bytes_per_token``, ``pools``, ``args``.
    """

    arch: str = ""
    args_class = ModelArgs

    def __init__(self, g: GGUFFile, args: ModelArgs | None = None, *, kv_type: str = nn.KV_F16,
                 block_size: int = 32, max_kv_bytes: int | None = None,
                 max_kv_blocks: int | None = None, **cfg: Any):
        self.gguf = g
        self.args = args if args is not None else self.args_class.from_gguf(g)
        self.kv_type = kv_type
        self.block_size = block_size
        self.max_kv_bytes = max_kv_bytes
        self.max_kv_blocks = max_kv_blocks
        self.cfg = cfg
        self.pools: dict[str, BlockPool] = {}
        # cache group name -> factory of that group's per-sequence CacheState
        self.cache_factories: dict[str, Callable[[], CacheState]] = {}

    # ---- helpers for subclasses ---------------------------------------------------------------
    def tensor(self, name: str):
        return self.gguf.tensor(name)

    def has(self, name: str) -> bool:
        return self.gguf.has(name)

    def f32(self, name: str) -> np.ndarray:
        """Small tensor (norm weight, bias) as float32."""
        return np.ascontiguousarray(self.gguf.tensor(name).dequantize(), dtype=np.float32)

    def add_kv_pool(self, group: str, n_layers: int, n_kv_heads: int, head_dim: int,
                    head_dim_v: int | None = None, state_factory: Callable | None = None,
                    max_bytes: int | None = None) -> BlockPool:
        """Create the block pool of one attention-layer group and register its cache kind.

        ``state_factory(pool) -> CacheState`` (default :class:`KVCacheState`; a sliding-window
        group passes its windowed state). ``max_bytes`` defaults to the model's
        ``max_kv_bytes`` (a model with several pools may split it).
        """
        pool = BlockPool(n_layers, n_kv_heads, head_dim, head_dim_v, block_size=self.block_size,
                         kv_type=self.kv_type,
                         max_bytes=self.max_kv_bytes if max_bytes is None else max_bytes,
                         max_blocks=self.max_kv_blocks, name=group)
        self.pools[group] = pool
        factory = state_factory or KVCacheState
        self.cache_factories[group] = lambda: factory(pool)
        return pool

    def add_cache(self, group: str, factory: Callable[[], CacheState]) -> None:
        """Register a cache group without a block pool (e.g. recurrent state)."""
        self.cache_factories[group] = factory

    # ---- public API ---------------------------------------------------------------------------
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

    def stats(self) -> dict[str, float]:
        """Model-level counters (MoE models: experts computed / skipped)."""
        ms = getattr(self, "moe_stats", None)  # (the models engineer replaces this probe)
        if ms is None:
            return {}
        return {"moe_layer_calls": ms.calls, "moe_tokens_routed": ms.tokens,
                "moe_experts_computed": ms.experts_computed, "moe_experts_skipped": ms.experts_skipped}

    def new_state(self) -> SeqState:
        return SeqState({name: make() for name, make in self.cache_factories.items()})

    def forward(self, batch: Sequence[tuple[SeqState, Any]], all_logits: bool = False) -> np.ndarray:
        """Run one step over several sequences.

        Returns float32 logits (n_segments, n_vocab) for the last token of each segment, or
        (total_tokens, n_vocab) for every token (concatenated in segment order) when
        ``all_logits``. On error (e.g. KV cache full) every sequence is left as it was.
        """
        if not batch:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        seqs = [s for s, _ in batch]
        if len({id(s) for s in seqs}) != len(seqs):
            raise ValueError("forward: a sequence appears twice in one batch")
        toks = [as_tokens(t) for _, t in batch]
        if any(t.size == 0 for t in toks):
            raise ValueError("forward: empty segment")
        flat = toks[0] if len(toks) == 1 else np.concatenate(toks)
        if flat.min() < 0 or flat.max() >= self.n_vocab:
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
        fb = ForwardBatch(seqs, toks, starts)
        try:
            logits = self._forward(fb, all_logits)
        except Exception:
            for c, before in reversed(done):
                c.trim(before)
            raise
        for s, t in zip(seqs, toks):
            s.tokens.extend(t.tolist())
        return logits

    def _forward(self, fb: ForwardBatch, all_logits: bool) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        a = self.args
        return (f"<{type(self).__name__} {a.arch} layers={a.n_layer} embd={a.n_embd} "
                f"heads={a.n_head}/{a.n_head_kv} vocab={a.n_vocab}>")


def require_tensors(g: GGUFFile, names: Sequence[str]) -> None:
    missing = [n for n in names if not g.has(n)]
    if missing:
        raise ModelLoadError(f"{g.path}: missing tensors: {', '.join(missing[:5])}")
