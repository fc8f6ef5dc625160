#!/usr/bin/env python3
"""TTFT of a returning conversation after a restart, with and without the disk tier.

    python bench/disk_restart.py -m smollm2 --tokens 8000 -ctk q4_0 -ctv q4_0

1. An engine with the disk tier serves turn 1 (``--tokens`` prompt tokens), then its next
   turn without a restart (the reference: the slot serves it), and stops cleanly (the
   disk tier is written at stop).
2. A new engine without the disk tier serves the same next turn: the whole prompt again.
3. A new engine with the disk tier over the same directory serves it: read back from disk.

TTFT is measured from submit to the first token (it includes a disk read, which happens
before the request takes a slot). 2 and 3 must give the reference's tokens.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmcore.engine import Engine, EngineConfig, GenParams, TokenEvent  # noqa: E402
from llmcore.pull import resolve_model  # noqa: E402
from llmcore.sampling import SamplingParams  # noqa: E402


def turn(eng: Engine, prompt: list[int], n: int) -> dict:
    t0 = time.perf_counter()
    task = eng.submit(prompt, GenParams(n_predict=n, ignore_eos=True, sampling=SamplingParams(temperature=0.0)),
                      sync=True)
    ttft, toks, final = None, [], None
    for ev in task:
        if isinstance(ev, TokenEvent):
            if ttft is None and ev.tokens:
                ttft = time.perf_counter() - t0
            toks.extend(ev.tokens)
        else:
            final = ev
    t = final.timings
    return {"ttft_s": ttft, "tokens": toks, "cache_n": t.cache_n, "prompt_n": t.prompt_n,
            "cache_source": str(t.cache_source), "total_s": time.perf_counter() - t0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default="smollm2")
    p.add_argument("--tokens", type=int, default=8000, help="turn 1's prompt tokens")
    p.add_argument("--next", type=int, default=64, help="new prompt tokens of the next turn")
    p.add_argument("--gen", type=int, default=16, help="tokens generated per turn")
    p.add_argument("-ctk", "--cache-type-k", default="q4_0")
    p.add_argument("-ctv", "--cache-type-v", default="q4_0")
    p.add_argument("-c", "--ctx-size", type=int, default=32768)
    p.add_argument("--cache-dir", default=None, help="default: a temporary directory")
    p.add_argument("--json", default=None, help="write the numbers here")
    a = p.parse_args(argv)
    path = resolve_model(a.model)
    d = Path(a.cache_dir or tempfile.mkdtemp(prefix="llmcore-disk-"))

    def engine(disk: bool) -> Engine:
        cfg = EngineConfig(n_ctx=a.ctx_size, cache_type_k=a.cache_type_k, cache_type_v=a.cache_type_v,
                           cache_dir=str(d) if disk else None)
        eng = Engine.from_path(path, cfg)
        eng.start()
        if not eng.wait_ready(300):
            raise SystemExit(f"cannot load {path}: {eng.load_error}")
        if disk:
            while not eng.disk.ready:
                time.sleep(0.01)
        return eng

    rng = np.random.default_rng(0)
    p1 = rng.integers(100, 40000, size=a.tokens).tolist()
    a_eng = engine(True)
    t1 = turn(a_eng, p1, a.gen)
    p2 = p1 + t1["tokens"] + rng.integers(100, 40000, size=a.next).tolist()
    # the reference continuation without a restart, on an engine that never saw p2's turn
    ref_eng = engine(False)
    turn(ref_eng, p1, a.gen)
    ref = turn(ref_eng, p2, a.gen)
    ref_eng.stop()
    t0 = time.perf_counter()
    a_eng.stop()
    stop_s = time.perf_counter() - t0
    on_disk = sum(f.stat().st_size for f in d.iterdir() if f.suffix == ".llmstate")
    cold_eng = engine(False)
    cold = turn(cold_eng, p2, a.gen)
    cold_eng.stop()
    warm_eng = engine(True)
    warm = turn(warm_eng, p2, a.gen)
    warm_eng.stop()
    out = {"model": path.name, "prompt_tokens": len(p2), "kv": f"{a.cache_type_k}/{a.cache_type_v}",
           "turn1_ttft_s": t1["ttft_s"], "no_restart": ref, "restart_without_disk": cold,
           "restart_with_disk": warm, "stop_s": stop_s, "disk_bytes": on_disk,
           "exact": warm["tokens"] == ref["tokens"], "cold_same_tokens": cold["tokens"] == ref["tokens"]}
    for k in ("no_restart", "restart_without_disk", "restart_with_disk"):
        r = out[k]
        print(f"{k:22s} TTFT {1e3 * r['ttft_s']:8.0f} ms  cache_n {r['cache_n']:6d} ({r['cache_source']}), "
              f"prompt_n {r['prompt_n']}")
    print(f"turn 1 TTFT {1e3 * t1['ttft_s']:.0f} ms; stop (writing the disk tier) {stop_s:.2f} s, "
          f"{on_disk / 2**20:.1f} MiB on disk; restored tokens identical: {out['exact']}")
    if a.json:
        for k in ("no_restart", "restart_without_disk", "restart_with_disk"):
            out[k] = {x: y for x, y in out[k].items() if x != "tokens"}
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0 if out["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
