#!/usr/bin/env python3
"""Qwen3.6-35B-A3B-shaped MoE hybrid: prefill and decode, one and several streams, llmcore vs
llama.cpp in the same run, with the experts computed vs skipped.

    PYTHONPATH=. python bench/qwen35moe.py [--layers 4] [--vocab 32768] [--pp 512] [--tg 32]
        [--streams 8] [--ctx 64] [--steps 16] [--reps 3] [-t 2] [--mix iq4_xs] [--keep PATH]
        [--no-peer]

The model is written at run time (random weights, a few GB, not committed) with the real
model's layer shapes but only --layers layers (every 4th full attention, the rest gated
DeltaNet), in a Q4_K / Q5_K / Q6_K / Q8_0 mix like the Unsloth UD-Q4_K_XL file's:

    n_embd 2048; 256 experts, 8 used, expert FFN 512, shared expert FFN 512;
    DeltaNet: 32 value heads x 128, 16 q/k heads, conv kernel 4;
    attention: 16 heads / 2 KV heads x 256, rope on 64 dims (sections 11/11/10), base 1e7.

| tensors | type |
|---|---|
| ffn_gate_exps, ffn_up_exps | Q4_K |
| ffn_down_exps | Q5_K |
| ffn_{gate,up,down}_shexp, attn_k, attn_v | Q8_0 |
| attn_qkv, attn_gate (DeltaNet), attn_q | Q5_K |
| ssm_out, attn_output, output | Q6_K |
| token_embd | Q4_K |
| norms, ssm_conv1d, ssm_a, ssm_dt, ssm_alpha, ssm_beta, routers | F32 |

``--mix iq4_xs``: every quantized tensor IQ4_XS instead (an IQ4_XS file's mix).

The vocabulary is cut to --vocab (the real one is 248320) so that the output head weighs
on a few layers what it weighs on the real 40 (a 248320-row head would be most of the
work of a 4-layer model). Weights are random valid blocks (random quants, scales sized for
activations O(1)): speed only, the outputs mean nothing.

Measured (medians of --reps, engines alternating, llama.cpp in a child process with its
own OpenMP settings and ``use_extra_bufts = False`` as in every benchmark here):
prompt processing of --pp tokens from empty; --tg generated tokens after 16 prompt tokens;
--streams sequences of --ctx prompt tokens advanced together for --steps decode steps
(aggregate t/s; prefill not timed). The experts line counts, per MoE layer call, the
distinct experts computed and those skipped (no token chose them). ``--clock cpu`` times
each engine by its process's CPU time instead of the wall clock: with ``-t 1`` that is the
compute alone, a fair comparison on a machine other work shares (llama.cpp's threads spin
at barriers, so with more threads its CPU time counts the spinning).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # llmcore from this checkout

from _peer_llamacpp import available  # noqa: E402

SHAPES = dict(n_embd=2048, n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512,
              n_v=32, n_qk=16, d_state=128, d_conv=4, n_head=16, n_head_kv=2, head_dim=256,
              n_rot=64, sections=[11, 11, 10, 0], rope_base=1e7, interval=4)


# ---- the model file -------------------------------------------------------------------------

MIXES = ("ud-q4_k_xl", "iq4_xs")


def _types(mix: str = "ud-q4_k_xl"):
    from gguf import GGMLQuantizationType as QT

    t = dict(exp_gate_up=QT.Q4_K, exp_down=QT.Q5_K, shexp=QT.Q8_0, dn_in=QT.Q5_K, attn_q=QT.Q5_K,
             attn_kv=QT.Q8_0, out_proj=QT.Q6_K, output=QT.Q6_K, embd=QT.Q4_K)
    return {k: QT.IQ4_XS for k in t} if mix == "iq4_xs" else t


def random_blocks(rng, qt, shape, std: float) -> np.ndarray:
    """Random valid ggml blocks for a weight of `shape` (..., cols) with values of roughly
    `std`: random quants and sub-block scales, the super-block scales set to match."""
    import gguf
    from gguf import GGMLQuantizationType as QT

    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    *lead, cols = shape
    raw = rng.integers(0, 256, size=(*lead, cols // bs, ts), dtype=np.uint8)

    def put(off, val):
        raw[..., off:off + 2] = np.full(raw.shape[:-1], val, np.float16)[..., None].view(np.uint8)

    if qt == QT.Q8_0:  # d, 32 x int8
        put(0, std / 74)
    elif qt == QT.Q4_K:  # d, dmin, 12 scale bytes, 4-bit quants: w = d*sc*q - dmin*m
        put(0, std / 257)
        put(2, 7.5 * std / 257)
    elif qt == QT.Q5_K:  # d, dmin, scales, high bits, 4-bit quants
        put(0, std / 524)
        put(2, 15.5 * std / 524)
    elif qt == QT.Q6_K:  # ql, qh, 16 x int8 scales, d: w = d*scale*(q-32)
        put(ts - 2, std / 1369)
    elif qt == QT.IQ4_XS:  # d, 6-bit sub-block scales, 4-bit table indices: w = d*(ls-32)*kvalue
        put(0, std / 1100)
    else:
        raise ValueError(f"no random blocks for {qt.name}")
    return raw.reshape(*lead, cols // bs * ts)


def add_spm_vocab(w, n_vocab: int) -> None:
    """A llama-style vocabulary of n_vocab placeholder tokens (llama.cpp wants one; token ids
    are fed directly, nothing is tokenized)."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"\u2581t{i}" for i in range(n_vocab - len(toks))]
    types = [2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def build_model(path: str, n_layer: int, n_vocab: int, seed: int = 0, mix: str = "ud-q4_k_xl") -> str:
    import gguf

    c, T = SHAPES, _types(mix)
    rng = np.random.default_rng(seed)
    d, E, ff, fs = c["n_embd"], c["n_expert"], c["n_ff_exp"], c["n_ff_shexp"]
    D, n_qk, n_v, K = c["d_state"], c["n_qk"], c["n_v"], c["d_conv"]
    H, Hkv, hd = c["n_head"], c["n_head_kv"], c["head_dim"]
    w = gguf.GGUFWriter(path, "qwen35moe")
    w.add_name("qwen35moe-35b-a3b-shapes-random")
    w.add_context_length(262144)
    w.add_embedding_length(d)
    w.add_block_count(n_layer)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(c["rope_base"])
    w.add_rope_dimension_count(c["n_rot"])
    w.add_rope_dimension_sections(c["sections"])
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(K)
    w.add_ssm_state_size(D)
    w.add_ssm_group_count(n_qk)
    w.add_ssm_time_step_rank(n_v)
    w.add_ssm_inner_size(n_v * D)
    w.add_full_attention_interval(c["interval"])
    w.add_expert_count(E)
    w.add_expert_used_count(c["n_expert_used"])
    w.add_expert_feed_forward_length(ff)
    w.add_expert_shared_feed_forward_length(fs)
    add_spm_vocab(w, n_vocab)

    def q(name, qt, *shape, std=None):
        std = std if std is not None else 1.0 / np.sqrt(shape[-1])
        w.add_tensor(name, random_blocks(rng, qt, shape, std), raw_dtype=qt)

    def f32(name, a):
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))

    def norm(n):
        return 1.0 + 0.1 * rng.standard_normal(n)

    q("token_embd.weight", T["embd"], n_vocab, d, std=1.0)
    f32("output_norm.weight", norm(d))
    q("output.weight", T["output"], n_vocab, d)
    for i in range(n_layer):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", norm(d))
        if (i + 1) % c["interval"] == 0:
            q(p + "attn_q.weight", T["attn_q"], 2 * H * hd, d)
            q(p + "attn_k.weight", T["attn_kv"], Hkv * hd, d)
            q(p + "attn_v.weight", T["attn_kv"], Hkv * hd, d)
            q(p + "attn_output.weight", T["out_proj"], d, H * hd)
            f32(p + "attn_q_norm.weight", norm(hd))
            f32(p + "attn_k_norm.weight", norm(hd))
        else:
            C = 2 * n_qk * D + n_v * D
            q(p + "attn_qkv.weight", T["dn_in"], C, d)
            q(p + "attn_gate.weight", T["dn_in"], n_v * D, d)
            f32(p + "ssm_beta.weight", rng.standard_normal((n_v, d)) / np.sqrt(d))
            f32(p + "ssm_alpha.weight", rng.standard_normal((n_v, d)) / np.sqrt(d))
            f32(p + "ssm_conv1d.weight", rng.uniform(-0.5, 0.5, (C, K)))
            f32(p + "ssm_dt.bias", rng.uniform(-4, -2, n_v))
            f32(p + "ssm_a", -rng.uniform(1, 16, n_v))
            f32(p + "ssm_norm.weight", norm(D))
            q(p + "ssm_out.weight", T["out_proj"], d, n_v * D)
        f32(p + "post_attention_norm.weight", norm(d))
        f32(p + "ffn_gate_inp.weight", rng.standard_normal((E, d)) / np.sqrt(d))
        q(p + "ffn_gate_exps.weight", T["exp_gate_up"], E, ff, d)
        q(p + "ffn_up_exps.weight", T["exp_gate_up"], E, ff, d)
        q(p + "ffn_down_exps.weight", T["exp_down"], E, d, ff)
        f32(p + "ffn_gate_inp_shexp.weight", rng.standard_normal(d) / np.sqrt(d))
        q(p + "ffn_gate_shexp.weight", T["shexp"], fs, d)
        q(p + "ffn_up_shexp.weight", T["shexp"], fs, d)
        q(p + "ffn_down_shexp.weight", T["shexp"], d, fs)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def prompts_for(n: int, length: int, n_vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(300, n_vocab, length).tolist() for _ in range(n)]


# ---- llama.cpp, in a child process -----------------------------------------------------------

def clock(kind: str):
    """wall: time.perf_counter; cpu: this process's CPU time (with -t 1 the compute time
    alone, whatever else the machine runs)."""
    return time.process_time if kind == "cpu" else time.perf_counter


def _child(a) -> int:
    from _peer_llamacpp import LlamaCpp

    B = a.streams
    clk = clock(a.clock)
    m = LlamaCpp(a.model_path, a.threads, n_ctx=max(a.pp, B * (a.ctx + a.steps + 8)) + 256, n_batch=512, n_seq=B)
    prompt = prompts_for(1, a.pp, m.n_vocab, a.seed)[0]
    multi = prompts_for(B, a.ctx, m.n_vocab, a.seed + 1)

    def prefill(toks):
        m.clear()
        t0 = clk()
        for i in range(0, len(toks), 512):
            m.decode(toks[i:i + 512])
        return clk() - t0

    def decode(prompts, steps):
        """`steps` decode steps of one sequence per prompt, all in one batch per step."""
        m.clear()
        nxt = []
        for s, toks in enumerate(prompts):
            m._batch_decode([(t, p, s) for p, t in enumerate(toks)], last_only=True)
            nxt.append(int(np.argmax(m.logits())))
        pos = [len(t) for t in prompts]
        t0 = clk()
        for _ in range(steps):
            m._batch_decode([(nxt[s], pos[s], s) for s in range(len(prompts))], last_only=False)
            for s in range(len(prompts)):
                lg = np.ctypeslib.as_array(m.L.llama_get_logits_ith(m.ctx, s), shape=(m.n_vocab,))
                nxt[s] = int(np.argmax(lg))
                pos[s] += 1
        return clk() - t0

    prefill(prompt[:64])
    decode([prompt[:16]], 2)
    out = {"pp": a.pp / prefill(prompt), "tg": a.tg / decode([prompt[:16]], a.tg)}
    if B > 1:
        out["multi"] = B * a.steps / decode(multi, a.steps)
    m.close()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def peer(a, path: str) -> dict:
    env = dict(os.environ)
    if env.get("LLMCORE_SET_OMP_WAIT_POLICY") == "1":  # set by llmcore, not by the user
        env.pop("OMP_WAIT_POLICY", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model-path", path, "-t", str(a.threads),
           "--pp", str(a.pp), "--tg", str(a.tg), "--streams", str(a.streams), "--ctx", str(a.ctx),
           "--steps", str(a.steps), "--seed", str(a.seed), "--clock", a.clock]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"llama.cpp peer failed: {res.stderr.strip()[-800:]}")


# ---- llmcore ------------------------------------------------------------------------------------

class Mine:
    def __init__(self, path: str, n_threads: int, clock_kind: str = "wall"):
        from llmcore import threads
        from llmcore.models import load_model

        self.threads = threads
        self.n_threads = n_threads
        self.clk = clock(clock_kind)
        threads.set_num_threads(n_threads)
        self.adaptive = threads.AdaptiveThreads(n_threads)  # decode threads by measured speed, as the engine does
        self.model = load_model(path)

    def prefill(self, toks, ub: int = 512) -> float:
        self.threads.set_num_threads(self.n_threads)
        st = self.model.new_state()
        arr = np.asarray(toks, np.int32)
        t0 = self.clk()
        for i in range(0, len(arr), ub):
            self.model.forward([(st, arr[i:i + ub])])
        dt = self.clk() - t0
        st.release()
        return dt

    def decode(self, prompts, steps: int) -> float:
        """Seconds for `steps` decode steps of all prompts' sequences together (prefill
        untimed, and not counted in the expert statistics)."""
        m = self.model
        self.threads.set_num_threads(self.n_threads)
        sts = [m.new_state() for _ in prompts]
        nxt = [int(np.argmax(m.forward([(st, np.asarray(p, np.int32))])[0])) for st, p in zip(sts, prompts)]
        m.moe_stats.reset()
        B = len(prompts)
        t0 = self.clk()
        for _ in range(steps):
            nt = self.adaptive.choose(B)
            self.threads.set_num_threads(nt)
            ts = time.perf_counter()
            lg = m.forward([(st, np.array([t], np.int32)) for st, t in zip(sts, nxt)])
            self.adaptive.record(B, nt, time.perf_counter() - ts)
            nxt = np.argmax(lg, axis=1).tolist()
        dt = self.clk() - t0
        for st in sts:
            st.release()
        return dt

    def experts(self, fn) -> dict:
        s = self.model.moe_stats
        s.reset()
        fn()  # decode() resets them after its prefill
        d = s.as_dict()
        return {"computed": d["experts_computed"] / max(1, d["calls"]),
                "skipped": d["experts_skipped"] / max(1, d["calls"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens (prefill)")
    ap.add_argument("--tg", type=int, default=32, help="generated tokens, one stream")
    ap.add_argument("--streams", type=int, default=8, help="sequences decoded together")
    ap.add_argument("--ctx", type=int, default=64, help="prompt tokens of each of those sequences")
    ap.add_argument("--steps", type=int, default=16, help="decode steps of the streams")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mix", choices=MIXES, default=MIXES[0], help="the weight types (see above)")
    ap.add_argument("--keep", help="write the model here and keep it (reused when it exists)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall clock, or each process's CPU time (use with -t 1 on a busy machine)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(a)

    tmp = None
    if a.keep and os.path.exists(a.keep):
        path = a.keep
    else:
        if a.keep:
            path = a.keep
        else:
            tmp = tempfile.TemporaryDirectory(prefix="llmcore-bench-")
            path = os.path.join(tmp.name, "qwen35moe-shapes.gguf")
        t0 = time.perf_counter()
        build_model(path, a.layers, a.vocab, a.seed, a.mix)
        print(f"wrote {path} ({os.path.getsize(path) / 2**30:.2f} GiB) in {time.perf_counter() - t0:.0f} s",
              flush=True)
    try:
        return run(a, path)
    finally:
        if tmp is not None:
            tmp.cleanup()


def run(a, path: str) -> int:
    why = "--no-peer" if a.no_peer else available()
    t0 = time.perf_counter()
    mine = Mine(path, a.threads, a.clock)
    print(f"llmcore loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    m = mine.model
    prompt = prompts_for(1, a.pp, m.n_vocab, a.seed)[0]
    multi = prompts_for(a.streams, a.ctx, m.n_vocab, a.seed + 1)
    mine.prefill(prompt[:64])
    mine.decode([prompt[:16]], 2)
    keys = ("pp", "tg", "multi")
    res = {"llmcore": {k: [] for k in keys}, "llama.cpp": {k: [] for k in keys}}
    for r in range(a.reps):
        res["llmcore"]["pp"].append(a.pp / mine.prefill(prompt))
        res["llmcore"]["tg"].append(a.tg / mine.decode([prompt[:16]], a.tg))
        if a.streams > 1:
            res["llmcore"]["multi"].append(a.streams * a.steps / mine.decode(multi, a.steps))
        if why is None:
            for k, v in peer(a, path).items():
                res["llama.cpp"][k].append(v)
        print(f"rep {r + 1}/{a.reps}: " + "; ".join(
            f"{e} " + ", ".join(f"{k} {v[k][-1]:.1f}" for k in keys if v[k]) for e, v in res.items() if v["pp"]),
            flush=True)
    ex_pp = mine.experts(lambda: mine.prefill(prompt))
    ex_1 = mine.experts(lambda: mine.decode([prompt[:16]], 8))
    ex_b = mine.experts(lambda: mine.decode(multi, 4)) if a.streams > 1 else None
    med = {e: {k: statistics.median(v[k]) for k in keys if v[k]} for e, v in res.items() if v["pp"]}
    c = SHAPES
    print()
    print(f"qwen35moe ({a.mix}), Qwen3.6-35B-A3B layer shapes, {a.layers} layers ({a.layers - a.layers // 4} DeltaNet, "
          f"{a.layers // 4} attention), vocab {a.vocab}, {os.path.getsize(path) / 2**30:.2f} GiB; "
          f"{a.threads} thread(s), {a.clock} clock; median of {a.reps}; load average {os.getloadavg()[0]:.1f}")
    print(f"| engine | pp{a.pp} t/s | tg{a.tg} t/s (1 stream) | {a.streams} streams t/s (aggregate) | "
          f"{a.streams} streams / 1 stream |")
    print("|---|---|---|---|---|")
    for e, v in med.items():
        mt = v.get("multi")
        print(f"| {e} | {v['pp']:.1f} | {v['tg']:.2f} | {'%.2f' % mt if mt else '-'} | "
              f"{'%.2fx' % (mt / v['tg']) if mt else '-'} |")
    if "llama.cpp" in med:
        l, p = med["llmcore"], med["llama.cpp"]
        mt = "%.2fx" % (l["multi"] / p["multi"]) if "multi" in l and "multi" in p else "-"
        print(f"| llmcore / llama.cpp | {l['pp'] / p['pp']:.2f}x | {l['tg'] / p['tg']:.2f}x | {mt} | |")
    else:
        print(f"(llama.cpp not measured: {why})")
    print()
    print(f"experts per MoE layer call, computed / skipped (of {c['n_expert']}, {c['n_expert_used']} per token):")
    print(f"  prefill of {a.pp} tokens: {ex_pp['computed']:.1f} / {ex_pp['skipped']:.1f}")
    print(f"  decode, 1 stream: {ex_1['computed']:.1f} / {ex_1['skipped']:.1f}")
    if ex_b:
        print(f"  decode, {a.streams} streams: {ex_b['computed']:.1f} / {ex_b['skipped']:.1f} "
              f"({a.streams * c['n_expert_used']} token-expert pairs share {ex_b['computed']:.1f} experts' weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
