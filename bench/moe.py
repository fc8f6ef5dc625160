#!/usr/bin/env python3
"""MoE speed: prefill and decode t/s on a qwen3moe model, llmcore vs llama.cpp in one run,
and how many experts each step computed vs skipped.

    python bench/moe.py [-m PATH] [-t 2] [--pp 256] [--tg 64] [--reps 3]

Default model: tiny-qwen3moe-q4_k.gguf of the conformance set in $LLMCORE_CONFORMANCE
(8 experts, 2 used, 4 layers).
Same structure as bench/speed.py (the engines alternate rep by rep, llama.cpp in a child
process; medians).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _peer_llamacpp import available, measure_in_subprocess  # noqa: E402
from speed import LLMCore  # noqa: E402

DEFAULT_STEM = "tiny-qwen3moe-q4_k.gguf"


def default_model() -> str | None:
    conf = os.environ.get("LLMCORE_CONFORMANCE")
    return os.path.join(conf, "models", DEFAULT_STEM) if conf else None


def expert_counts(mine: LLMCore, toks, n_gen: int) -> tuple[dict, dict]:
    """moe_stats of one prefill step and the mean over n_gen decode steps (per layer call)."""
    m = mine.model
    st = m.new_state()
    m.moe_stats.reset()
    logits = m.forward([(st, np.asarray(toks, np.int32))])
    pre = m.moe_stats.as_dict()
    m.moe_stats.reset()
    t = int(np.argmax(logits[0]))
    for _ in range(n_gen):
        t = int(np.argmax(m.forward([(st, [t])])[0]))
    dec = m.moe_stats.as_dict()
    st.release()
    return pre, dec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=default_model(),
                    help=f"GGUF path (default: $LLMCORE_CONFORMANCE/models/{DEFAULT_STEM})")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=256, help="prompt tokens")
    ap.add_argument("--tg", type=int, default=64, help="generated tokens")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    a = ap.parse_args(argv)

    path = a.model
    if path is None:
        ap.error("no model: pass -m PATH or set LLMCORE_CONFORMANCE")
    if not os.path.exists(path):
        from llmcore.pull import resolve_model

        path = str(resolve_model(path))
    mine = LLMCore(path, a.threads)
    if mine.model.moe_stats is None:
        print(f"{path}: not a MoE model ({mine.model.args.arch})")
        return 1
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, min(mine.model.n_vocab, 30000), a.pp).tolist()
    short = prompt[:16]
    why = "--no-peer" if a.no_peer else available()
    peer = why is None  # measured in a child process with llama.cpp's own OpenMP settings

    res = {"llmcore": {"pp": [], "tg": []}, "llama.cpp": {"pp": [], "tg": []}}
    mine.prefill(prompt[:64]); mine.generate(short, 4)
    for r in range(a.reps):
        res["llmcore"]["pp"].append(a.pp / mine.prefill(prompt))
        res["llmcore"]["tg"].append(a.tg / mine.generate(short, a.tg))
        if peer:
            got = measure_in_subprocess(path, a.threads, a.pp, a.tg)
            res["llama.cpp"]["pp"] += got["pp"]
            res["llama.cpp"]["tg"] += got["tg"]
        print(f"rep {r + 1}/{a.reps}: " + ", ".join(
            f"{k} pp {v['pp'][-1]:.1f} tg {v['tg'][-1]:.1f}" for k, v in res.items() if v["pp"]), flush=True)

    m = mine.model
    n_layers = sum(1 for b in m.blocks if hasattr(b.ffn, "stats"))
    pre, dec = expert_counts(mine, prompt, a.tg)
    med = {k: {x: statistics.median(v[x]) for x in v} for k, v in res.items() if v["pp"]}
    print()
    print(f"model {os.path.basename(path)}, {a.threads} threads, pp{a.pp} / tg{a.tg}, median of {a.reps}; "
          f"{m.n_expert} experts, {m.n_expert_used} used, {n_layers} MoE layers")
    print(f"| engine | pp{a.pp} t/s | tg{a.tg} t/s |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v['pp']:.1f} | {v['tg']:.1f} |")
    if "llama.cpp" in med:
        l, p = med["llmcore"], med["llama.cpp"]
        print(f"| llmcore / llama.cpp | {l['pp'] / p['pp']:.2f}x | {l['tg'] / p['tg']:.2f}x |")
    else:
        print(f"(llama.cpp not measured: {why})")
    print()
    print("experts per layer per step (computed / skipped):")
    print(f"  prefill of {a.pp} tokens: {pre['experts_computed'] / max(1, pre['calls']):.2f} / "
          f"{pre['experts_skipped'] / max(1, pre['calls']):.2f}  "
          f"({pre['pairs']} token-expert rows in {pre['calls']} layer calls)")
    steps = max(1, a.tg)
    print(f"  decode (1 token/step, mean of {a.tg} steps): {dec['experts_computed'] / max(1, dec['calls']):.2f} / "
          f"{dec['experts_skipped'] / max(1, dec['calls']):.2f}  "
          f"({dec['experts_computed'] / steps:.1f} expert matmul groups per step over all layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
