"""bench/make_oracle.py records what tests/oracle.py reads, and llmcore agrees with it on a
tiny built model (tokens, pieces, logits, greedy continuation). Needs llama-cpp-python
(pip install -e '.[bench]'); run in a child process so llama.cpp's threads stay out of ours."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmcore.gguf_file import GGUFFile
from llmcore.models import load_model
from llmcore.tokenizer import Tokenizer
from oracle import MARGIN, N_GREEDY, PROMPTS, check, load_oracle, oracle_prompt

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "make_oracle.py"


@pytest.fixture(scope="module")
def recorded(built_model, tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="needs llama.cpp: pip install -e '.[bench]'")
    path = built_model("chat")
    conf = tmp_path_factory.mktemp("conformance")
    r = subprocess.run([sys.executable, str(SCRIPT), str(path), "--out", str(conf / "oracle"), "--no-alt"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return path, load_oracle(conf, path.stem)


def test_record_format(recorded):
    path, oracle = recorded
    d, logits = oracle
    assert d["model"] == path.name and [p["name"] for p in d["prompts"]] == PROMPTS
    assert d["config"]["use_extra_bufts"] is False and d["config"]["flash_attn_type"] == 0
    for p, lg in zip(d["prompts"], logits):
        assert lg.shape == (d["n_vocab"],) and lg.dtype == np.float32
        assert [t["id"] for t in p["last_top5"]] == list(np.lexsort((np.arange(len(lg)), -lg))[:5])
        assert len(p["generated"]) == len(p["gen_top5"]) == len(p["generated_is_eog"]) >= N_GREEDY
        assert p["generated"][0] == p["last_top5"][0]["id"]
    sp = d["split_prefill"]
    assert sum(sp["calls"]) == sum(sp["primary_calls"]) == sp["n_prompt_tokens"]
    assert sp["max_abs_last_logit_diff_vs_primary"] < 1e-3  # the KV cache carried over


@pytest.mark.parametrize("name", PROMPTS)
def test_llmcore_agrees(recorded, name):
    path, oracle = recorded
    p, ref = oracle_prompt(oracle, name)
    tok = Tokenizer.from_gguf(GGUFFile(path))
    ids = tok.encode(p["text"], add_special=True, parse_special=True)
    assert ids == p["prompt_tokens"] and [tok.piece(i) for i in ids] == p["prompt_pieces"]
    assert tok.decode(p["generated"]) == p["generated_text"]
    # Q8_0 weights: a few % (llama.cpp rounds the activations before each quantized matmul)
    check(load_model(path), p, ref, max_rel_std=0.03, noise=MARGIN)
