"""Plain NumPy reference for the gated-DeltaNet hybrids: qwen35, qwen35moe, qwen3next.

The test oracle for llmcore/models/qwen35.py, qwen3next.py and pyx/deltanet.pyx (see
docs/architectures.md for the recipe). float64, readable over fast, no cache:

    weights, meta = reference_archs.load_gguf(path)
    logits = forward(weights, meta, tokens)             # (n_tokens, n_vocab)
    out, conv_state, S = gated_delta_net(qkv, z, beta, alpha, dt_bias, ssm_a, conv_w, norm_w,
                                         head_map, eps, conv_state=None, S=None)

``emulate=True`` rounds each matmul's activations as llama.cpp does (reference_archs).
"""
from __future__ import annotations

import numpy as np

from reference_archs import _Ctx, attention, conv1d_causal, moe, rms_norm, silu, softplus


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def l2norm(x, eps):
    return x / np.maximum(np.sqrt((x * x).sum(-1, keepdims=True)), eps)


def gated_delta_net(qkv, z, beta, alpha, dt_bias, ssm_a, conv_w, norm_w, head_map, eps,
                    conv_state=None, S=None):
    """One sequence's tokens through a DeltaNet layer between its projections.

    qkv (n, 2*n_qk*D + n_v*D) [q | k | v] before the conv; z (n, n_v*D); beta, alpha (n, n_v)
    raw; conv_w (C, K) as stored (tap K-1 = current token); norm_w (D,); head_map (n_v,).
    Returns (out (n, n_v*D), conv_state (K-1, C), S (n_v, D, D) with S[h][i][j] = value dim i,
    key dim j)."""
    qkv = np.asarray(qkv, np.float64)
    n, C = qkv.shape
    n_v, D = len(head_map), len(norm_w)
    n_qk = (C - n_v * D) // (2 * D)
    K = conv_w.shape[1]
    if conv_state is None:
        conv_state = np.zeros((K - 1, C))
    if S is None:
        S = np.zeros((n_v, D, D))
    S = np.array(S, np.float64)
    xc = silu(conv1d_causal(qkv, np.asarray(conv_w, np.float64), state=np.asarray(conv_state, np.float64)))
    new_conv = np.concatenate([conv_state, qkv], 0)[n:] if K > 1 else conv_state
    q = l2norm(xc[:, :n_qk * D].reshape(n, n_qk, D), eps) / np.sqrt(D)
    k = l2norm(xc[:, n_qk * D:2 * n_qk * D].reshape(n, n_qk, D), eps)
    v = xc[:, 2 * n_qk * D:].reshape(n, n_v, D)
    g = np.exp(softplus(np.asarray(alpha, np.float64) + dt_bias) * ssm_a)
    b = sigmoid(np.asarray(beta, np.float64))
    o = np.zeros((n, n_v, D))
    for t in range(n):
        for h in range(n_v):
            m = head_map[h]
            S[h] *= g[t, h]
            d = b[t, h] * (v[t, h] - S[h] @ k[t, m])
            S[h] += np.outer(d, k[t, m])
            o[t, h] = S[h] @ q[t, m]
    out = rms_norm(o, norm_w, eps) * silu(np.asarray(z, np.float64).reshape(n, n_v, D))
    return out.reshape(n, n_v * D), new_conv, S


def head_map(arch, n_v, n_qk):
    """Value head -> q/k head: tiled (h % n_qk) in qwen35* files, grouped in qwen3next."""
    if arch == "qwen3next":
        return np.arange(n_v) // (n_v // n_qk)
    return np.arange(n_v) % n_qk


def rope_partial_neox(x, pos, n_rot, base):
    """NEOX rotation of the first n_rot dims of each head; the rest pass through."""
    half = n_rot // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    ang = np.asarray(pos, np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:n_rot]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[..., n_rot:]], -1)


def _deltanet_layer(c, p, h, eps):
    W = c.W
    n = h.shape[0]
    D, n_qk, n_v = c.g("ssm.state_size"), c.g("ssm.group_count"), c.g("ssm.time_step_rank")
    r = n_v // n_qk
    if p + "ssm_in.weight" in W:  # legacy qwen3next: per q/k head [q | k | v (r heads) | z (r heads)]
        mixed = c.mm(h, p + "ssm_in.weight").reshape(n, n_qk, 2 * D + 2 * r * D)
        qkv = np.concatenate([mixed[:, :, :D].reshape(n, -1), mixed[:, :, D:2 * D].reshape(n, -1),
                              mixed[:, :, 2 * D:(2 + r) * D].reshape(n, -1)], 1)
        z = mixed[:, :, (2 + r) * D:].reshape(n, -1)
    else:
        qkv, z = c.mm(h, p + "attn_qkv.weight"), c.mm(h, p + "attn_gate.weight")
    if p + "ssm_ba.weight" in W:  # qwen3next: per q/k head [beta (r) | alpha (r)]
        ba = c.mm(h, p + "ssm_ba.weight").reshape(n, n_qk, 2 * r)
        beta, alpha = ba[:, :, :r].reshape(n, n_v), ba[:, :, r:].reshape(n, n_v)
    else:
        beta, alpha = c.mm(h, p + "ssm_beta.weight"), c.mm(h, p + "ssm_alpha.weight")
    out, _, _ = gated_delta_net(qkv, z, beta, alpha, W[p + "ssm_dt.bias"], W[p + "ssm_a"],
                                W[p + "ssm_conv1d.weight"], W[p + "ssm_norm.weight"],
                                head_map(c.arch, n_v, n_qk), eps)
    return c.mm(out, p + "ssm_out.weight")


def _attention_layer(c, p, h, eps, pos):
    W = c.W
    n = h.shape[0]
    H, Hkv, hd = c.g("attention.head_count"), c.g("attention.head_count_kv"), c.g("attention.key_length")
    qg = c.mm(h, p + "attn_q.weight").reshape(n, H, 2 * hd)  # per head [query | gate]
    q, gate = qg[..., :hd], qg[..., hd:].reshape(n, H * hd)
    k = c.mm(h, p + "attn_k.weight").reshape(n, Hkv, hd)
    v = c.mm(h, p + "attn_v.weight").reshape(n, Hkv, hd)
    n_rot, base = c.g("rope.dimension_count"), c.g("rope.freq_base")
    q = rope_partial_neox(rms_norm(q, W[p + "attn_q_norm.weight"], eps), pos, n_rot, base)
    k = rope_partial_neox(rms_norm(k, W[p + "attn_k_norm.weight"], eps), pos, n_rot, base)
    o = attention(c, q, k, v, 1.0 / np.sqrt(hd)) * sigmoid(gate)
    return c.mm(o, p + "attn_output.weight")


def _ffn(c, p, h):
    W = c.W
    if p + "ffn_gate_inp.weight" not in W:  # dense SwiGLU (qwen35)
        a = silu(c.mm(h, p + "ffn_gate.weight")) * c.mm(h, p + "ffn_up.weight")
        return c.mm(a, p + "ffn_down.weight")
    out = moe(c, h, p, c.g("expert_used_count"), gating="softmax", act="silu", norm_w=True)
    a = silu(c.mm(h, p + "ffn_gate_shexp.weight")) * c.mm(h, p + "ffn_up_shexp.weight")
    shared = c.mm(a, p + "ffn_down_shexp.weight")
    return out + shared * sigmoid(h @ W[p + "ffn_gate_inp_shexp.weight"].astype(np.float64))[:, None]


def forward(weights, meta, tokens, *, emulate=False, last_only=False):
    """Logits (n, n_vocab) (or (1, n_vocab) with last_only) of a whole prompt."""
    c = _Ctx(weights, meta, emulate)
    W = weights
    nl = c.g("block_count") - int(meta.get(f"{c.arch}.nextn_predict_layers", 0) or 0)
    eps = c.g("attention.layer_norm_rms_epsilon")
    interval = c.g("full_attention_interval", 4)
    pos = np.arange(len(tokens))
    for name in [k for k in W if k.endswith("ffn_gate_up_exps.weight")]:  # fused: [gate | up]
        ff = W[name].shape[1] // 2
        for part, sl in (("gate", slice(0, ff)), ("up", slice(ff, None))):
            W[name.replace("gate_up", part)] = W[name][:, sl]
            W.types[name.replace("gate_up", part)] = W.types.get(name)
    x = W["token_embd.weight"][tokens].astype(np.float64)
    for il in range(nl):
        p = f"blk.{il}."
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        if (il + 1) % interval == 0:
            x = x + _attention_layer(c, p, h, eps, pos)
        else:
            x = x + _deltanet_layer(c, p, h, eps)
        x = x + _ffn(c, p, rms_norm(x, W[p + "post_attention_norm.weight"], eps))
    return c.logits(x, "output_norm.weight", eps, last_only)
