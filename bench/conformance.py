#!/usr/bin/env python3
"""Compare llmcore's forward with the llama.cpp oracle outputs of the conformance set.

    python bench/conformance.py [PATH]   (default: $LLMCORE_CONFORMANCE)
        [--only SUBSTR] [--greedy N] [--prompts short,long,...]

PATH is a conformance set: models/ (GGUFs) and oracle/ (llama.cpp's outputs for them, made
by bench/make_oracle.py).

For every oracle in PATH/oracle (its model in PATH/models, or the real models in the
llmcore model cache), per prompt: max |diff| and relative std (std(diff)/std(oracle)) of
the last-position logits, whether the argmax agrees (and the oracle's top-1/top-2 margin),
and how many of the first N greedy tokens match. Architectures llmcore does not support
yet are listed as "unsupported".
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from llmcore.errors import ModelLoadError  # noqa: E402
from llmcore.gguf_file import GGUFFile  # noqa: E402
from llmcore.models import get_model_class, load_model  # noqa: E402


def find_model(conf: Path, oracle: dict) -> Path | None:
    name = oracle["model"]
    cand = [conf / "models" / name]
    try:
        from llmcore.pull import cache_dir

        cand.append(cache_dir() / name)
    except Exception:
        pass
    for c in cand:
        if c.exists():
            return c
    return None


def greedy(model, tokens, n: int, state=None):
    """Last-position logits of the prompt and the next n greedy (argmax) ids."""
    st = state if state is not None else model.new_state()
    logits = model.forward([(st, np.asarray(tokens, np.int32))])[0]
    first = logits
    out = []
    for i in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        if i + 1 < n:
            logits = model.forward([(st, [t])])[0]
    st.release()
    return first, out


def compare_prompt(model, prompt: dict, oracle_logits: np.ndarray, n_greedy: int) -> dict:
    last, gen = greedy(model, prompt["prompt_tokens"], n_greedy)
    ref = np.asarray(oracle_logits, np.float32)
    diff = last - ref
    top2 = np.sort(ref)[-2:]
    want = [int(x) for x in prompt["generated"][:n_greedy]]
    n_match = next((i for i, (a, b) in enumerate(zip(gen, want)) if a != b), len(want))
    return {
        "max_abs": float(np.max(np.abs(diff))),
        "rel_std": float(np.std(diff) / np.std(ref)),
        "argmax_ok": int(np.argmax(last)) == int(np.argmax(ref)),
        "margin": float(top2[1] - top2[0]),
        "greedy_match": n_match,
        "greedy_n": len(want),
        "generated": gen,
    }


def load_oracle(conf: Path, stem: str):
    d = json.loads((conf / "oracle" / f"{stem}.json").read_text())
    z = np.load(conf / "oracle" / f"{stem}.last_logits.npz")
    return d, [z[f"p{i}"] for i in range(len(d["prompts"]))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default=os.environ.get("LLMCORE_CONFORMANCE"),
                    help="the conformance set (default: $LLMCORE_CONFORMANCE)")
    ap.add_argument("--only", default="")
    ap.add_argument("--greedy", type=int, default=16)
    ap.add_argument("--prompts", default="")
    args = ap.parse_args(argv)
    if not args.path:
        print("no conformance set: pass PATH or set LLMCORE_CONFORMANCE", file=sys.stderr)
        return 2
    conf = Path(args.path)
    if not (conf / "oracle").is_dir():
        print(f"no oracle directory in {conf}", file=sys.stderr)
        return 2
    want_prompts = set(filter(None, args.prompts.split(",")))
    print(f"{'model':34} {'prompt':8} {'max|diff|':>9} {'rel std':>8} {'argmax':>6} {'margin':>6} {'greedy':>7} {'s':>5}")
    for jf in sorted((conf / "oracle").glob("*.json")):
        stem = jf.stem
        if args.only and args.only not in stem:
            continue
        oracle, logits = load_oracle(conf, stem)
        path = find_model(conf, oracle)
        if path is None:
            print(f"{stem:34} model file not found")
            continue
        try:
            g = GGUFFile(path)
            get_model_class(g.arch)
        except ModelLoadError:
            print(f"{stem:34} unsupported ({g.arch})")
            continue
        model = load_model(g)
        for p, ref in zip(oracle["prompts"], logits):
            if want_prompts and p["name"] not in want_prompts:
                continue
            t0 = time.perf_counter()
            r = compare_prompt(model, p, ref, args.greedy)
            dt = time.perf_counter() - t0
            print(f"{stem:34} {p['name']:8} {r['max_abs']:9.4f} {r['rel_std']:8.4f} "
                  f"{'ok' if r['argmax_ok'] else 'DIFF':>6} {r['margin']:6.2f} "
                  f"{r['greedy_match']:>3}/{r['greedy_n']:<3} {dt:5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
