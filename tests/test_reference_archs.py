"""The NumPy reference forwards (tests/reference_archs.py) agree with llama.cpp.

Oracle: the conformance set ($LLMCORE_CONFORMANCE, see oracle.py; skipped without it).
Agreement measure: rel = std(ref - oracle) / std(oracle) over the full last-position logits;
argmax must match where the oracle's top-1/top-2 margin is > 0.3. ``emulate=True``
reproduces llama.cpp's activation and F16-KV rounding, so quantized models land well inside
the 1.5-5 % that plain float math gets.
"""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest

import reference_archs as R
from fixtures import TOKENIZER_VOCAB
from oracle import MARGIN

# model -> (arch, max rel with emulate=True, max rel plain float math)
MODELS = {
    "tiny-qwen3moe-f16": ("qwen3moe", 2e-3, 2e-3),
    "tiny-qwen3moe-q8_0": ("qwen3moe", 0.05, 0.08),
    "tiny-qwen3moe-q4_k": ("qwen3moe", 0.05, 0.08),
    "tiny-gemma3-swa": ("gemma3", 0.03, 0.05),
    "tiny-gpt-oss": ("gpt-oss", 0.05, 0.10),
    "tiny-mamba": ("mamba", 0.02, 0.05),
    "tiny-mamba2": ("mamba2", 0.02, 0.05),
    "tiny-lfm2": ("lfm2", 0.03, 0.08),
}


@functools.lru_cache(maxsize=None)
def _load(path: str):
    return R.load_gguf(path)


def _oracle(conformance, model):
    o = json.loads((conformance / "oracle" / f"{model}.json").read_text())
    z = np.load(conformance / "oracle" / f"{model}.last_logits.npz")
    return o, z


def _check(W, meta, oracle, npz, prompts, tol, emulate):
    for i, p in enumerate(oracle["prompts"]):
        if p["name"] not in prompts:
            continue
        ref = npz[f"p{i}"].astype(np.float64)
        lg = R.forward(W, meta, p["prompt_tokens"], emulate=emulate, last_only=True)
        assert lg.shape == (1, ref.shape[0])
        lg = lg[0].astype(np.float64)
        assert np.isfinite(lg).all()
        rel = (lg - ref).std() / ref.std()
        assert rel < tol, f"{p['name']}: rel {rel:.3g} >= {tol}"
        top2 = np.sort(ref)[-2:]
        if top2[1] - top2[0] > MARGIN:
            assert lg.argmax() == ref.argmax(), f"{p['name']}: argmax {lg.argmax()} != {ref.argmax()}"
        # the greedy first generated token is the oracle's argmax
        assert p["generated"][0] == int(ref.argmax())


ALL = ("short", "long", "chat", "unicode")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_reference_matches_llama_cpp(conformance, model):
    arch, tol_em, _ = MODELS[model]
    W, meta = _load(str(conformance / "models" / f"{model}.gguf"))
    assert meta["general.architecture"] == arch
    o, z = _oracle(conformance, model)
    _check(W, meta, o, z, ALL, tol_em, emulate=True)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_reference_plain_float(conformance, model):
    """Without rounding emulation (what a float32 port computes), on two prompts."""
    _, _, tol = MODELS[model]
    W, meta = _load(str(conformance / "models" / f"{model}.gguf"))
    o, z = _oracle(conformance, model)
    _check(W, meta, o, z, ("short", "chat"), tol, emulate=False)


@pytest.mark.parametrize("model,key", [("tiny-gemma3-swa", "gemma3.attention.sliding_window"),
                                       ("tiny-gpt-oss", "gpt-oss.attention.sliding_window")])
def test_sliding_window_matters(conformance, model, key):
    """The 327-token prompt crosses the 32-token window: ignoring it breaks agreement, so
    the passing test above really checks the banded mask."""
    W, meta = _load(str(conformance / "models" / f"{model}.gguf"))
    o, z = _oracle(conformance, model)
    i = [p["name"] for p in o["prompts"]].index("long")
    toks = o["prompts"][i]["prompt_tokens"]
    assert len(toks) > 4 * meta[key]
    ref = z[f"p{i}"].astype(np.float64)
    wide = dict(meta)
    wide[key] = 1 << 20
    lg = R.forward(W, wide, toks, emulate=True, last_only=True)[0]
    assert (lg - ref).std() / ref.std() > 0.1


def test_gpt_oss_sinks_and_swiglu_matter(conformance):
    """Zeroed sinks / an unclamped SwiGLU move the logits far outside the tolerance."""
    model = "tiny-gpt-oss"
    W, meta = _load(str(conformance / "models" / f"{model}.gguf"))
    o, z = _oracle(conformance, model)
    toks = o["prompts"][0]["prompt_tokens"]
    ref = z["p0"].astype(np.float64)
    W2 = R.RefWeights({k: (np.full_like(v, -1e9) if k.endswith("attn_sinks.weight") else v) for k, v in W.items()})
    W2.types = W.types
    lg = R.forward(W2, meta, toks, emulate=True, last_only=True)[0]
    assert (lg - ref).std() / ref.std() > 0.05


def test_full_logits_shape_and_causality(built_model):
    """forward returns (n, vocab); position t only depends on tokens[:t+1]."""
    W, meta = _load(str(built_model("lfm2")))
    toks = [1, 50, 357, 282, 46, 314, 42, 7]
    full = R.forward(W, meta, toks)
    assert full.shape == (len(toks), TOKENIZER_VOCAB)
    head = R.forward(W, meta, toks[:5])
    np.testing.assert_allclose(full[:5], head, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_gemma3_270m_real(gemma3_path, conformance):
    W, meta = R.load_gguf(gemma3_path)
    o, z = _oracle(conformance, "gemma-3-270m-q4_k_m")
    # real model: llama.cpp's own F32-KV / flash-attn noise is 0.9-1.4 in max |diff|
    _check(W, meta, o, z, ("short", "chat", "long"), 0.06, emulate=False)
