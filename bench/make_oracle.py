#!/usr/bin/env python3
"""Record llama.cpp's outputs for GGUF models: the oracle that tests/test_conformance.py and
bench/conformance.py compare llmcore with.

    python bench/make_oracle.py MODEL.gguf [MODEL.gguf ...] --out DIR [--no-alt] [-v]

Writes DIR/<stem>.json and DIR/<stem>.last_logits.npz per model. A conformance set is a
folder with the models in models/ and this output in oracle/ (point $LLMCORE_CONFORMANCE at
it). For each of the four PROMPTS the JSON holds:
  prompt_tokens, prompt_pieces   llama_tokenize (BOS as the vocabulary says, special tokens
                                 parsed) and each token's piece (special tokens as text)
  last_top5, last_logits_stats   at the last prompt position; the full float32 logits are
                                 the npz's p<i> (i = the prompt's index)
  generated, gen_top5            N_GEN greedy ids (argmax, lowest id on ties, end of
                                 generation does not stop) and the top-5 each was taken from
  generated_is_eog, generated_text
  alt_flash_attn, alt_f32_kv     (unless --no-alt) the same run with flash attention on, and
                                 with an F32 KV cache: llama.cpp's own numeric noise
and once per model, split_prefill: the long prompt decoded in two llama_decode calls instead
of one, compared with the one-call logits (the KV cache / recurrent state carries over), and
the second half decoded alone as the scale of that difference.

Run settings (in every JSON under "config"): CPU only, 2 threads, n_ctx 2048, prompts decoded
in one 512-token batch per chunk with only the last position's logits, F16 KV, flash
attention off, memory cleared before each prompt, and use_extra_bufts off: no AMX or other
CPU weight repacking (the AMX path of ggml 0.25.3 crashed on some machines, and repacking
changes the summation order by machine). Needs llama-cpp-python (pip install -e '.[bench]').
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

N_GEN = 32

PROMPTS = [
    ("short", "The capital of France is"),
    # 325-327 tokens on a 49k vocabulary: crosses every 32-token sliding window
    ("long",
     "The history of the printing press is, in many ways, the history of how ideas learned to travel. "
     "Before Johannes Gutenberg built his press in Mainz around 1440, books were copied by hand, usually "
     "by monks working in quiet scriptoria, and a single Bible could take a skilled scribe more than a year "
     "to finish. Gutenberg combined several existing technologies: the screw press, which had long been used "
     "to make wine and olive oil; oil-based inks that adhered well to metal; and, most importantly, movable "
     "type cast from an alloy of lead, tin and antimony. Each letter could be arranged into lines, inked, "
     "pressed onto paper, and then reused for the next page. Within fifty years, presses were operating in "
     "more than 250 European cities, and an estimated 20 million volumes had been printed. The consequences "
     "were enormous. Scientific results could be shared quickly and checked by readers far away; maps, "
     "calendars and tables became cheaper and more accurate; and ordinary people, not only scholars and "
     "priests, began to own books. Historians still debate how much the press caused the Reformation, the "
     "Scientific Revolution and the rise of modern newspapers, but few doubt that it accelerated all three. "
     "Today, when a message can cross the planet in less than a second, it is worth remembering that the "
     "first great leap in the speed of information came from a wooden machine, a tray of metal letters, and "
     "a goldsmith who was, for most of his life, deeply in debt. In the end, his workshop was taken over by "
     "his creditors, yet the invention itself could not be taken back."),
    ("chat",
     "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
     "<|im_start|>user\nWhat is 17 * 23? Answer briefly.<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("unicode",
     "Héllo wörld! Ünïcödé: 日本語テキスト, emoji 🦙🚀, numbers 1234567 3.14159,\n"
     "code:\n\tdef f(x):\n\t\treturn x**2  # comment\n\n\n   trailing   "),
]


@dataclass(frozen=True)
class Settings:
    n_threads: int = 2
    n_ctx: int = 2048
    n_batch: int = 512  # = n_ubatch: a prompt chunk is one llama_decode call
    flash_attn: bool = False
    kv_f32: bool = False


def top5(logits: np.ndarray) -> list[dict]:
    """The five largest logits, ties broken by the lower id."""
    order = np.lexsort((np.arange(len(logits)), -logits))[:5]
    return [{"id": int(i), "logit": float(logits[i])} for i in order]


class LlamaCpp:
    """One model and one context of llama.cpp (llama-cpp-python's C API), CPU only."""

    def __init__(self, lib, path: Path):
        self.L = lib
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = False
        self.model = lib.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.ctx = None
        self.settings: Settings | None = None

    def open_context(self, s: Settings) -> None:
        L = self.L
        if self.ctx:
            L.llama_free(self.ctx)
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = s.n_ctx, s.n_batch, s.n_batch, 1
        cp.n_threads = cp.n_threads_batch = s.n_threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if s.flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        if s.kv_f32:
            cp.type_k = cp.type_v = L.GGML_TYPE_F32
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp cannot create a context")
        self.settings = s
        self.cparams = {"n_ctx": cp.n_ctx, "n_batch": cp.n_batch, "n_ubatch": cp.n_ubatch,
                        "n_threads": cp.n_threads, "n_threads_batch": cp.n_threads_batch,
                        "flash_attn_type": cp.flash_attn_type, "type_k": cp.type_k, "type_v": cp.type_v,
                        "swa_full": bool(cp.swa_full)}

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        cap = len(data) + 8
        while True:
            buf = (self.L.llama_token * cap)()
            n = self.L.llama_tokenize(self.vocab, data, len(data), buf, cap, True, True)
            if n >= 0:
                return list(buf[:n])
            cap = -n  # too small: llama.cpp says how many it needs

    def piece(self, token: int) -> str:
        buf = ctypes.create_string_buffer(256)
        n = self.L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:max(n, 0)].decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(self.L.llama_vocab_is_eog(self.vocab, token))

    def clear(self) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def decode(self, tokens: list[int]) -> np.ndarray:
        """Append ``tokens`` to the sequence in one llama_decode; the last position's logits."""
        if len(tokens) > self.settings.n_batch:  # llama.cpp would abort the process
            raise ValueError(f"{len(tokens)} tokens in one llama_decode, n_batch is {self.settings.n_batch}")
        arr = (self.L.llama_token * len(tokens))(*tokens)
        rc = self.L.llama_decode(self.ctx, self.L.llama_batch_get_one(arr, len(tokens)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        out = self.L.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(out, shape=(self.n_vocab,)).astype(np.float32)

    def chunks(self, n: int) -> list[int]:
        """Sizes of the llama_decode calls for n tokens: n_batch each, the rest last."""
        step = self.settings.n_batch
        return [min(step, n - i) for i in range(0, n, step)]

    def feed(self, tokens: list[int]) -> np.ndarray:
        """Append ``tokens`` in chunks of n_batch; the last position's logits."""
        i = 0
        for n in self.chunks(len(tokens)):
            logits = self.decode(tokens[i:i + n])
            i += n
        return logits

    def prefill(self, tokens: list[int]) -> np.ndarray:
        self.clear()
        return self.feed(tokens)

    def greedy(self, tokens: list[int], n: int):
        """(last prompt logits, n greedy ids, the top-5 at each step)."""
        last = logits = self.prefill(tokens)
        ids, tops = [], []
        for _ in range(n):
            tops.append(top5(logits))
            ids.append(int(np.argmax(logits)))  # first maximum: the lowest id on ties
            logits = self.decode([ids[-1]])
        return last, ids, tops

    def close(self) -> None:
        if self.ctx:
            self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def gguf_metadata(path: Path) -> dict:
    """The GGUF's key/values, without the tokenizer's arrays and the chat template."""
    import gguf

    keep_tok = {"tokenizer.ggml.model", "tokenizer.ggml.pre"}
    out = {}
    for key, field in gguf.GGUFReader(str(path)).fields.items():
        if key.startswith("GGUF.") or key == "tokenizer.chat_template":
            continue
        if key.startswith("tokenizer.ggml.") and key not in keep_tok and not key.endswith("_id") \
                and not key.startswith("tokenizer.ggml.add_"):
            continue
        out[key] = field.contents()
    return out


def build_info(lib) -> dict:
    libdir = os.path.join(os.path.dirname(lib.__file__), "lib")
    return {"llama_cpp_python": lib.__version__,
            "shared_libs": sorted(os.path.basename(f) for f in glob.glob(os.path.join(libdir, "lib*.so.*.*.*"))),
            "system_info": lib.llama_print_system_info().decode(),
            "machine": platform.machine()}


def record_prompt(r: LlamaCpp, name: str, text: str):
    toks = r.tokenize(text)
    last, gen, tops = r.greedy(toks, N_GEN)
    rec = {"name": name, "text": text, "n_prompt_tokens": len(toks), "prompt_tokens": toks,
           "prompt_pieces": [r.piece(t) for t in toks], "last_top5": top5(last),
           "last_logits_stats": {"min": float(last.min()), "max": float(last.max()), "mean": float(last.mean()),
                                 "std": float(last.std()), "all_finite": bool(np.isfinite(last).all())},
           "generated": gen, "generated_is_eog": [r.is_eog(t) for t in gen], "gen_top5": tops,
           "generated_text": "".join(r.piece(t) for t in gen)}
    return rec, last


def record_split_prefill(r: LlamaCpp, rec: dict, one_call: np.ndarray) -> dict:
    """The prompt fed as its first half, then the rest (each in chunks of at most n_batch),
    vs the primary run's chunks of n_batch."""
    toks = rec["prompt_tokens"]
    h = len(toks) // 2
    r.clear()
    r.feed(toks[:h])
    two_calls = r.feed(toks[h:])
    r.clear()
    alone = r.feed(toks[h:])
    return {"prompt": rec["name"], "n_prompt_tokens": len(toks), "calls": r.chunks(h) + r.chunks(len(toks) - h),
            "primary_calls": r.chunks(len(toks)),
            "last_top5": top5(two_calls),
            "max_abs_last_logit_diff_vs_primary": float(np.abs(two_calls - one_call).max()),
            "top1_matches_primary": int(np.argmax(two_calls)) == int(np.argmax(one_call)),
            "max_abs_last_logit_diff_second_half_alone": float(np.abs(alone - one_call).max())}


def record_model(lib, path: Path, out: Path, alt: bool, settings: Settings) -> dict:
    t0 = time.time()
    r = LlamaCpp(lib, path)
    try:
        r.open_context(settings)
        res = {"model": path.name, "metadata": gguf_metadata(path), "n_vocab": r.n_vocab,
               "config": {**r.cparams, "use_extra_bufts": False, "n_gpu_layers": 0,
                          "sampling": "greedy argmax over raw logits (lowest id on ties), no penalties",
                          "n_gen": N_GEN, "stop_on_eog": False,
                          "prompt_decode": f"one llama_decode per <={settings.n_batch}-token chunk, "
                                           "logits only for the last position",
                          **build_info(lib)},
               "prompts": []}
        last = {}
        for i, (name, text) in enumerate(PROMPTS):
            rec, last[i] = record_prompt(r, name, text)
            res["prompts"].append(rec)
        i_long = [n for n, _ in PROMPTS].index("long")
        res["split_prefill"] = record_split_prefill(r, res["prompts"][i_long], last[i_long])
        if alt:
            for key, s in (("alt_flash_attn", replace(settings, flash_attn=True)),
                           ("alt_f32_kv", replace(settings, kv_f32=True))):
                r.open_context(s)
                for i, rec in enumerate(res["prompts"]):
                    lg, gen, _ = r.greedy(rec["prompt_tokens"], N_GEN)
                    rec[key] = {"config": {k: r.cparams[k] for k in ("flash_attn_type", "type_k", "type_v")},
                                "last_top5": top5(lg), "generated": gen,
                                "max_abs_last_logit_diff_vs_primary": float(np.abs(lg - last[i]).max()),
                                "generated_matches_primary": gen == rec["generated"]}
    finally:
        r.close()
    res["seconds"] = round(time.time() - t0, 2)
    (out / f"{path.stem}.json").write_text(json.dumps(res, indent=1, ensure_ascii=False))
    np.savez(out / f"{path.stem}.last_logits.npz", **{f"p{i}": v for i, v in last.items()})
    return res


def summary(res: dict) -> str:
    lines = [f"{res['model']} ({res['seconds']} s)"]
    for p in res["prompts"]:
        line = f"  {p['name']:8} {p['n_prompt_tokens']:4} tokens  top1 {p['last_top5'][0]['id']}  gen {p['generated'][:6]}"
        for key, label in (("alt_flash_attn", "FA"), ("alt_f32_kv", "f32 KV")):
            if key in p:
                a = p[key]
                line += (f"  | {label}: max|dlogit| {a['max_abs_last_logit_diff_vs_primary']:.2e}"
                         f" same gen {a['generated_matches_primary']}")
        lines.append(line)
    sp = res["split_prefill"]
    lines.append(f"  split prefill {sp['calls']}: max|dlogit| {sp['max_abs_last_logit_diff_vs_primary']:.2e}"
                 f" (second half alone {sp['max_abs_last_logit_diff_second_half_alone']:.2e})")
    return "\n".join(lines)


GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR = 3, 4  # ggml.h's enum ggml_log_level


def quiet_llama_logs(lib) -> None:
    """Only llama.cpp's warnings and errors on stderr (the callback must outlive the run:
    kept on lib)."""
    @lib.llama_log_callback
    def cb(level, text, _user):
        if level in (GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR):
            sys.stderr.write(text.decode("utf-8", "replace"))

    lib._llmcore_log_cb = cb
    lib.llama_log_set(cb, ctypes.c_void_p(0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path, help="GGUF files")
    ap.add_argument("--out", type=Path, required=True, help="folder for <stem>.json and <stem>.last_logits.npz")
    ap.add_argument("--no-alt", action="store_true", help="skip the flash-attention and F32-KV re-runs")
    ap.add_argument("-t", "--threads", type=int, default=Settings.n_threads)
    ap.add_argument("-v", "--verbose", action="store_true", help="llama.cpp's own log too")
    a = ap.parse_args(argv)
    try:
        import llama_cpp as lib
    except ImportError as e:
        print(f"llama-cpp-python is needed ({e}): pip install -e '.[bench]'", file=sys.stderr)
        return 2
    missing = [p for p in a.models if not p.is_file()]
    if missing:
        print(f"no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    if not a.verbose:
        quiet_llama_logs(lib)
    lib.llama_backend_init()
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        for path in a.models:
            print(summary(record_model(lib, path, a.out, not a.no_alt, Settings(n_threads=a.threads))), flush=True)
    finally:
        lib.llama_backend_free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
