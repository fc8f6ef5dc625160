#!/usr/bin/env python3
"""A/B of a Q4_0 K pool's two layouts in one build: rows against 16-key tiles (the decode
scores kernel's layout, pyx/simd_kv_rows.h), the same K/V values, alternated call by call,
thread CPU time at 1 thread (robust on a shared host). Outputs must be identical.

    python bench/attn_layout_ab.py [--case b32 b8 b1 verify prefill] [--reps 15]

Cases (SmolLM2's 9 heads / 3 kv heads of 64, blocks of 32): b32 / b8: 32 / 8 sequences of
600 tokens, one decode token each; b1: one sequence of 4000 tokens; verify: 5 rows at 2000
(a speculative verify); prefill: 512 queries at the end of 1024 tokens (tile items).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # llmcore from this checkout

CASES = {  # seq_lens, n_q
    "b32": ([600] * 32, [1] * 32),
    "b8": ([600] * 8, [1] * 8),
    "b1": ([4000], [1]),
    "verify": ([2000], [5]),
    "prefill": ([1024], [512]),
}


def make_case(name: str, seed: int):
    """q and a rows-layout K/V pool with the case's sequences in shuffled blocks."""
    from llmcore import nn

    lens, n_q = CASES[name]
    H, KVH, D, bs = 9, 3, 64, 32
    r = np.random.default_rng(seed)
    nbs = [(n + bs - 1) // bs for n in lens]
    ids = r.permutation(sum(nbs)).astype(np.int32)
    k_pool = nn.make_kv_pool("q4_0", len(ids), bs, KVH, D)
    v_pool = nn.make_kv_pool("q4_0", len(ids), bs, KVH, D)
    tables = np.full((len(lens), max(nbs)), -1, np.int32)
    used, q_pos = 0, []
    for s, n in enumerate(lens):
        tables[s, :nbs[s]] = ids[used:used + nbs[s]]
        used += nbs[s]
        pos = np.arange(n, dtype=np.int32)
        nn.kv_store(k_pool, "q4_0", tables[s], pos, r.standard_normal((n, KVH, D), dtype=np.float32))
        nn.kv_store(v_pool, "q4_0", tables[s], pos, r.standard_normal((n, KVH, D), dtype=np.float32))
        q_pos.append(np.arange(n - n_q[s], n, dtype=np.int32))
    q_pos = np.concatenate(q_pos)
    seg = np.concatenate([[0], np.cumsum(n_q)]).astype(np.int32)
    q = r.standard_normal((len(q_pos), H, D), dtype=np.float32)
    return q, k_pool, v_pool, tables, seg, q_pos


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args(argv)
    from llmcore import nn, threads

    threads.set_num_threads(1)
    for i, name in enumerate(a.case):
        q, k_rows, v_pool, tables, seg, q_pos = make_case(name, seed=i)
        k_tiles = np.ascontiguousarray(nn._ref_tiles_from_rows(k_rows))
        times: dict[str, list[float]] = {"rows": [], "tiles": []}
        outs = {}
        for _ in range(a.reps):
            for layout, k in (("rows", k_rows), ("tiles", k_tiles)):
                t0 = time.thread_time()
                outs[layout] = nn.attention(q, k, v_pool, "q4_0", tables, seg, q_pos, 0.125)
                times[layout].append(time.thread_time() - t0)
        same = np.array_equal(outs["rows"], outs["tiles"])
        med = {k: float(np.median(v)) for k, v in times.items()}
        mn = {k: min(v) for k, v in times.items()}
        print(f"{name:8s} rows {med['rows'] * 1e3:7.3f} ms  tiles {med['tiles'] * 1e3:7.3f} ms (medians)  "
              f"tiles / rows {med['tiles'] / med['rows']:.3f} (median) {mn['tiles'] / mn['rows']:.3f} (min)  "
              f"outputs identical: {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
