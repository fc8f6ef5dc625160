"""Shared fixtures: the tiny built models (fixtures.py), the real models when pulled, and the
llama.cpp conformance set when $LLMCORE_CONFORMANCE points at one."""
from pathlib import Path

import pytest

from fixtures import built_model, tiny_models  # noqa: F401  (session fixtures for every module)
from oracle import conformance_dir


@pytest.fixture(scope="session")
def conformance() -> Path:
    d = conformance_dir()
    if d is None:
        pytest.skip("needs llama.cpp's recorded outputs: set LLMCORE_CONFORMANCE to a conformance set "
                    "(models/ + oracle/, made by bench/make_oracle.py)")
    return d


def real_model_path(name: str) -> Path | None:
    from llmcore.pull import model_path

    p = model_path(name)
    return p if p.exists() else None


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    p = real_model_path("smollm2")
    if p is None:
        pytest.skip("SmolLM2 not pulled (run: llmcore pull smollm2)")
    return p


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    p = real_model_path("gemma3-270m")
    if p is None:
        pytest.skip("gemma-3-270m not pulled (run: llmcore pull gemma3-270m)")
    return p


@pytest.fixture(autouse=True)
def strict_block_refcounts(monkeypatch):
    """A freed KV block touched is a failure in tests, never a quiet cache miss."""
    from llmcore.cache import pool

    monkeypatch.setattr(pool, "STRICT_REFCOUNTS", True)


@pytest.fixture
def int8_matmuls():
    """Matmuls of every token count on the int8 kernels (tests of their bits): the AMX-BF16
    path of prefill-sized calls off for the test, then as it was."""
    from llmcore import _kernels

    mods = [_kernels.load(m) for m in ("quants", "kquants")] if _kernels.ENABLED else []
    was = [getattr(m, "AMX_BF16", False) for m in mods]
    for m in mods:
        if hasattr(m, "_set_amx_bf16"):
            m._set_amx_bf16(0)
    yield
    for m, on in zip(mods, was):
        if hasattr(m, "_set_amx_bf16"):
            m._set_amx_bf16(int(on))
