"""A segment of several tokens after a cached prefix whose every position's logits are wanted
(speculative decoding's verify step) gives, bit for bit, the logits that decoding those
tokens one at a time gives: greedy output with drafts is plain decoding's, not just close."""
import numpy as np
import pytest

from fixtures import build_tiny, rand_tokens
from llmcore import _kernels
from llmcore.models import load_model

pytestmark = pytest.mark.skipif(not _kernels.ENABLED, reason="LLMCORE_NO_KERNELS=1: the NumPy references "
                                "sum a segment's rows together (close to decode, not bit for bit)")

# (catalogue name or tiny variant, prefix length): GQA (2 query heads per kv head), q8_0 and
# f16 weights, sliding windows (gemma3-swa: 32, gpt-oss: 8 with sinks and MoE), MoE
CASES = [("llama-f32", 40), ("qwen3-q8_0", 75), ("llama-f16", 130), ("gemma3-swa", 90), ("gpt-oss", 50),
         ("qwen3moe-q8_0", 60)]
SEGMENTS = [2, 3, 6, 9, 17]  # 17 = 16 drafts + the last sampled token; with 2 query heads a kv
# head these are 4-34 rows: an f16 K/V read in place up to the kernels' threshold (16 rows with
# AVX-512, 32 with AVX2), converted to f32 above it


def _model(name, tiny_models, built_model):
    return load_model(tiny_models[name] if name in tiny_models else built_model(name))


def segment_vs_decode(m, prefix, seg):
    """(logits of seg evaluated as one segment, logits of seg decoded one token at a time),
    both after `prefix` in the cache (the same blocks: forks of one state)."""
    base = m.new_state()
    m.forward([(base, prefix)])
    a, b = base.fork(), base.fork()
    try:
        together = m.forward([(a, seg)], n_logits=[len(seg)])
        one_by_one = np.concatenate([m.forward([(b, seg[i:i + 1])]) for i in range(len(seg))])
    finally:
        for s in (a, b, base):
            s.release()
    return together, one_by_one


@pytest.mark.parametrize("name,n_prefix", CASES)
def test_verify_segment_logits_equal_sequential_decode(name, n_prefix, tiny_models, built_model):
    m = _model(name, tiny_models, built_model)
    toks = rand_tokens(n_prefix + max(SEGMENTS), seed=n_prefix, n_vocab=min(256, m.n_vocab))
    for k in SEGMENTS:
        together, one_by_one = segment_vs_decode(m, toks[:n_prefix], toks[n_prefix:n_prefix + k])
        np.testing.assert_array_equal(together, one_by_one, err_msg=f"{name}: segment of {k}")


def test_verify_segment_across_an_attention_chunk_boundary(tmp_path):
    """The decode kernel reads the keys in fixed chunks (1024 keys): a segment whose tokens
    end in different chunks still gives each token's decode bits."""
    m = load_model(build_tiny(tmp_path / "long.gguf", "qwen3", "q8_0", context_length=2048))
    toks = rand_tokens(1030, seed=5)
    together, one_by_one = segment_vs_decode(m, toks[:1013], toks[1013:1030])
    np.testing.assert_array_equal(together, one_by_one)

