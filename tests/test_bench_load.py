"""`llmcore bench load` (bench/load.py): a load run against a real `llmcore serve` on the
tiny chat model writes its table, JSON and plot with sane numbers, and the CI soak: 30
seconds at parallel 8 with every cache layer on (slots, RAM, disk tier), no failed request,
the server alive and its RSS within the memory plan it announced at start."""
from __future__ import annotations

import json
import subprocess
import urllib.request
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import load  # noqa: E402
from serve_load import ServerProcess  # noqa: E402


@pytest.fixture(scope="module")
def server(built_model, tmp_path_factory):
    cache = tmp_path_factory.mktemp("disk_tier")  # small RAM cache: entries go to disk and come back
    with ServerProcess(["-m", str(built_model("chat")), "-np", "8", "-c", "16384", "--log-level", "warning",
                        "--cache-ram", "1", "--cache-dir", str(cache), "--cache-disk", "64"]) as srv:
        yield srv


def args(srv, **kw):
    base = dict(url=srv.url, parallel=[1, 4], number=[4, 8], min_prompt_length=32, max_prompt_length=96,
                min_tokens=6, max_tokens=6, prefix_length=16, turns=2, quiet=True)
    base.update(kw)
    return load.Args(**base)


def test_load_levels_json_and_plot(server, tmp_path):
    import asyncio

    rep = asyncio.run(load.run(args(server, output=str(tmp_path))))
    assert rep["passed"]
    lv = rep["levels"]
    assert [x["parallel"] for x in lv] == [1, 4] and [x["ok"] for x in lv] == [4, 8]
    for x in lv:
        assert x["failed"] == 0 and x["output_tokens"] == 6 * x["ok"]
        assert 0 < x["ttft_p50"] <= x["ttft_p99"] and x["output_tps"] > 0 and x["total_tps"] > x["output_tps"]
        assert x["cache_share"] > 0  # the conversations came back (and share a system prompt)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["levels"] == lv and saved["token_count"] == "/tokenize"
    png = (tmp_path / "load.png").read_bytes() if (tmp_path / "load.png").exists() else None
    if png is not None:
        assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_soak_30_seconds_parallel_8(server, tmp_path):
    """The reduced soak CI runs: the command line, 30 s, returning conversations."""
    out = subprocess.run(
        [sys.executable, "-m", "llmcore.cli", "bench", "load", "--url", server.url, "--parallel", "8",
         "--duration", "0.5", "--min-prompt-length", "32", "--max-prompt-length", "160", "--min-tokens", "4",
         "--max-tokens", "12", "--prefix-length", "24", "--turns", "3", "--pid", str(server.proc.pid),
         "--output", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    rep = json.loads((tmp_path / "results.json").read_text())
    soak = rep["soak"]
    assert soak["passed"] and not soak["failures"] and soak["seconds"] >= 30
    assert soak["rss_peak"] <= soak["limit"] and len(soak["rss"]) >= 25
    (lv,) = rep["levels"]
    assert lv["failed"] == 0 and lv["ok"] > 20 and lv["cache_share"] > 0.2
    assert server.alive()
    metrics = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    vals = {k: float(v) for k, v in (ln.split(" ", 1) for ln in metrics.splitlines() if ln and ln[0] != "#")}
    assert vals["llmcore:disk_cache_writes_total"] > 0 and vals["llmcore:disk_cache_write_failures_total"] == 0
