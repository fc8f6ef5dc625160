"""llama.cpp through llama-cpp-python (PyPI), low-level API: the peer in every benchmark.

Weights are loaded with `use_extra_bufts = False`: llama.cpp's AMX buffer type (and with it
the CPU repacking) crashed on some machines (ggml 0.25.3: SIGSEGV in the AMX matmul on any
decode of 2 or more tokens), and the reference outputs (bench/make_oracle.py) are made the
same way.
"""
from __future__ import annotations

import ctypes
import sys
import time

import numpy as np


def available() -> str | None:
    """None if llama_cpp imports, else the reason it does not."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"llama-cpp-python not importable ({e}); pip install llama-cpp-python==0.3.36"
    return None


class LlamaCpp:
    def __init__(self, path: str, n_threads: int, n_ctx: int = 4096, n_batch: int = 512, n_seq: int = 1,
                 kv_unified: bool = True, flash_attn: str = "auto", cache_type: str = "f16"):
        import llama_cpp as L

        self.L = L

        @L.llama_log_callback
        def _quiet(level, text, user_data):  # errors only
            if level == 3:
                sys.stderr.write(text.decode("utf-8", "replace"))

        self._cb = _quiet
        L.llama_log_set(self._cb, ctypes.c_void_p(0))
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = False
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp failed to load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_seq_max = n_seq
        cp.kv_unified = kv_unified  # like llmcore (and llama-server's default): n_ctx shared by all sequences
        cp.n_threads = n_threads
        cp.n_threads_batch = n_threads
        cp.no_perf = True
        # "auto" is llama.cpp's default (on for the CPU); "on" / "off" force it
        cp.flash_attn_type = {"auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO, "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                              "off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED}[flash_attn]
        if cache_type != "f16":  # -ctk / -ctv (a quantized V needs flash attention: auto gives it)
            cp.type_k = cp.type_v = {"q8_0": L.GGML_TYPE_Q8_0, "q4_0": L.GGML_TYPE_Q4_0, "f32": L.GGML_TYPE_F32}[cache_type]
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp failed to create a context")
        self.n_batch = n_batch

    def clear(self):
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def decode(self, toks) -> None:
        L = self.L
        arr = (L.llama_token * len(toks))(*[int(t) for t in toks])
        rc = L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(toks)))
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def logits(self) -> np.ndarray:
        p = self.L.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(p, shape=(self.n_vocab,))

    def prefill(self, toks) -> float:
        """Seconds to process `toks` from an empty cache."""
        self.clear()
        t0 = time.perf_counter()
        for i in range(0, len(toks), self.n_batch):
            self.decode(toks[i:i + self.n_batch])
        return time.perf_counter() - t0

    def depth(self, toks, n: int) -> dict:
        """bench/depth.py's rep: prefill `toks` from an empty cache (per-ubatch times), then n
        greedy tokens behind them."""
        self.clear()
        chunks = []
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(0, len(toks), self.n_batch):
            ts = time.perf_counter()
            self.decode(toks[i:i + self.n_batch])
            chunks.append(time.perf_counter() - ts)
        pp, pp_cpu = time.perf_counter() - t0, time.process_time() - c0
        t = int(np.argmax(self.logits()))
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            self.decode([t])
            t = int(np.argmax(self.logits()))
        tg, tg_cpu = time.perf_counter() - t0, time.process_time() - c0
        # *_cpu: t/s per CPU-second of the process (with 1 thread: what the work costs, whatever
        # else runs on the machine; with more, llama.cpp's spinning threads count too)
        return {"pp": len(toks) / pp, "pp_last": min(self.n_batch, len(toks)) / chunks[-1], "tg": n / tg,
                "pp_cpu": len(toks) / pp_cpu, "tg_cpu": n / tg_cpu}

    def generate(self, toks, n: int) -> float:
        """Seconds to generate n tokens greedily after prefilling `toks` (not timed)."""
        self.prefill(toks)
        t = int(np.argmax(self.logits()))
        t0 = time.perf_counter()
        for _ in range(n):
            self.decode([t])
            t = int(np.argmax(self.logits()))
        return time.perf_counter() - t0

    def decode_parallel(self, prompts, n_gen: int) -> float:
        """Aggregate decode: one sequence per prompt, all advanced in one batch per step.

        Returns seconds for the n_gen batched decode steps (prefill not timed).
        """
        L = self.L
        self.clear()
        n_seq = len(prompts)
        nxt = []
        for s, toks in enumerate(prompts):
            for i in range(0, len(toks), self.n_batch):
                self._batch_decode([(t, i + p, s) for p, t in enumerate(toks[i:i + self.n_batch])], last_only=True)
            nxt.append(int(np.argmax(self.logits())))  # greedy first token from the prompt's logits
        pos = [len(t) for t in prompts]
        t0 = time.perf_counter()
        for _ in range(n_gen):
            self._batch_decode([(nxt[s], pos[s], s) for s in range(n_seq)], last_only=False)
            for s in range(n_seq):
                p = L.llama_get_logits_ith(self.ctx, s)
                nxt[s] = int(np.argmax(np.ctypeslib.as_array(p, shape=(self.n_vocab,))))
                pos[s] += 1
        return time.perf_counter() - t0

    def _batch_decode(self, items, last_only: bool):
        L = self.L
        b = L.llama_batch_init(len(items), 0, 1)
        try:
            for i, (tok, pos, seq) in enumerate(items):
                b.token[i] = tok
                b.pos[i] = pos
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = (i == len(items) - 1) if last_only else True
            b.n_tokens = len(items)
            rc = L.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
        finally:
            L.llama_batch_free(b)

    def close(self):
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def _main(argv=None) -> int:
    """One measurement in a child process, so llama.cpp runs with its own OpenMP settings
    (llmcore sets OMP_WAIT_POLICY=PASSIVE for itself; llama.cpp's default is to spin)."""
    import argparse
    import json

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--depth", type=int, default=0, help="bench/depth.py mode: prefill of DEPTH tokens, tg behind it")
    ap.add_argument("--ub", type=int, default=512)
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    a = ap.parse_args(argv)
    if a.depth:
        m = LlamaCpp(a.model, a.threads, n_ctx=a.depth + a.tg + 64, n_batch=a.ub, flash_attn=a.flash_attn)
        rng = np.random.default_rng(a.seed)
        prompt = rng.integers(100, min(m.n_vocab, 30000), a.depth).tolist()
        m.depth(prompt[:1024], 2)  # warm-up
        out: dict = {}
        for _ in range(a.reps):
            for k, v in m.depth(prompt, a.tg).items():
                out.setdefault(k, []).append(v)
        m.close()
        print("RESULT " + json.dumps(out), flush=True)
        return 0
    m = LlamaCpp(a.model, a.threads, n_ctx=a.pp + a.tg + 64)
    rng = np.random.default_rng(a.seed)
    prompt = rng.integers(100, min(m.n_vocab, 30000), a.pp).tolist()
    m.prefill(prompt[:64])
    m.generate(prompt[:16], 4)
    out = {"pp": [], "tg": []}
    for _ in range(a.reps):
        out["pp"].append(a.pp / m.prefill(prompt))
        out["tg"].append(a.tg / m.generate(prompt[:16], a.tg))
    m.close()
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def measure_in_subprocess(model: str, threads: int, pp: int, tg: int, reps: int = 1, seed: int = 0) -> dict:
    """Run `_main` in a fresh interpreter with the parent's environment minus llmcore's
    OpenMP wait policy; returns {"pp": [t/s...], "tg": [t/s...]}."""
    return _run_child([model, "-t", str(threads), "--pp", str(pp), "--tg", str(tg), "--reps", str(reps),
                       "--seed", str(seed)])


def measure_depth_in_subprocess(model: str, threads: int, depth: int, tg: int, reps: int = 1, seed: int = 0,
                                ub: int = 512, flash_attn: str = "auto") -> dict:
    """bench/depth.py's measurement in a child process: {"pp", "pp_last", "tg": [t/s...]}."""
    return _run_child([model, "-t", str(threads), "--depth", str(depth), "--tg", str(tg), "--reps", str(reps),
                       "--seed", str(seed), "--ub", str(ub), "--flash-attn", flash_attn])


def _run_child(args: list[str]) -> dict:
    import json
    import os
    import subprocess

    env = dict(os.environ)
    if env.get("LLMCORE_SET_OMP_WAIT_POLICY") == "1":  # set by llmcore, not by the user
        env.pop("OMP_WAIT_POLICY", None)
    if env.get("LLMCORE_SET_GOMP_SPINCOUNT") == "1":
        env.pop("GOMP_SPINCOUNT", None)
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"llama.cpp peer failed: {res.stderr.strip()[-500:]}")


if __name__ == "__main__":
    sys.exit(_main())
