"""Mixture-of-experts feed-forward, shared by the MoE architectures (qwen3moe, gpt-oss, ...).

    moe = MoE(router, gate_exps, up_exps, down_exps, n_used,
              route="softmax_norm", act="silu", stats=model.moe_stats)
    y = moe(x)                       # x float32 (n_tokens, n_embd) -> (n_tokens, n_embd)

One call, for all tokens of a batched step:

1. router logits ``x @ W_router.T (+ bias)`` -> ``route(logits, k)`` -> expert ids (n, k)
   and weights (n, k). Routers: ``"softmax_norm"`` (qwen3moe: softmax, top-k, renormalise),
   ``"softmax"`` (top-k of the softmax, not renormalised), ``"softmax_weight"`` (gpt-oss: top-k
   logits, softmax over the k), ``"sigmoid_norm"``; or any callable ``(logits, k) -> (ids, w)``.
2. :func:`group_by_expert`: the n*k (token, expert) pairs sorted by expert with a counting
   sort; only the experts some token chose ("active") get a row range.
3. one batched matmul per active expert through :meth:`quant.ExpertLinear.grouped`
   (gate and up fused into one ExpertLinear when they share a type), ``act(g, u)``
   (``"silu"``, ``"gelu"`` or a callable, e.g. gpt-oss's clamped SwiGLU), then down.
   Optional per-expert biases (gpt-oss) are added per row.
4. :func:`combine`: each token's k rows summed with its routing weights, read in place from
   the sorted rows (one kernel pass: ``llmcore._kernels.moe``).
5. optional shared expert (``shared(x)``, gated by ``sigmoid(x @ shared_gate)`` if given).

Experts that no token selected are never computed: :class:`MoEStats` counts experts
computed and skipped (per layer call, summed over the layers that share the object).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import gguf
import numpy as np

from .. import _kernels, nn, quant
from ..gguf_file import Tensor
from ..threads import get_num_threads

_moe = _kernels.load("moe") if _kernels.ENABLED else None

# ----------------------------------------------------------------------------------------------
# routers: (logits float32 (n, E), k) -> (ids int32 (n, k), weights float32 (n, k))
# ----------------------------------------------------------------------------------------------


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row, largest first (lowest index on ties)."""
    return np.ascontiguousarray(np.argsort(-scores, axis=1, kind="stable")[:, :k], dtype=np.int32)


def _softmax(lg: np.ndarray) -> np.ndarray:
    lg = np.asarray(lg, dtype=np.float32)
    m = lg.max(axis=1, keepdims=True)
    p = np.exp(lg - m)
    p /= p.sum(axis=1, keepdims=True)
    return p


def route_softmax(logits: np.ndarray, k: int, norm: bool = False):
    """Top-k of the softmax (renormalised when ``norm``). With the kernels: one pass per token
    with llama.cpp's softmax and sums (``llmcore._kernels.moe.route_softmax_topk``)."""
    if _moe is not None:
        lg = np.ascontiguousarray(logits, dtype=np.float32)
        ids = np.empty((lg.shape[0], k), np.int32)
        w = np.empty((lg.shape[0], k), np.float32)
        _moe.route_softmax_topk(lg, k, norm, ids, w, get_num_threads())
        return ids, w
    p = _softmax(logits)
    ids = _topk(p, k)
    w = np.take_along_axis(p, ids, 1)
    if norm:
        w = w / w.sum(axis=1, keepdims=True)
    return ids, np.ascontiguousarray(w, dtype=np.float32)


def route_softmax_norm(logits: np.ndarray, k: int):
    return route_softmax(logits, k, norm=True)


def route_softmax_weight(logits: np.ndarray, k: int):
    """gpt-oss: the k largest logits, weights = softmax over those k."""
    lg = np.asarray(logits, dtype=np.float32)
    ids = _topk(lg, k)
    return ids, _softmax(np.take_along_axis(lg, ids, 1))


def route_sigmoid_norm(logits: np.ndarray, k: int):
    s = 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float32)))
    ids = _topk(s, k)
    w = np.take_along_axis(s, ids, 1)
    return ids, np.ascontiguousarray(w / w.sum(axis=1, keepdims=True), dtype=np.float32)


ROUTERS: dict[str, Callable] = {
    "softmax": route_softmax,
    "softmax_norm": route_softmax_norm,
    "softmax_weight": route_softmax_weight,
    "sigmoid_norm": route_sigmoid_norm,
}

ACTS: dict[str, Callable] = {"silu": nn.silu_mul, "gelu": nn.gelu_mul}


# ----------------------------------------------------------------------------------------------
# grouping
# ----------------------------------------------------------------------------------------------
@dataclass
class Grouping:
    """The (token, slot) pairs of a routing sorted by expert.

    - ``order`` int64 (n*k,): flat pair index (token * k + slot) of each sorted row
    - ``token`` int64 (n*k,): token of each sorted row (``order // k``)
    - ``expert_ids`` int32 (A,): the active experts, ascending
    - ``offsets`` int64 (A+1,): rows ``offsets[i]:offsets[i+1]`` belong to ``expert_ids[i]``
    - ``row_expert`` int32 (n*k,): expert of each sorted row
    """

    order: np.ndarray
    token: np.ndarray
    expert_ids: np.ndarray
    offsets: np.ndarray
    row_expert: np.ndarray

    @property
    def n_active(self) -> int:
        return int(self.expert_ids.shape[0])


def group_by_expert(ids: np.ndarray, n_expert: int) -> Grouping:
    """Counting sort of the (n, k) expert choices by expert (stable: token order kept)."""
    ids = np.asarray(ids)
    k = ids.shape[1] if ids.ndim == 2 else 1
    flat = ids.reshape(-1).astype(np.int64, copy=False)
    if flat.size and (flat.min() < 0 or flat.max() >= n_expert):
        raise ValueError(f"expert id out of range [0, {n_expert})")
    counts = np.bincount(flat, minlength=n_expert)
    starts = np.zeros(n_expert + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    # stable sort of small ints: NumPy's radix (counting) sort for 8/16-bit keys
    keys = flat.astype(np.int16 if n_expert < 32768 else np.int64)
    order = np.argsort(keys, kind="stable")
    active = np.flatnonzero(counts).astype(np.int32)
    offsets = np.append(starts[active], starts[-1]).astype(np.int64)
    row_expert = np.repeat(active, counts[active]).astype(np.int32)
    return Grouping(order=order, token=order // k, expert_ids=active, offsets=offsets,
                    row_expert=row_expert)


def combine(y: np.ndarray, g: Grouping, w: np.ndarray) -> np.ndarray:
    """Each token's expert outputs summed with its routing weights, in slot order:
    ``y`` (n*k, d) rows sorted as ``g``, ``w`` (n, k) -> float32 (n, d)."""
    n, k = w.shape
    if _moe is not None:
        row_of = np.empty(n * k, dtype=np.int64)
        row_of[g.order] = np.arange(n * k, dtype=np.int64)
        out = np.empty((n, y.shape[1]), dtype=np.float32)
        _moe.combine(y, row_of, np.ascontiguousarray(w, dtype=np.float32).reshape(-1), out, get_num_threads())
        return out
    y = y * w.reshape(-1)[g.order][:, None]
    unsorted = np.empty_like(y)
    unsorted[g.order] = y
    return np.ascontiguousarray(unsorted.reshape(n, k, -1).sum(axis=1, dtype=np.float32))


# ----------------------------------------------------------------------------------------------
# stats
# ----------------------------------------------------------------------------------------------
@dataclass
class MoEStats:
    """Counters summed over every MoE layer call that shares this object."""

    calls: int = 0  # layer calls
    tokens: int = 0  # tokens routed (summed over layers)
    pairs: int = 0  # (token, expert) rows computed
    experts_computed: int = 0  # active experts, summed over layer calls
    experts_skipped: int = 0  # experts no token chose, summed over layer calls
    per_expert: np.ndarray | None = field(default=None, repr=False)  # rows per expert id

    def record(self, n_tokens: int, g: Grouping, n_expert: int) -> None:
        self.calls += 1
        self.tokens += n_tokens
        self.pairs += int(g.offsets[-1])
        self.experts_computed += g.n_active
        self.experts_skipped += n_expert - g.n_active
        if self.per_expert is None or self.per_expert.shape[0] < n_expert:
            pe = np.zeros(n_expert, dtype=np.int64)
            if self.per_expert is not None:
                pe[: self.per_expert.shape[0]] = self.per_expert
            self.per_expert = pe
        self.per_expert[g.expert_ids] += np.diff(g.offsets)

    def reset(self) -> None:
        self.calls = self.tokens = self.pairs = self.experts_computed = self.experts_skipped = 0
        self.per_expert = None

    def as_dict(self) -> dict:
        return {"calls": self.calls, "tokens": self.tokens, "pairs": self.pairs,
                "experts_computed": self.experts_computed, "experts_skipped": self.experts_skipped}


# ----------------------------------------------------------------------------------------------
# the block
# ----------------------------------------------------------------------------------------------
def _concat_experts(a: Tensor, b: Tensor, name: str) -> Tensor | None:
    """One (E, out_a + out_b, in) expert tensor from two of the same type, or None."""
    if (a.ggml_type != b.ggml_type or len(a.shape) != 3 or len(b.shape) != 3
            or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]):
        return None
    ra, rb = a.raw(), b.raw()
    if ra.shape[2] != rb.shape[2]:
        return None
    data = np.ascontiguousarray(np.concatenate([ra, rb], axis=1))
    return Tensor(name, a.ggml_type, (a.shape[0], a.shape[1] + b.shape[1], a.shape[2]), data)


def _f32(a) -> np.ndarray | None:
    if a is None:
        return None
    if isinstance(a, Tensor):
        a = a.dequantize()
    return np.ascontiguousarray(a, dtype=np.float32)


class MoE:
    """Top-k routed experts (see module docstring). Tensors are GGUF tensors:
    ``router`` (E, d) 2-D; ``gate``/``up`` (E, ff, d), ``down`` (E, d, ff) 3-D.
    Biases (float32 arrays or tensors): ``router_bias`` (E,), ``gate_bias``/``up_bias`` (E, ff),
    ``down_bias`` (E, d). ``route``: name in :data:`ROUTERS` or callable ``(logits, k) -> (ids,
    weights)``. ``act``: name in :data:`ACTS` or callable ``(g, u) -> a`` on (rows, ff) arrays.
    ``shared``: callable ``x -> y`` (shared expert), ``shared_gate``: (d,) vector or None.
    """

    def __init__(self, router: Tensor, gate: Tensor, up: Tensor, down: Tensor, n_used: int, *,
                 route: str | Callable = "softmax_norm", act: str | Callable = "silu",
                 router_bias=None, gate_bias=None, up_bias=None, down_bias=None,
                 shared: Callable | None = None, shared_gate=None, stats: MoEStats | None = None):
        QT = gguf.GGMLQuantizationType
        rtype = int(router.ggml_type)
        self.router_bias = _f32(router_bias)
        # through the matmul kernels, not NumPy/BLAS: a token's logits (and so its experts)
        # must not depend on how many rows the step has (BLAS blocks edge rows differently),
        # or a prompt split over two calls would route differently from one call
        self.router = quant.Linear(router, bias=self.router_bias)
        n_out = self.router.out_features
        # llama.cpp rounds activations to f16 before an F16 matmul; the float kernels don't.
        # Routing is a discrete choice, so do it here to pick the same experts on near-ties.
        self.router_f16_act = rtype == int(QT.F16)
        self.n_expert = int(gate.shape[0])
        if n_out != self.n_expert:
            raise ValueError(f"{router.name}: {n_out} router outputs for "
                             f"{self.n_expert} experts")
        self.n_used = int(n_used)
        if not 1 <= self.n_used <= self.n_expert:
            raise ValueError(f"expert_used_count {n_used} not in [1, {self.n_expert}]")
        self.n_ff = int(gate.shape[1])
        self.route_fn = ROUTERS[route] if isinstance(route, str) else route
        self.act = ACTS[act] if isinstance(act, str) else act
        fused = _concat_experts(gate, up, f"{gate.name}+{up.name}")
        if fused is not None:
            self.gate_up = quant.ExpertLinear(fused)
            self.gate = self.up = None
        else:
            self.gate_up = None
            self.gate, self.up = quant.ExpertLinear(gate), quant.ExpertLinear(up)
        self.down = quant.ExpertLinear(down)
        gb, ub = _f32(gate_bias), _f32(up_bias)
        if gb is None and ub is None:
            self.gate_up_bias = None
        else:
            gb = np.zeros((self.n_expert, self.n_ff), np.float32) if gb is None else gb.reshape(self.n_expert, -1)
            ub = np.zeros((self.n_expert, self.n_ff), np.float32) if ub is None else ub.reshape(self.n_expert, -1)
            self.gate_up_bias = np.ascontiguousarray(np.concatenate([gb, ub], axis=1))
        self.down_bias = None if down_bias is None else _f32(down_bias).reshape(self.n_expert, -1)
        self.shared = shared
        self.shared_gate = None  # (d,) -> a one-row Linear, batch-invariant like the router
        if shared_gate is not None:
            g = _f32(shared_gate).reshape(1, -1)
            self.shared_gate = quant.Linear(Tensor("shared_gate", int(QT.F32), g.shape, g))
        self.stats = stats if stats is not None else MoEStats()

    # -- pieces (usable on their own by other architectures) ---------------------------------
    def route(self, x: np.ndarray):
        """(ids int32 (n, k), weights float32 (n, k)) for x (n, d)."""
        if self.router_f16_act:
            x = x.astype(np.float16).astype(np.float32)
        logits = self.router(x)
        ids, w = self.route_fn(logits, self.n_used)
        return np.asarray(ids, dtype=np.int32), np.asarray(w, dtype=np.float32)

    def experts(self, x: np.ndarray, g: Grouping) -> np.ndarray:
        """Expert outputs for the sorted rows of ``g`` (unweighted), (n*k, d). The tokens'
        rows go in once (``rows=``: kernels that take a row map quantize each token once
        instead of once per chosen expert, and nothing is gathered)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        eids, offs = g.expert_ids, g.offsets
        if self.gate_up is not None:
            gu = self.gate_up.grouped(x, eids, offs, rows=g.token)
            if self.gate_up_bias is not None:
                gu += self.gate_up_bias[g.row_expert]
            h = self.act(gu[:, : self.n_ff], gu[:, self.n_ff:])
        else:
            gg = self.gate.grouped(x, eids, offs, rows=g.token)
            uu = self.up.grouped(x, eids, offs, rows=g.token)
            if self.gate_up_bias is not None:
                gg += self.gate_up_bias[g.row_expert, : self.n_ff]
                uu += self.gate_up_bias[g.row_expert, self.n_ff:]
            h = self.act(gg, uu)
        y = self.down.grouped(np.ascontiguousarray(h, dtype=np.float32), eids, offs)
        if self.down_bias is not None:
            y += self.down_bias[g.row_expert]
        return y

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, d = x.shape
        ids, w = self.route(x)
        k = ids.shape[1]
        g = group_by_expert(ids, self.n_expert)
        self.stats.record(n, g, self.n_expert)
        y = self.experts(x, g)
        out = combine(y, g, w)
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = s * (1.0 / (1.0 + np.exp(-self.shared_gate(x))))
            out += s
        return out


__all__ = ["MoE", "MoEStats", "Grouping", "group_by_expert", "combine", "ROUTERS", "ACTS", "route_softmax",
           "route_softmax_norm", "route_softmax_weight", "route_sigmoid_norm"]
