"""Plain NumPy reference forwards for gemma3, gpt-oss, qwen3moe, mamba, mamba2 and lfm2.

The test oracle for the architecture ports (see docs/architectures.md for the recipes).
No cache, no batching: a whole prompt in, logits out.

    weights, meta = load_gguf(path)                   # every tensor dequantized, float32
    logits = forward(weights, meta, tokens)           # (n_tokens, n_vocab), dispatch on arch
    logits = forward_gemma3(weights, meta, tokens, last_only=True)   # (1, n_vocab)

`weights` is a dict name -> float32 array in NumPy order (a GGUF ``ne = [n_in, n_out]``
matrix has shape ``(n_out, n_in)``; 3-D expert tensors are ``(n_expert, n_out, n_in)``).
It is a `RefWeights` (a dict with ``.types``: name -> GGML type), so that
``emulate=True`` can reproduce llama.cpp's rounding of activations before each matmul
(Q8_0 blocks of 32 for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/MXFP4/IQ4_NL weights, Q8_K blocks of 256
for K-quants and IQ4_XS, f16 for F16 weights) and of the F16 KV cache (q, k, v and the softmax
probabilities rounded to f16). With ``emulate=False`` everything is float math
(float64 accumulation); that lands within ~1e-3 of llama.cpp on F16/F32 models and
1.5-5 % on quantized ones; ``emulate=True`` gets much closer on quantized ones.

`meta` is the GGUF metadata (key -> python value), tokenizer keys dropped.

Plain functions, float64 compute, readable over fast: a 327-token prompt on the tiny
models takes well under a second per layer.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

# llama.cpp quantizes the activations to this before a matmul with a weight of that type
_Q8_0_ACT = {QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.MXFP4, QT.IQ4_NL}
_Q8_K_ACT = {QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS}

# gpt-oss SwiGLU-OAI constants (ggml_swiglu_oai(ctx, gate, up, alpha, limit))
GPT_OSS_SWIGLU_ALPHA = 1.702
GPT_OSS_SWIGLU_LIMIT = 7.0


class RefWeights(dict):
    """name -> float32 ndarray, plus ``types``: name -> GGML type of the stored tensor."""

    types: dict[str, int]

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.types = {}


def load_gguf(path: str | Path, names=None) -> tuple[RefWeights, dict]:
    """Dequantize every tensor of a GGUF (gguf.quants.dequantize) -> (weights, meta).

    ``names``: optional predicate name -> bool to load only some tensors. The header is
    parsed here (gguf.GGUFReader spends seconds on the 49152-entry tokenizer arrays)."""
    meta, infos, data_start = _read_header(str(path))
    mm = np.memmap(str(path), dtype=np.uint8, mode="r")
    W = RefWeights()
    for name, ne, qt, off in infos:
        if names is not None and not names(name):
            continue
        block, tsize = gguf.GGML_QUANT_SIZES[qt]
        n_el = int(np.prod(ne))
        nbytes = n_el // block * tsize
        raw = mm[data_start + off:data_start + off + nbytes]
        shape = list(reversed(ne))
        if qt == QT.F32:
            arr = raw.view(np.float32)
        elif qt == QT.F16:
            arr = raw.view(np.float16)
        else:
            arr = raw.reshape(-1, ne[0] // block * tsize)
        W[name] = np.ascontiguousarray(gguf.quants.dequantize(arr, qt).reshape(shape), dtype=np.float32)
        W.types[name] = qt
    return W, meta


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}


def _read_header(path):
    import struct

    with open(path, "rb") as f:
        buf = f.read(64 << 20)  # metadata + tensor infos; tokenizer arrays are a few MB
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        v = buf[pos:pos + n].decode("utf-8", errors="replace")
        pos += n
        return v

    def value(t, keep):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            if not keep:  # skip quickly
                if et == 8:
                    for _ in range(n):
                        pos_skip = take("<Q")
                        _advance(pos_skip)
                    return None
                if et == 9:
                    return [value(et, False) for _ in range(n)]
                _advance(n * struct.calcsize(_SCALAR[et]))
                return None
            return [value(et, True) for _ in range(n)]
        return take(_SCALAR[t])

    def _advance(n):
        nonlocal pos
        pos += n

    if buf[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        t = take("<I")
        keep = not key.startswith("tokenizer.")
        v = value(t, keep)
        if keep:
            meta[key] = v
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        qt = QT(take("<I"))
        off = take("<Q")
        infos.append((name, ne, qt, off))
    align = int(meta.get("general.alignment", 32))
    data_start = (pos + align - 1) // align * align
    return meta, infos, data_start


# ----------------------------------------------------------------------------------------
# rounding emulation (llama.cpp CPU)
# ----------------------------------------------------------------------------------------
def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


def act_q8_0(x):
    """quantize_row_q8_0 then dequantize: blocks of 32, d = amax/127 (stored f16)."""
    sh = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(b).max(1, keepdims=True)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * idv)
    return (q * f16(d)).reshape(sh)


def act_q8_k(x):
    """quantize_row_q8_K then dequantize: blocks of 256, scale from the signed max."""
    sh = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 256)
    idx = np.abs(b).argmax(1)
    mx = b[np.arange(len(b)), idx][:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0)).astype(np.float32)
        q = np.minimum(np.rint(iscale * b), 127)
        d = np.where(mx != 0, np.float32(1.0) / iscale, np.float32(0)).astype(np.float32)
    return (q * d.astype(np.float64)).reshape(sh)


class _Ctx:
    """Shared per-forward helpers: metadata access, matmul with optional act rounding."""

    def __init__(self, W, meta, emulate):
        self.W, self.meta, self.emulate = W, meta, emulate
        self.arch = meta["general.architecture"]
        self.types = getattr(W, "types", {})

    def g(self, key, default=None):
        v = self.meta.get(f"{self.arch}.{key}", default)
        if v is None:
            raise KeyError(f"{self.arch}.{key}")
        return v

    def act(self, x, name):
        if not self.emulate:
            return x
        t = self.types.get(name)
        if t in _Q8_0_ACT and x.shape[-1] % 32 == 0:
            return act_q8_0(x)
        if t in _Q8_K_ACT and x.shape[-1] % 256 == 0:
            return act_q8_k(x)
        if t == QT.F16:
            return f16(x)
        return x

    def mm(self, x, name, bias=None):
        """x (n, in) @ W[name].T (+ W[bias])."""
        # float32 matmul (f32 accumulation like ggml; no float64 copy of a 262144-row lm_head)
        y = (np.asarray(self.act(x, name), dtype=np.float32) @ self.W[name].T).astype(np.float64)
        if bias is not None and bias in self.W:
            y = y + self.W[bias]
        return y

    def kv(self, a):
        return f16(a) if self.emulate else a

    def logits(self, x, norm_name, eps, last_only):
        if last_only:
            x = x[-1:]
        h = rms_norm(x, self.W[norm_name], eps)
        name = "output.weight" if "output.weight" in self.W else "token_embd.weight"
        return self.mm(h, name).astype(np.float32)


# ----------------------------------------------------------------------------------------
# building blocks
# ----------------------------------------------------------------------------------------
def rms_norm(x, w, eps):
    x = np.asarray(x, dtype=np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * w if w is not None else y


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    """ggml_softplus: x > 20 -> x, else log1p(exp(x))."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x)))


def gelu_ggml(x, emulate):
    """ggml's GELU (tanh form); with ``emulate`` the CPU lookup table: the input rounded to
    f16, gelu computed, result rounded to f16 (x <= -10 -> 0, x >= 10 -> x)."""
    if not emulate:
        return gelu_tanh(x)
    y = f16(gelu_tanh(f16(x)))
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))


def rope_neox(x, pos, base):
    """NEOX rotation (pairs (i, i + d/2)) of x (n, heads, d) at positions pos (n,)."""
    d = x.shape[-1]
    half = d // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / d)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def attention(ctx, q, k, v, scale, window=0, sinks=None, q_prescaled=False):
    """Causal GQA attention. q (n, H, d), k/v (n, Hkv, d) -> (n, H*dv).

    ``window`` > 0: standard sliding window, query i sees key j iff 0 <= i - j < window.
    ``sinks`` (H,): one extra logit per head in the softmax denominator (gpt-oss).
    ``q_prescaled``: the scale was already folded into q (gemma3), softmax scale 1."""
    n, H, _ = q.shape
    Hkv = k.shape[1]
    q, k, v = ctx.kv(q), ctx.kv(k), ctx.kv(v)
    rep = H // Hkv
    k = np.repeat(k, rep, axis=1)
    v = np.repeat(v, rep, axis=1)
    s = np.einsum("thd,shd->hts", q, k)
    if not q_prescaled:
        s = s * scale
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    visible = j <= i
    if window and window > 0:
        visible &= (i - j) < window
    s = np.where(visible[None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, dtype=np.float64)[:, None, None])
    p = np.exp(s - m)
    den = p.sum(-1, keepdims=True)
    if sinks is not None:
        den = den + np.exp(np.asarray(sinks, dtype=np.float64)[:, None, None] - m)
    p = ctx.kv(p / den)
    o = np.einsum("hts,shd->thd", p, v)
    return o.reshape(n, -1)


def conv1d_causal(x, w, bias=None, state=None):
    """Depthwise causal conv: x (n, C), w (C, K) -> (n, C); w[:, K-1] hits the current token.

    ``state`` (K-1, C): the previous K-1 inputs (oldest first), zeros at start."""
    n, C = x.shape
    K = w.shape[1]
    if state is None:
        state = np.zeros((K - 1, C))
    xx = np.concatenate([state, x], 0)
    y = np.zeros((n, C))
    for k in range(K):
        y += xx[k:k + n] * w[:, k]
    if bias is not None:
        y += bias
    return y


def moe(ctx, h, p, n_expert_used, *, gating, act, norm_w, biases=False):
    """Top-k MoE FFN on h (n, d).

    gating 'softmax': probs = softmax(router logits); pick top-k probs; weights = those
      probs, renormalised to sum 1 iff ``norm_w``.
    gating 'softmax_weight' (gpt-oss): pick top-k router logits; weights = softmax over the
      k selected logits.
    act 'silu': silu(gate) * up; 'swiglu_oai': gpt-oss clamped SwiGLU (see docs)."""
    W = ctx.W
    lg = ctx.mm(h, p + "ffn_gate_inp.weight", p + "ffn_gate_inp.bias" if biases else None)
    n = h.shape[0]
    out = np.zeros((n, W[p + "ffn_down_exps.weight"].shape[1]))
    G, U, D = W[p + "ffn_gate_exps.weight"], W[p + "ffn_up_exps.weight"], W[p + "ffn_down_exps.weight"]
    tg, tu, td = (ctx.types.get(p + s) for s in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"))
    for t in range(n):
        if gating == "softmax":
            pr = np.exp(lg[t] - lg[t].max())
            pr /= pr.sum()
            sel = np.argsort(-pr, kind="stable")[:n_expert_used]
            w = pr[sel]
            if norm_w:
                w = w / w.sum()
        elif gating == "softmax_weight":
            sel = np.argsort(-lg[t], kind="stable")[:n_expert_used]
            w = np.exp(lg[t, sel] - lg[t, sel].max())
            w /= w.sum()
        else:
            raise ValueError(gating)
        ht = h[t:t + 1]
        for e, we in zip(sel, w):
            hg = _mm32(_act_t(ctx, ht, tg), G[e])
            hu = _mm32(_act_t(ctx, ht, tu), U[e])
            if biases:
                hg = hg + W[p + "ffn_gate_exps.bias"][e]
                hu = hu + W[p + "ffn_up_exps.bias"][e]
            if act == "silu":
                a = silu(hg) * hu
            elif act == "swiglu_oai":
                a = swiglu_oai(hg, hu)
            else:
                raise ValueError(act)
            y = _mm32(_act_t(ctx, a, td), D[e])
            if biases:
                y = y + W[p + "ffn_down_exps.bias"][e]
            out[t] += we * y[0]
    return out


def _mm32(x, w):
    return (np.asarray(x, dtype=np.float32) @ w.T).astype(np.float64)


def _act_t(ctx, x, t):
    if not ctx.emulate:
        return x
    if t in _Q8_0_ACT:
        return act_q8_0(x)
    if t in _Q8_K_ACT:
        return act_q8_k(x)
    if t == QT.F16:
        return f16(x)
    return x


def swiglu_oai(gate, up, alpha=GPT_OSS_SWIGLU_ALPHA, limit=GPT_OSS_SWIGLU_LIMIT):
    """gpt-oss: x = min(gate, limit); y = clamp(up, -limit, limit); x*sigmoid(alpha*x)*(y+1)."""
    x = np.minimum(gate, limit)
    y = np.clip(up, -limit, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (y + 1.0)


# ----------------------------------------------------------------------------------------
# architectures
# ----------------------------------------------------------------------------------------
def forward_gemma3(weights, meta, tokens, *, emulate=False, last_only=False):
    c = _Ctx(weights, meta, emulate)
    W = weights
    n_embd, nl = c.g("embedding_length"), c.g("block_count")
    H, Hkv = c.g("attention.head_count"), c.g("attention.head_count_kv")
    hd = c.g("attention.key_length")
    eps = c.g("attention.layer_norm_rms_epsilon")
    base_global = c.g("rope.freq_base", 1000000.0)
    base_local = 10000.0
    window = c.g("attention.sliding_window")
    pattern = 6
    n = len(tokens)
    pos = np.arange(n)
    x = W["token_embd.weight"][tokens].astype(np.float64) * math.sqrt(n_embd)
    for il in range(nl):
        p = f"blk.{il}."
        local = il % pattern < pattern - 1
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        q = c.mm(h, p + "attn_q.weight").reshape(n, H, hd)
        k = c.mm(h, p + "attn_k.weight").reshape(n, Hkv, hd)
        v = c.mm(h, p + "attn_v.weight").reshape(n, Hkv, -1)
        base = base_local if local else base_global
        q = rope_neox(rms_norm(q, W[p + "attn_q_norm.weight"], eps), pos, base)
        k = rope_neox(rms_norm(k, W[p + "attn_k_norm.weight"], eps), pos, base)
        q = q * (1.0 / math.sqrt(hd))
        o = attention(c, q, k, v, 1.0, window=window if local else 0, q_prescaled=True)
        o = c.mm(o, p + "attn_output.weight")
        o = rms_norm(o, W[p + "post_attention_norm.weight"], eps)
        x = x + o
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        a = gelu_ggml(c.mm(h, p + "ffn_gate.weight"), emulate) * c.mm(h, p + "ffn_up.weight")
        f = c.mm(a, p + "ffn_down.weight")
        x = x + rms_norm(f, W[p + "post_ffw_norm.weight"], eps)
    return c.logits(x, "output_norm.weight", eps, last_only)


def forward_gpt_oss(weights, meta, tokens, *, emulate=False, last_only=False):
    c = _Ctx(weights, meta, emulate)
    W = weights
    nl = c.g("block_count")
    H, Hkv = c.g("attention.head_count"), c.g("attention.head_count_kv")
    hd = c.g("attention.key_length")
    eps = c.g("attention.layer_norm_rms_epsilon")
    base = c.g("rope.freq_base")
    window = c.g("attention.sliding_window")
    k_used = c.g("expert_used_count")
    n = len(tokens)
    pos = np.arange(n)
    x = W["token_embd.weight"][tokens].astype(np.float64)
    for il in range(nl):
        p = f"blk.{il}."
        local = il % 2 == 0
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        q = c.mm(h, p + "attn_q.weight", p + "attn_q.bias").reshape(n, H, hd)
        k = c.mm(h, p + "attn_k.weight", p + "attn_k.bias").reshape(n, Hkv, hd)
        v = c.mm(h, p + "attn_v.weight", p + "attn_v.bias").reshape(n, Hkv, -1)
        q = rope_neox(q, pos, base)
        k = rope_neox(k, pos, base)
        o = attention(c, q, k, v, 1.0 / math.sqrt(hd), window=window if local else 0,
                      sinks=W[p + "attn_sinks.weight"])
        x = x + c.mm(o, p + "attn_output.weight", p + "attn_output.bias")
        h = rms_norm(x, W[p + "post_attention_norm.weight"], eps)
        x = x + moe(c, h, p, k_used, gating="softmax_weight", act="swiglu_oai", norm_w=False, biases=True)
    return c.logits(x, "output_norm.weight", eps, last_only)


def forward_qwen3moe(weights, meta, tokens, *, emulate=False, last_only=False):
    c = _Ctx(weights, meta, emulate)
    W = weights
    nl = c.g("block_count")
    H, Hkv = c.g("attention.head_count"), c.g("attention.head_count_kv")
    hd = c.g("attention.key_length")
    eps = c.g("attention.layer_norm_rms_epsilon")
    base = c.g("rope.freq_base")
    k_used = c.g("expert_used_count")
    n = len(tokens)
    pos = np.arange(n)
    x = W["token_embd.weight"][tokens].astype(np.float64)
    for il in range(nl):
        p = f"blk.{il}."
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        q = c.mm(h, p + "attn_q.weight").reshape(n, H, hd)
        k = c.mm(h, p + "attn_k.weight").reshape(n, Hkv, hd)
        v = c.mm(h, p + "attn_v.weight").reshape(n, Hkv, -1)
        q = rope_neox(rms_norm(q, W[p + "attn_q_norm.weight"], eps), pos, base)
        k = rope_neox(rms_norm(k, W[p + "attn_k_norm.weight"], eps), pos, base)
        o = attention(c, q, k, v, 1.0 / math.sqrt(hd))
        x = x + c.mm(o, p + "attn_output.weight")
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        x = x + moe(c, h, p, k_used, gating="softmax", act="silu", norm_w=True)
    return c.logits(x, "output_norm.weight", eps, last_only)


def mamba_scan_ref(state, x, dt, A, B, C):
    """Mamba-1 selective scan over n tokens, updating ``state`` (d_inner, d_state) in place.

    x, dt (n, d_inner) (dt already + bias, before softplus); A (d_inner, d_state);
    B, C (n, d_state) -> y (n, d_inner) (without the D skip)."""
    n = x.shape[0]
    y = np.zeros_like(x, dtype=np.float64)
    for t in range(n):
        dts = softplus(dt[t])                               # (d_inner,)
        dA = np.exp(dts[:, None] * A)                       # (d_inner, d_state)
        state[:] = state * dA + B[t][None, :] * (x[t] * dts)[:, None]
        y[t] = state @ C[t]
    return y


def mamba2_scan_ref(state, x, dt, A, B, C):
    """Mamba-2 SSD scan over n tokens, ``state`` (n_head, head_dim, d_state) in place.

    x (n, n_head, head_dim); dt (n, n_head) (+ bias, before softplus); A (n_head,);
    B, C (n, n_group, d_state); head h uses group h // (n_head // n_group).
    -> y (n, n_head, head_dim) (without the D skip)."""
    n, nh, _ = x.shape
    ng = B.shape[1]
    gidx = np.arange(nh) // (nh // ng)
    y = np.zeros_like(x, dtype=np.float64)
    for t in range(n):
        dts = softplus(dt[t])                               # (nh,)
        dA = np.exp(dts * A)                                # (nh,)
        Bt, Ct = B[t][gidx], C[t][gidx]                     # (nh, ds)
        state[:] = state * dA[:, None, None] + (x[t] * dts[:, None])[:, :, None] * Bt[:, None, :]
        y[t] = np.einsum("hps,hs->hp", state, Ct)
    return y


def forward_mamba(weights, meta, tokens, *, emulate=False, last_only=False):
    c = _Ctx(weights, meta, emulate)
    W = weights
    nl = c.g("block_count")
    d_inner, d_state = c.g("ssm.inner_size"), c.g("ssm.state_size")
    dt_rank = c.g("ssm.time_step_rank")
    dt_b_c_rms = bool(c.meta.get(f"{c.arch}.ssm.dt_b_c_rms", False))
    eps = c.g("attention.layer_norm_rms_epsilon")
    x = W["token_embd.weight"][tokens].astype(np.float64)
    for il in range(nl):
        p = f"blk.{il}."
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        xz = c.mm(h, p + "ssm_in.weight")
        xs, z = xz[:, :d_inner], xz[:, d_inner:]
        xs = silu(conv1d_causal(xs, W[p + "ssm_conv1d.weight"], W[p + "ssm_conv1d.bias"]))
        dbc = c.mm(xs, p + "ssm_x.weight")
        dt, B, C = dbc[:, :dt_rank], dbc[:, dt_rank:dt_rank + d_state], dbc[:, dt_rank + d_state:]
        if dt_b_c_rms:
            dt, B, C = rms_norm(dt, None, eps), rms_norm(B, None, eps), rms_norm(C, None, eps)
        dt = c.mm(dt, p + "ssm_dt.weight", p + "ssm_dt.bias")
        state = np.zeros((d_inner, d_state))
        y = mamba_scan_ref(state, xs, dt, W[p + "ssm_a"].astype(np.float64), B, C)
        y = y + xs * W[p + "ssm_d"]
        y = y * silu(z)
        x = x + c.mm(y, p + "ssm_out.weight")
    return c.logits(x, "output_norm.weight", eps, last_only)


def forward_mamba2(weights, meta, tokens, *, emulate=False, last_only=False):
    c = _Ctx(weights, meta, emulate)
    W = weights
    nl = c.g("block_count")
    d_inner, d_state = c.g("ssm.inner_size"), c.g("ssm.state_size")
    nh, ng = c.g("ssm.time_step_rank"), c.g("ssm.group_count")
    hdim = d_inner // nh
    eps = c.g("attention.layer_norm_rms_epsilon")
    n = len(tokens)
    x = W["token_embd.weight"][tokens].astype(np.float64)
    for il in range(nl):
        p = f"blk.{il}."
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        zxbcdt = c.mm(h, p + "ssm_in.weight")
        conv_dim = d_inner + 2 * ng * d_state
        z = zxbcdt[:, :d_inner]
        xbc = zxbcdt[:, d_inner:d_inner + conv_dim]
        dt = zxbcdt[:, d_inner + conv_dim:] + W[p + "ssm_dt.bias"]
        xbc = silu(conv1d_causal(xbc, W[p + "ssm_conv1d.weight"], W[p + "ssm_conv1d.bias"]))
        xs = xbc[:, :d_inner].reshape(n, nh, hdim)
        B = xbc[:, d_inner:d_inner + ng * d_state].reshape(n, ng, d_state)
        C = xbc[:, d_inner + ng * d_state:].reshape(n, ng, d_state)
        state = np.zeros((nh, hdim, d_state))
        A = W[p + "ssm_a"].reshape(nh).astype(np.float64)
        y = mamba2_scan_ref(state, xs, dt, A, B, C)
        y = y + xs * W[p + "ssm_d"].reshape(nh)[None, :, None]
        y = y.reshape(n, d_inner) * silu(z)
        y = rms_norm(y.reshape(n, ng, d_inner // ng), W[p + "ssm_norm.weight"].reshape(ng, -1), eps)
        x = x + c.mm(y.reshape(n, d_inner), p + "ssm_out.weight")
    return c.logits(x, "output_norm.weight", eps, last_only)


def forward_lfm2(weights, meta, tokens, *, emulate=False, last_only=False):
    c = _Ctx(weights, meta, emulate)
    W = weights
    nl = c.g("block_count")
    n_embd = c.g("embedding_length")
    H = c.g("attention.head_count")
    kv_per_layer = c.g("attention.head_count_kv")
    if isinstance(kv_per_layer, int):
        kv_per_layer = [kv_per_layer] * nl
    hd = n_embd // H
    eps = c.g("attention.layer_norm_rms_epsilon")
    base = c.g("rope.freq_base")
    n = len(tokens)
    pos = np.arange(n)
    x = W["token_embd.weight"][tokens].astype(np.float64)
    for il in range(nl):
        p = f"blk.{il}."
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        if kv_per_layer[il] > 0:
            Hkv = kv_per_layer[il]
            q = c.mm(h, p + "attn_q.weight").reshape(n, H, hd)
            k = c.mm(h, p + "attn_k.weight").reshape(n, Hkv, hd)
            v = c.mm(h, p + "attn_v.weight").reshape(n, Hkv, hd)
            q = rope_neox(rms_norm(q, W[p + "attn_q_norm.weight"], eps), pos, base)
            k = rope_neox(rms_norm(k, W[p + "attn_k_norm.weight"], eps), pos, base)
            o = attention(c, q, k, v, 1.0 / math.sqrt(hd))
            o = c.mm(o, p + "attn_output.weight")
        else:
            bcx = c.mm(h, p + "shortconv.in_proj.weight")
            b, cc, xx = bcx[:, :n_embd], bcx[:, n_embd:2 * n_embd], bcx[:, 2 * n_embd:]
            conv = conv1d_causal(b * xx, W[p + "shortconv.conv.weight"])
            o = c.mm(cc * conv, p + "shortconv.out_proj.weight")
        x = x + o
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        a = silu(c.mm(h, p + "ffn_gate.weight")) * c.mm(h, p + "ffn_up.weight")
        x = x + c.mm(a, p + "ffn_down.weight")
    return c.logits(x, "token_embd_norm.weight", eps, last_only)


FORWARDS = {
    "gemma3": forward_gemma3,
    "gpt-oss": forward_gpt_oss,
    "qwen3moe": forward_qwen3moe,
    "mamba": forward_mamba,
    "mamba2": forward_mamba2,
    "lfm2": forward_lfm2,
}


def forward(weights, meta, tokens, **kw):
    """Dispatch on meta['general.architecture']."""
    return FORWARDS[meta["general.architecture"]](weights, meta, tokens, **kw)
