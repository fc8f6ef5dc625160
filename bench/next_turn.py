#!/usr/bin/env python3
"""Where the time to first token of a cached next turn goes, at histories too long to
prefill cold in a bench run (in process, no server).

    python bench/next_turn.py [-m smollm2] [-t 2] [--history 4400 60000] [--reps 5]

For a coding-agent history of about N tokens (bench/serve_ttft.py --conversation's, same
generator) plus a new short user message, the parts a server does before the first token:

- render: the chat template over the whole history;
- tokenize: the rendered text, with the tokenizer's fragment cache warm (the history was
  tokenized by the previous turn; only the new turn's pieces are new);
- prefix: the common prefix of the new ids with the cached sequence's;
- forward: the new tokens evaluated after the cached N positions. The history's KV positions
  are reserved but not computed (a cold prefill of 60k tokens takes many minutes on 2 cores;
  attention costs the same whatever the values are).

The sum is what the server's TTFT is made of, less HTTP/JSON and streaming (a few ms:
compare with serve_ttft.py at the lengths it can prefill).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import numpy as np

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(BENCH), BENCH]

from serve_load import _TOPICS, PromptMaker, text_words  # noqa: E402
from serve_ttft import conversation  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--history", type=int, nargs="+", default=[4400, 60000])
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    from llmcore import threads
    from llmcore.loader import load_gguf
    from llmcore.pull import resolve_model

    threads.set_num_threads(a.threads)
    lm = load_gguf(resolve_model(a.model))
    tok, tmpl, m = lm.tokenizer, lm.chat_template, lm.model
    pm = PromptMaker()
    sample = text_words(random.Random(12345), 400)
    pm.tpw = len(tok.encode(sample, add_special=False)) / (sample.count(" ") + 1)

    print("| history | prompt tokens | new tokens | render ms | tokenize ms | prefix ms | forward ms | sum ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.history:
        history = conversation(pm, n)
        rng = random.Random(1)

        def turn(i):
            return history + [{"role": "user", "content": f"Step {i}: now look at {rng.choice(_TOPICS)}."}]

        def ids_of(msgs):
            return tok.encode(tmpl.render(msgs, add_generation_prompt=True), add_special=True, parse_special=True)

        cached = ids_of(turn(0))  # the previous turn: its history's pieces are in the cache now
        t_render, t_tok, t_prefix = [], [], []
        for i in range(1, a.reps + 1):  # each rep a new last message, as each request is
            msgs = turn(i)
            t0 = time.perf_counter()
            text = tmpl.render(msgs, add_generation_prompt=True)
            t1 = time.perf_counter()
            new = tok.encode(text, add_special=True, parse_special=True)
            t2 = time.perf_counter()
            old = np.asarray(cached[:-1], np.int32)  # the cached state: all but the last sampled
            k = min(len(old), len(new))
            d = np.flatnonzero(old[:k] != np.asarray(new[:k], np.int32))
            n_keep = int(d[0]) if d.size else k
            t3 = time.perf_counter()
            t_render.append(t1 - t0)
            t_tok.append(t2 - t1)
            t_prefix.append(t3 - t2)
        t_render, t_tok, t_prefix = (statistics.median(x) for x in (t_render, t_tok, t_prefix))
        base = m.new_state()
        for c in base.caches.values():
            c.append(n_keep)  # positions reserved, not computed
        base.tokens.extend(new[:n_keep])
        seg = np.asarray(new[n_keep:], np.int32)
        ts = []
        for _ in range(max(3, a.reps)):
            st = base.fork()
            t0 = time.perf_counter()
            m.forward([(st, seg)])
            ts.append(time.perf_counter() - t0)
            st.release()
        base.release()
        t_fw = statistics.median(ts)
        total = t_render + t_tok + t_prefix + t_fw
        print(f"| ~{n} | {len(new)} | {len(seg)} | {t_render * 1e3:.1f} | {t_tok * 1e3:.1f} | {t_prefix * 1e3:.1f} | "
              f"{t_fw * 1e3:.1f} | {total * 1e3:.0f} |", flush=True)
    with open("/proc/loadavg") as f:
        print(f"\nload average at end: {' '.join(f.read().split()[:3])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
