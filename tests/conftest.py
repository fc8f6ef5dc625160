import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def conformance_dir() -> Path | None:
    """../shared/conformance beside the repo, or $LLMCORE_CONFORMANCE."""
    env = os.environ.get("LLMCORE_CONFORMANCE")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "conformance"]:
        if (cand / "models").is_dir() and (cand / "oracle").is_dir():
            return cand
    return None


@pytest.fixture(scope="session")
def conformance() -> Path:
    d = conformance_dir()
    if d is None:
        pytest.skip("conformance set not found (set LLMCORE_CONFORMANCE or place shared/conformance beside the repo)")
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
