#!/usr/bin/env python3
"""The prompt-lookup drafter replayed on a recorded greedy output: what it drafts, what is
kept, and the speed-up a cost model gives, without the noise of timing the engine.

    python bench/spec_replay.py [-m smollm2] [--chat-template NAME] [--tokens 512]
        [--step-ms 3.63] [--row-ms 0.97] [--baseline REV] [--trace]

Greedy speculative output is plain decoding's, so one plain run per workload (the two of
bench/speculative.py) fixes every draft's fate: the replay feeds the drafter the sequence
as the engine would (prompt and tokens so far), counts how many of each draft the output
confirms, and charges a verify of k drafts step + k * row milliseconds (defaults: SmolLM2 at
a 2.4k-token depth, 2 threads, `bench/profile_step.py --verify K`). The ratio is plain
decoding's cost over the replay's. --baseline REV replays the drafter of another revision
too (`git show REV:llmcore/engine/speculative.py`), side by side: a drafter change is
judged on the same outputs. --trace prints each step's [drafted/kept] and the text it gave.
bench/speculative.py is the measurement; this is for understanding and comparing drafters.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

from speculative import prompts, run  # noqa: E402


def load_drafter(rev: str | None):
    """llmcore.engine.speculative of this checkout, or of git revision rev."""
    if rev is None:
        from llmcore.engine import speculative

        return speculative
    src = subprocess.run(["git", "show", f"{rev}:llmcore/engine/speculative.py"], cwd=os.path.dirname(HERE),
                         check=True, capture_output=True, text=True).stdout
    name = "llmcore.engine._speculative_" + "".join(c if c.isalnum() else "_" for c in rev)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, f.name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    os.unlink(f.name)
    return mod


def replay(mod, prompt: list[int], out: list[int], n_max: int):
    """[(drafted, kept)] per step of speculative decoding that produces `out` after `prompt`."""
    d = mod.NgramDrafter(mod.SpecParams(n_max=n_max))
    seq, i, steps = list(prompt), 0, []
    while i < len(out):
        room = len(out) - i - 1
        draft = d.draft(seq, room) if room > 0 else []
        kept = 0
        while kept < len(draft) and out[i + kept] == draft[kept]:
            kept += 1
        d.record(kept, len(draft))
        steps.append((len(draft), kept))
        seq += out[i:i + kept + 1]
        i += kept + 1
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--chat-template", default=None)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--lines", type=int, default=300)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--step-ms", type=float, default=3.63, help="a plain decode step")
    ap.add_argument("--row-ms", type=float, default=0.97, help="each verified draft token on top")
    ap.add_argument("--baseline", default=None, help="also replay the drafter of this git revision")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("-t", "--threads", type=int, default=2)
    a = ap.parse_args()

    from llmcore import threads
    from llmcore.engine import Engine, EngineConfig
    from llmcore.loader import load_gguf
    from llmcore.pull import resolve_model

    threads.set_num_threads(a.threads)
    lm = load_gguf(resolve_model(a.model), template_name=a.chat_template)
    eng = Engine(EngineConfig(n_ctx=8192, n_threads=a.threads, cache_ram_mib=0), model=lm.model,
                 tokenizer=lm.tokenizer, chat_template=lm.chat_template)
    eng.start()
    try:
        recorded = {name: (list(p), list(run(eng, p, a.tokens, False)[1]))
                    for name, p in prompts(lm.tokenizer, lm.chat_template, a.lines).items()}
    finally:
        eng.stop()
    drafters = [("this checkout", load_drafter(None))]
    if a.baseline:
        drafters.insert(0, (a.baseline, load_drafter(a.baseline)))
    print(f"model {a.model}, cost: plain step {a.step_ms} ms, +{a.row_ms} ms a verified draft token")
    print("\n| workload | drafter | steps | drafted | kept | replayed speed-up |")
    print("|---|---|---:|---:|---:|---:|")
    for name, (p, out) in recorded.items():
        for label, mod in drafters:
            steps = replay(mod, p, out, a.draft_max)
            cost = sum(a.step_ms + a.row_ms * k for k, _ in steps)
            print(f"| {name} ({len(p)}-token prompt) | {label} | {len(steps)} | {sum(k for k, _ in steps)} "
                  f"| {sum(n for _, n in steps)} | {len(out) * a.step_ms / cost:.2f}x |")
            if a.trace:
                i, parts = 0, []
                for k, n in steps:
                    parts.append(f"[{k}/{n}]{lm.tokenizer.decode(out[i:i + n + 1])!r}")
                    i += n + 1
                print(" ".join(parts), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
