#!/usr/bin/env python3
"""Speculative decoding by prompt lookup vs plain decoding, same engine, same run.

    python bench/speculative.py [-m smollm2] [-t 2] [--reps 3] [--lines 300] [--tokens 512]
                                [--chat-template NAME]   (gemma3-270m: --chat-template gemma)

Two workloads, greedy:
- code edit: the model is shown a file of --lines lines and asked to repeat it with one
  change (what a coding agent's edit looks like); most of the output is in the prompt;
- free text: a question whose answer repeats nothing of the prompt (drafting must not slow
  it down: the drafter backs off when its drafts are rejected).
Each rep runs plain then speculative decoding (alternating which goes first) on the same
prompt; reports generation tokens/s (medians), the ratio (of the medians, and the median of
each rep's own ratio), and how many drafted tokens were kept. Outputs must be identical
(greedy): the script says so.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from llmcore.engine import Engine, EngineConfig, GenParams  # noqa: E402
from llmcore.engine.speculative import SpecParams  # noqa: E402
from llmcore.loader import load_gguf  # noqa: E402
from llmcore.pull import resolve_model  # noqa: E402
from llmcore.sampling import SamplingParams  # noqa: E402


def code_file(n_lines: int) -> str:
    """A plausible Python module of n_lines lines (deterministic)."""
    lines, i = [], 0
    while len(lines) < n_lines:
        lines += [f"def compute_{i}(values, scale={i % 7 + 1}):",
                  f'    """Scale the values by {i % 7 + 1} and add the offset {i}."""',
                  "    out = []",
                  "    for v in values:",
                  f"        out.append(v * scale + {i})",
                  "    return out",
                  ""]
        i += 1
    return "\n".join(lines[:n_lines])


def prompts(tok, tmpl, n_lines: int) -> dict[str, list[int]]:
    src = code_file(n_lines)
    edit = [{"role": "user", "content": "Here is a file:\n```python\n" + src + "\n```\nRepeat the whole file "
             "exactly, changing only the name compute_3 to compute_three. Output only the code."}]
    free = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a "
             "message in a bottle."}]
    out = {}
    for name, msgs in (("code edit", edit), ("free text", free)):
        text = tmpl.render(msgs, add_generation_prompt=True)
        ids = tok.encode(text, add_special=True, parse_special=True)
        if len(ids) > 1 and ids[0] == ids[1] == tok.bos_id:  # the template wrote BOS too
            ids = ids[1:]
        if name == "code edit":  # the assistant has begun its answer: the code block
            ids += tok.encode("```python\n", add_special=False)
        out[name] = ids
    return out


def run(eng: Engine, prompt, n: int, spec) -> tuple[float, list[int], int, int]:
    p = GenParams(n_predict=n, ignore_eos=False, cache_prompt=False, speculative=spec,
                  sampling=SamplingParams(temperature=0.0))
    t0 = time.perf_counter()
    c = eng.generate_sync(prompt, p)
    t = c.final.timings
    gen_s = t.predicted_ms / 1e3 or (time.perf_counter() - t0)
    return len(c.tokens) / gen_s, c.tokens, t.draft_n, t.draft_n_accepted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lines", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--ngram-max", type=int, default=4)
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--chat-template", default=None, help="a built-in or named template (the model's own by default)")
    args = ap.parse_args()
    from llmcore import threads

    threads.set_num_threads(args.threads)
    path = resolve_model(args.model)
    lm = load_gguf(path, template_name=args.chat_template)
    eng = Engine(EngineConfig(n_ctx=8192, n_threads=args.threads, cache_ram_mib=0), model=lm.model,
                 tokenizer=lm.tokenizer, chat_template=lm.chat_template)
    eng.start()
    spec = SpecParams(n_max=args.draft_max, ngram_max=args.ngram_max, ngram_min=min(args.ngram_min, args.ngram_max))
    try:
        for name, prompt in prompts(lm.tokenizer, lm.chat_template, args.lines).items():
            plain, fast, kept, drafted, same = [], [], [], [], True
            for r in range(args.reps):
                order = (False, True) if r % 2 == 0 else (True, False)
                got = {}
                for on in order:
                    got[on] = run(eng, prompt, args.tokens, spec if on else False)
                plain.append(got[False][0])
                fast.append(got[True][0])
                drafted.append(got[True][2])
                kept.append(got[True][3])
                same &= got[True][1] == got[False][1]
            med = statistics.median
            # each rep's two runs are adjacent in time: their ratio is steadier on a shared host
            # than the ratio of the medians when the load drifts between reps
            per_rep = [f / p for f, p in zip(fast, plain)]
            print(f"{name:10} prompt {len(prompt):5d} tok  plain {med(plain):6.1f} t/s  speculative "
                  f"{med(fast):6.1f} t/s  ratio {med(fast) / med(plain):.2f}x (per rep {med(per_rep):.2f}x, "
                  f"{min(per_rep):.2f}-{max(per_rep):.2f})  drafted {med(drafted):.0f} "
                  f"kept {med(kept):.0f}  output {'identical' if same else 'DIFFERENT'}", flush=True)
    finally:
        eng.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
