"""The shared MoE block (llmcore/models/moe.py) against a plain NumPy per-token loop."""
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT

from llmcore import quant
from llmcore.gguf_file import Tensor
from llmcore.models import moe as M

E, D, FF = 8, 64, 32


def _tensor(name, w, qt=QT.F32):
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qt == QT.F32:
        data = w
    elif qt == QT.F16:
        data = w.astype(np.float16)
    else:
        data = gguf.quants.quantize(w, qt)
    return Tensor(name, int(qt), tuple(w.shape), data.reshape(-1).view(np.uint8))


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "router": rng.standard_normal((E, D)).astype(np.float32),
        "gate": (rng.standard_normal((E, FF, D)) / np.sqrt(D)).astype(np.float32),
        "up": (rng.standard_normal((E, FF, D)) / np.sqrt(D)).astype(np.float32),
        "down": (rng.standard_normal((E, D, FF)) / np.sqrt(FF)).astype(np.float32),
    }


def _block(w, qt=QT.F32, **kw):
    deq = {k: quant.dequantize(_tensor(k, v, qt).raw(), int(qt), v.shape) if k != "router" else v
           for k, v in w.items()}
    blk = M.MoE(_tensor("router", w["router"]), _tensor("gate", w["gate"], qt), _tensor("up", w["up"], qt),
                _tensor("down", w["down"], qt), kw.pop("k", 2), **kw)
    return blk, deq


def _silu(x):
    return x / (1.0 + np.exp(-x))


def ref_moe(x, w, k, gating="softmax_norm", act=None, biases=None, router_bias=None):
    """Per token: choose experts, run each chosen expert alone, weighted sum (float64)."""
    x = x.astype(np.float64)
    lg = x @ w["router"].T.astype(np.float64)
    if router_bias is not None:
        lg = lg + router_bias
    out = np.zeros((x.shape[0], w["down"].shape[1]))
    for t in range(x.shape[0]):
        if gating == "softmax_weight":
            sel = np.argsort(-lg[t], kind="stable")[:k]
            p = np.exp(lg[t, sel] - lg[t, sel].max())
            wt = p / p.sum()
        else:
            p = np.exp(lg[t] - lg[t].max())
            p /= p.sum()
            sel = np.argsort(-p, kind="stable")[:k]
            wt = p[sel] / (p[sel].sum() if gating == "softmax_norm" else 1.0)
        for e, we in zip(sel, wt):
            g = w["gate"][e] @ x[t]
            u = w["up"][e] @ x[t]
            if biases is not None:
                g, u = g + biases["gate"][e], u + biases["up"][e]
            a = act(g, u) if act is not None else _silu(g) * u
            y = w["down"][e] @ a
            if biases is not None:
                y = y + biases["down"][e]
            out[t] += we * y
    return out


def _x(n, seed=1):
    return np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)


def test_group_by_expert_is_a_stable_sort():
    rng = np.random.default_rng(0)
    ids = np.stack([rng.choice(E, 3, replace=False) for _ in range(50)]).astype(np.int32)
    g = M.group_by_expert(ids, E)
    flat = ids.reshape(-1)
    assert np.array_equal(flat[g.order], np.sort(flat))
    assert np.array_equal(g.row_expert, flat[g.order])
    assert np.array_equal(g.token, g.order // 3)
    for i, e in enumerate(g.expert_ids):
        a, b = g.offsets[i], g.offsets[i + 1]
        assert np.all(g.row_expert[a:b] == e) and b > a
        assert np.all(np.diff(g.token[a:b]) > 0)  # token order kept within an expert
    assert set(g.expert_ids.tolist()) == set(flat.tolist()) and g.offsets[-1] == flat.size
    with pytest.raises(ValueError):
        M.group_by_expert(np.array([[E]]), E)


def test_routers():
    lg = np.random.default_rng(3).standard_normal((20, E)).astype(np.float32)
    ids, w = M.route_softmax_norm(lg, 2)
    assert ids.dtype == np.int32 and ids.shape == (20, 2)
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)
    assert np.array_equal(ids[:, 0], lg.argmax(1))
    ids2, w2 = M.route_softmax(lg, 2)
    p = np.exp(lg - lg.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(w2, np.take_along_axis(p, ids2, 1), rtol=1e-5)
    ids3, w3 = M.route_softmax_weight(lg, 3)
    assert np.array_equal(ids3, np.argsort(-lg, 1, kind="stable")[:, :3])
    np.testing.assert_allclose(w3.sum(1), 1.0, rtol=1e-6)
    ids4, w4 = M.route_sigmoid_norm(lg, 2)
    assert np.array_equal(ids4, ids) and np.allclose(w4.sum(1), 1.0)


def test_softmax_router_kernel():
    """The routing kernel: the k most probable experts, largest first and the lower id on a
    tie, their softmax probabilities (float64 reference), renormalised or not, per token
    whatever the batch and thread count; 256 experts as the qwen35moe files have."""
    kern = pytest.importorskip("llmcore._kernels.moe")
    rng = np.random.default_rng(5)
    n, n_exp, k = 70, 256, 8
    lg = rng.standard_normal((n, n_exp)).astype(np.float32)
    lg[3, [7, 40, 200]] = lg[3].max() + 1.0   # a three-way tie on top: ids 7, 40, 200 in that order
    lg[4, :] = 0.5                            # all tied: the first k ids
    p = np.exp(lg.astype(np.float64) - lg.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = np.argsort(-p, 1, kind="stable")[:, :k]
    for norm in (False, True):
        ids = np.empty((n, k), np.int32)
        w = np.empty((n, k), np.float32)
        kern.route_softmax_topk(lg, k, norm, ids, w, 2)
        assert np.array_equal(ids, want)
        assert ids[3, :3].tolist() == [7, 40, 200] and ids[4].tolist() == list(range(k))
        pw = np.take_along_axis(p, want, 1)
        np.testing.assert_allclose(w, pw / pw.sum(1, keepdims=True) if norm else pw, rtol=2e-6, atol=1e-9)
        for a, b, nt in ((0, 1, 1), (5, 9, 2), (0, n, 1)):  # any batch, any thread count: the same bits
            i2, w2 = np.empty((b - a, k), np.int32), np.empty((b - a, k), np.float32)
            kern.route_softmax_topk(np.ascontiguousarray(lg[a:b]), k, norm, i2, w2, nt)
            assert np.array_equal(i2, ids[a:b]) and np.array_equal(w2, w[a:b])
    ids, w = M.route_softmax_norm(lg, k)  # the MoE block's router goes through it
    assert np.array_equal(ids, want)
    with pytest.raises(ValueError):
        kern.route_softmax_topk(lg, n_exp + 1, True, np.empty((n, n_exp + 1), np.int32),
                                np.empty((n, n_exp + 1), np.float32), 1)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_moe_f32_matches_reference(k):
    w = _weights()
    blk, deq = _block(w, k=k)
    assert blk.gate_up is not None  # gate and up fused
    for n in (1, 5, 40):
        x = _x(n)
        np.testing.assert_allclose(blk(x), ref_moe(x, deq, k), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("qt", [QT.F16, QT.Q8_0, QT.Q4_0])
def test_moe_quantized_matches_reference(qt):
    w = _weights(seed=2)
    blk, deq = _block(w, qt)
    x = _x(33, seed=4)
    ref = ref_moe(x, deq, 2)
    got = blk(x)
    # the kernels quantize activations to 8-bit blocks like llama.cpp: a few % off at most
    assert float(np.std(got - ref) / np.std(ref)) < (2e-3 if qt == QT.F16 else 0.03)


def test_gpt_oss_style_seam_biases_and_activation():
    """Router and activation as parameters (softmax over the top-k logits, clamped SwiGLU)
    and per-expert biases, the way gpt-oss uses the block."""
    w = _weights(seed=5)
    rng = np.random.default_rng(6)
    b = {"gate": rng.standard_normal((E, FF)).astype(np.float32) * 0.1,
         "up": rng.standard_normal((E, FF)).astype(np.float32) * 0.1,
         "down": rng.standard_normal((E, D)).astype(np.float32) * 0.1}
    rb = rng.standard_normal(E).astype(np.float32)

    def swiglu_oai(g, u, alpha=1.702, limit=7.0):
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
        return g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)

    blk, deq = _block(w, k=4, route="softmax_weight", act=lambda g, u: swiglu_oai(g, u).astype(np.float32),
                      gate_bias=b["gate"], up_bias=b["up"], down_bias=b["down"], router_bias=rb)
    x = _x(17, seed=7) * 3
    ref = ref_moe(x, deq, 4, gating="softmax_weight", act=swiglu_oai, biases=b, router_bias=rb)
    np.testing.assert_allclose(blk(x), ref, rtol=2e-4, atol=2e-4)


def test_unfused_gate_up_and_shared_expert():
    w = _weights(seed=8)
    # different types for gate and up: no fusion, separate grouped calls
    blk = M.MoE(_tensor("router", w["router"]), _tensor("gate", w["gate"]),
                _tensor("up", w["up"], QT.F16), _tensor("down", w["down"]), 2,
                shared=lambda x: 0.5 * x, shared_gate=np.full(D, 0.01, np.float32))
    assert blk.gate_up is None
    deq = dict(w, up=w["up"].astype(np.float16).astype(np.float32))
    x = _x(9, seed=9)
    sg = 1.0 / (1.0 + np.exp(-(x.astype(np.float64) @ np.full(D, 0.01))))
    ref = ref_moe(x, deq, 2) + sg[:, None] * 0.5 * x
    np.testing.assert_allclose(blk(x), ref, rtol=2e-4, atol=2e-4)


def test_unselected_experts_are_not_computed(monkeypatch):
    """Experts 4..7 hold NaN weights and the router bias keeps every token off them: any
    computation of an unselected expert (even multiplied by a zero weight) would show NaN."""
    w = _weights(seed=10)
    for name in ("gate", "up", "down"):
        w[name][4:] = np.nan
    rb = np.array([0, 0, 0, 0, -1e4, -1e4, -1e4, -1e4], np.float32)
    calls = []
    orig = quant.ExpertLinear.grouped

    def spy(self, x, expert_ids, offsets, out=None, rows=None):
        calls.append((list(map(int, expert_ids)), np.diff(np.asarray(offsets)).tolist()))
        return orig(self, x, expert_ids, offsets, out=out, rows=rows)

    monkeypatch.setattr(quant.ExpertLinear, "grouped", spy)
    stats = M.MoEStats()
    blk = M.MoE(_tensor("router", w["router"]), _tensor("gate", w["gate"]), _tensor("up", w["up"]),
                _tensor("down", w["down"]), 2, router_bias=rb, stats=stats)
    x = _x(1, seed=11)
    y = blk(x)
    assert np.isfinite(y).all()
    chosen = sorted(blk.route(x)[0][0].tolist())
    assert all(c < 4 for c in chosen)
    assert calls and all(ids == chosen and rows == [1, 1] for ids, rows in calls)  # 2 of 8 experts
    assert stats.experts_computed == 2 and stats.experts_skipped == 6 and stats.pairs == 2
    assert stats.per_expert.tolist() == [1 if e in chosen else 0 for e in range(E)]
    # a batch: computed = distinct experts chosen, skipped = the rest
    stats.reset()
    xb = _x(30, seed=12)
    yb = blk(xb)
    assert np.isfinite(yb).all()
    ids = blk.route(xb)[0]
    n_active = len(set(ids.reshape(-1).tolist()))
    assert stats.experts_computed == n_active and stats.experts_skipped == E - n_active
    assert stats.calls == 1 and stats.tokens == 30 and stats.pairs == 60
    assert stats.as_dict()["experts_computed"] == n_active


def test_bad_arguments():
    w = _weights()
    with pytest.raises(ValueError):
        M.MoE(_tensor("router", w["router"][:4]), _tensor("gate", w["gate"]), _tensor("up", w["up"]),
              _tensor("down", w["down"]), 2)
    with pytest.raises(ValueError):
        _block(w, k=E + 1)


@pytest.mark.parametrize("qt", [QT.F32, QT.F16, QT.Q8_0, QT.Q4_0, QT.Q4_1])
def test_expert_linear_grouped_equals_per_expert(qt):
    """grouped() (one kernel region for all experts where the kernel module has
    matmul_grouped) == one call per expert; empty groups and a non-zero first offset."""
    rng = np.random.default_rng(13)
    cols = 256
    w = rng.standard_normal((E, 48, cols)).astype(np.float32)
    lin = quant.ExpertLinear(_tensor("w", w, qt))
    x = rng.standard_normal((23, cols)).astype(np.float32)
    ids = [1, 3, 4, 6]
    offs = [2, 9, 9, 10, 23]  # expert 3 gets no rows; rows 0-1 are not part of the call
    y = np.full((23, 48), 7.0, np.float32)
    lin.grouped(x, ids, offs, out=y)
    assert np.all(y[:2] == 7.0)
    for e, a, b in zip(ids, offs[:-1], offs[1:]):
        if b > a:
            np.testing.assert_allclose(y[a:b], lin(x[a:b], e), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("k", [1, 3])
def test_combine_sums_each_tokens_rows_in_slot_order(k):
    """combine reads each token's k expert rows in place from the expert-sorted rows and sums
    them with the routing weights, slot by slot (the same bits for a token alone or in a batch)."""
    rng = np.random.default_rng(7)
    n, d = 70, 48
    ids = np.stack([rng.permutation(E)[:k] for _ in range(n)]).astype(np.int32)
    w = rng.random((n, k)).astype(np.float32)
    g = M.group_by_expert(ids, E)
    y = rng.standard_normal((n * k, d)).astype(np.float32)
    out = M.combine(y, g, w)
    unsorted = np.empty_like(y)
    unsorted[g.order] = y
    ref = np.zeros((n, d), np.float32)
    for j in range(k):
        ref = ref + w[:, j:j + 1] * unsorted.reshape(n, k, d)[:, j]
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    for t in (0, 33, 69):  # token t alone
        g1 = M.group_by_expert(ids[t:t + 1], E)
        y1 = unsorted.reshape(n, k, d)[t][np.asarray(g1.order)]
        np.testing.assert_array_equal(M.combine(np.ascontiguousarray(y1), g1, w[t:t + 1])[0], out[t])
