"""The llama.cpp conformance set and the rule for agreeing with it.

A conformance set is a folder with ``models/`` (GGUFs) and ``oracle/`` (per model
``<stem>.json`` and ``<stem>.last_logits.npz``, written by bench/make_oracle.py). Tests find
it through ``$LLMCORE_CONFORMANCE`` and skip without it. Inputs are the oracle's
``prompt_tokens`` (tokenization is tested on its own). ``check`` asserts:
- last-position logits: std(ours - llama.cpp) / std(llama.cpp) under ``max_rel_std`` (F32
  models ~1e-3, quantized ones a few %: llama.cpp rounds activations before quantized
  matmuls), optionally max |diff| / max |logit| under ``max_abs_rel``;
- the same argmax wherever the oracle's top-1/top-2 margin is clear (> MARGIN);
- greedy continuation: llama.cpp's ids, or one of its own alternative runs'
  (alt_flash_attn, alt_f32_kv), or different only from a step where the oracle itself is at
  a near-tie (margin under ``noise``, the size of llama.cpp's flash-attention / F32-KV
  variation); it returns the last-position logits.

``check_within_own_variation`` (dense attention models): max |diff| at most 1.5x what
llama.cpp's own flash-attention / F32-KV runs differ from its primary run by.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

N_GREEDY = 16
MARGIN = 0.3
PROMPTS = ["short", "long", "chat", "unicode"]


def conformance_dir() -> Path | None:
    """$LLMCORE_CONFORMANCE if it holds a conformance set, else None."""
    env = os.environ.get("LLMCORE_CONFORMANCE")
    if env and (Path(env) / "models").is_dir() and (Path(env) / "oracle").is_dir():
        return Path(env)
    return None


def load_oracle(conf: Path, stem: str):
    """(the JSON, [last-position logits per prompt])."""
    d = json.loads((conf / "oracle" / f"{stem}.json").read_text())
    z = np.load(conf / "oracle" / f"{stem}.last_logits.npz")
    return d, [z[f"p{i}"] for i in range(len(d["prompts"]))]


def oracle_prompt(oracle, name):
    """(the prompt's record, its last-position logits)."""
    d, logits = oracle
    i = [p["name"] for p in d["prompts"]].index(name)
    return d["prompts"][i], logits[i]


def margin(top):
    return top[0]["logit"] - top[1]["logit"]


def run_greedy(model, prompt, n):
    """Last-position logits of the prompt and the next n greedy ids."""
    st = model.new_state()
    logits = model.forward([(st, np.asarray(prompt["prompt_tokens"], np.int32))])[0]
    last, gen = logits, []
    for i in range(n):
        gen.append(int(np.argmax(logits)))
        if i + 1 < n:
            logits = model.forward([(st, [gen[-1]])])[0]
    st.release()
    return last, gen


def own_variation(prompt) -> float | None:
    """The largest max |logit difference| between llama.cpp's primary run of a prompt and
    its own alternatives (flash attention on, F32 KV): how much llama.cpp moves when only
    its attention arithmetic changes. None if the oracle has no alternatives."""
    alts = [prompt[k]["max_abs_last_logit_diff_vs_primary"] for k in ("alt_flash_attn", "alt_f32_kv")
            if k in prompt and "max_abs_last_logit_diff_vs_primary" in prompt[k]]
    return max(alts) if alts else None


def check_within_own_variation(last, prompt, ref, factor: float = 1.5) -> None:
    """Our last-position logits differ from llama.cpp's by at most `factor` times what
    llama.cpp's own attention variants differ by: for attention models whose attention sums
    in another order than llama.cpp's (amplified by quantized matmuls, that moves the logits
    by about as much)."""
    var = own_variation(prompt)
    if var is None:
        return
    d = float(np.max(np.abs(np.asarray(last, np.float32) - np.asarray(ref, np.float32))))
    assert d <= factor * var, (f"{prompt['name']}: max |diff| {d:.3f} > {factor} x llama.cpp's own "
                               f"attention variation {var:.3f}")


def check(model, prompt, ref, *, max_rel_std, max_abs_rel=None, noise):
    last, gen = run_greedy(model, prompt, N_GREEDY)
    ref = np.asarray(ref, np.float32)
    diff = last - ref
    rel_std = float(np.std(diff) / np.std(ref))
    assert rel_std < max_rel_std, f"{prompt['name']}: rel std {rel_std:.4f}"
    if max_abs_rel is not None:
        rel = float(np.max(np.abs(diff)) / np.max(np.abs(ref)))
        assert rel < max_abs_rel, f"{prompt['name']}: max |diff| / max |logit| = {rel:.2e}"
    if margin(prompt["last_top5"]) > MARGIN:
        assert int(np.argmax(last)) == int(np.argmax(ref)), f"{prompt['name']}: argmax differs"
    want = [int(x) for x in prompt["generated"][:N_GREEDY]]
    if gen == want:
        return last
    alts = [prompt[k].get("generated", [])[:N_GREEDY] for k in ("alt_flash_attn", "alt_f32_kv") if k in prompt]
    if any([int(x) for x in a] == gen for a in alts):
        return last
    i = next(i for i, (a, b) in enumerate(zip(gen, want)) if a != b)
    m = margin(prompt["gen_top5"][i])
    assert m < noise, (f"{prompt['name']}: greedy differs at step {i} ({gen[i]} vs {want[i]}) "
                       f"where the oracle's margin is {m:.3f}")
    return last
