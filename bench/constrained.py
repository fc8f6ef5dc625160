#!/usr/bin/env python3
"""Constrained decoding speed (no HTTP): what a grammar costs the slot it constrains, and
what it costs the other slots.

    PYTHONPATH=. python bench/constrained.py [-m smollm2] [-n 96] [--repeats 7] [-t 2]

1. One slot, greedy, -n tokens: unconstrained (ignore_eos) against a JSON schema whose
   output cannot end before -n tokens (an array of strings, minItems 1000). Decode tok/s
   from the engine's timings (prompt excluded).
2. Two slots decoding side by side: slot A's decode tok/s when slot B is unconstrained,
   and when slot B decodes under the schema. The masks are computed on a helper thread
   while the forward runs; what stays on the engine thread is applying the mask and
   feeding the token to the matcher.
3. That engine-thread work per constrained token (waiting for the mask, applying it,
   consuming the token), timed alone.

Runs are paired (A then B, back to back) and the median of the pair ratios is reported,
so load from other processes on the machine cancels out as far as it can. Each run also
reports the process CPU time per generated token (all threads; llmcore's OpenMP threads
sleep when idle), which other processes disturb far less than wall time: on a loaded
machine compare that.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # llmcore from this checkout

SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 1000}
PROMPT = "<|im_start|>user\nList many fruit names as a JSON array.<|im_end|>\n<|im_start|>assistant\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("-t", "--threads", type=int, default=0)
    a = ap.parse_args()

    import numpy as np

    from llmcore import threads
    from llmcore.constrain import Constraint, GrammarVocab, MaskBatch, json_schema_grammar
    from llmcore.engine import EngineConfig, GenParams, load_engine
    from llmcore.pull import resolve_model
    from llmcore.sampling import SamplingParams

    threads.set_num_threads(a.threads or None)
    eng = load_engine(resolve_model(a.model), EngineConfig(n_ctx=4096, n_parallel=2, cache_ram_mib=0,
                                                           n_threads=a.threads))
    greedy = SamplingParams(temperature=0.0)
    tok = eng.tokenizer
    prompt = tok.encode(PROMPT, add_special=True, parse_special=True)
    vocab = GrammarVocab.of(tok)
    grammar = json_schema_grammar(SCHEMA)

    def params(constrained: bool) -> GenParams:
        c = Constraint(vocab, grammar) if constrained else None
        return GenParams(n_predict=a.n, ignore_eos=not constrained, cache_prompt=False, constraint=c,
                         sampling=greedy)

    def tps(final) -> float:
        return final.timings.to_dict()["predicted_per_second"]

    def cpu_run(*ps: GenParams):
        """Run `ps` side by side; (their results, process CPU ms per generated token)."""
        t0 = time.process_time()
        tasks = [eng.submit(prompt, p, sync=True) for p in ps]
        got = [t.collect_sync() for t in tasks]
        return got, 1e3 * (time.process_time() - t0) / sum(len(r.tokens) for r in got)

    try:
        eng.generate_sync(prompt, params(True))  # warm up: kernels, masks, the helper thread
        pairs, free, con, cpu_free, cpu_con = [], [], [], [], []
        for _ in range(a.repeats):
            (rf,), cf = cpu_run(params(False))
            (r,), cc = cpu_run(params(True))
            assert len(r.tokens) == a.n
            f, c = tps(rf.final), tps(r.final)
            free.append(f)
            con.append(c)
            pairs.append(c / f)
            cpu_free.append(cf)
            cpu_con.append(cc)
        print(f"one slot, {a.n} tokens: unconstrained {statistics.median(free):.1f} tok/s, JSON schema "
              f"{statistics.median(con):.1f} tok/s; paired ratio median {statistics.median(pairs):.2f}x "
              f"(min {min(pairs):.2f}, max {max(pairs):.2f}); CPU per token {statistics.median(cpu_free):.2f} ms "
              f"vs {statistics.median(cpu_con):.2f} ms -> {statistics.median(cpu_free) / statistics.median(cpu_con):.2f}x")

        pairs, beside_free, beside_con, cpu2 = [], [], [], {False: [], True: []}
        for _ in range(a.repeats):
            got = []
            for constrained in (False, True):
                (ra, rb), cpu = cpu_run(params(False), params(constrained))
                assert len(ra.tokens) == len(rb.tokens) == a.n
                got.append(tps(ra.final))
                cpu2[constrained].append(cpu)
            beside_free.append(got[0])
            beside_con.append(got[1])
            pairs.append(got[1] / got[0])
        c0, c1 = statistics.median(cpu2[False]), statistics.median(cpu2[True])
        print(f"two slots: slot A {statistics.median(beside_free):.1f} tok/s beside an unconstrained slot, "
              f"{statistics.median(beside_con):.1f} tok/s beside a constrained one; paired ratio median "
              f"{statistics.median(pairs):.2f}x (min {min(pairs):.2f}, max {max(pairs):.2f}); CPU per token "
              f"(both slots) {c0:.2f} ms vs {c1:.2f} ms -> {c0 / c1:.2f}x")

        # the engine thread's share of a constrained token, timed alone
        c = Constraint(vocab, grammar)
        masks = MaskBatch()
        ids = tok.encode('["apple", "banana", "cherry", "date", "elderberry", "fig", "grape", "kiwi"',
                         add_special=False)
        row = np.random.default_rng(0).standard_normal(tok.vocab_size).astype(np.float32)
        t_wait = t_apply = t_consume = 0.0
        for t in ids:
            t0 = time.perf_counter()
            pending = masks.start([c])
            pending.wait()
            t1 = time.perf_counter()
            pending.apply(0, row)
            t2 = time.perf_counter()
            c.consume(t)
            t_wait, t_apply, t_consume = t_wait + t1 - t0, t_apply + t2 - t1, t_consume + time.perf_counter() - t2
        masks.close()
        n = len(ids)
        print(f"per constrained token: mask {1e3 * t_wait / n:.3f} ms (computed beside the forward in a "
              f"step), apply {1e3 * t_apply / n:.3f} ms, consume {1e3 * t_consume / n:.3f} ms "
              f"(on the engine thread); a decode step here is {1e3 / statistics.median(beside_free):.1f} ms")
    finally:
        eng.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
