"""Forward pass vs llama.cpp's recorded outputs on the conformance set (see oracle.py for
the set and the agreement rule); skipped without $LLMCORE_CONFORMANCE."""
import pytest

from llmcore.models import load_model
from oracle import PROMPTS, check, check_within_own_variation, load_oracle, oracle_prompt


@pytest.fixture(scope="module")
def qwen3_f32(conformance):
    return (load_model(conformance / "models" / "tiny-qwen3-f32.gguf", kv_type="f16"),
            load_oracle(conformance, "tiny-qwen3-f32"))


@pytest.fixture(scope="module")
def qwen3_q4km(conformance):
    return load_model(conformance / "models" / "tiny-qwen3-q4_k_m.gguf"), load_oracle(conformance, "tiny-qwen3-q4_k_m")


@pytest.fixture(scope="module")
def smollm2(conformance, smollm2_path):
    return load_model(smollm2_path), load_oracle(conformance, "SmolLM2-135M-Instruct.Q4_1")


@pytest.mark.parametrize("name", PROMPTS)
def test_tiny_qwen3_f32(qwen3_f32, name):
    model, oracle = qwen3_f32
    p, ref = oracle_prompt(oracle, name)
    check(model, p, ref, max_rel_std=2e-3, max_abs_rel=2e-3, noise=0.1)


@pytest.mark.parametrize("name", PROMPTS)
def test_tiny_qwen3_q4_k_m(qwen3_q4km, name):
    model, oracle = qwen3_q4km
    p, ref = oracle_prompt(oracle, name)
    check(model, p, ref, max_rel_std=0.06, noise=0.3)


@pytest.mark.slow
@pytest.mark.parametrize("name", PROMPTS)
def test_smollm2(smollm2, name):
    """Q4_1 layers and a tied Q8_0 head. Activations are quantized as llama.cpp does and the
    integer dots are the same; the float sums of the matmuls run in another order (one fma
    chain per output, not ggml's lanes: 1.6x the prefill throughput) and attention sums in
    its own order (blocked, online softmax); the last-bit differences flip an occasional q8_1
    rounding of the next layer's activations, which 30 layers grow to a few % of the logits
    (rel std ~0.04 on AVX-512 builds): as much as llama.cpp's own flash-attention run moves
    (check_within_own_variation)."""
    model, oracle = smollm2
    p, ref = oracle_prompt(oracle, name)
    last = check(model, p, ref, max_rel_std=0.06, noise=1.0)
    check_within_own_variation(last, p, ref)
