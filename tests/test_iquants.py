"""IQ4_NL / IQ4_XS kernels (pyx/iquants.pyx): exact dequantization vs gguf.quants, integer
matmul vs float references, bit-exact agreement with llama.cpp's own matmuls (through its
ggml library, where llama-cpp-python is installed), and a tiny MoE model with i-quant
weights vs the NumPy reference."""
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT

iq = pytest.importorskip("llmcore._kernels.iquants")

import ggml_ops  # noqa: E402
import reference_archs as R  # noqa: E402
from fixtures import N_VOCAB, iq4_type, quantize_iq4, rand_tokens  # noqa: E402

from llmcore import _kernels, quant  # noqa: E402
from llmcore.gguf_file import GGUFFile, Tensor  # noqa: E402
from llmcore.models import load_model  # noqa: E402

pytestmark = pytest.mark.skipif(not _kernels.ENABLED, reason="LLMCORE_NO_KERNELS=1: quant.* runs gguf.quants")

TYPES = [QT.IQ4_NL, QT.IQ4_XS]
IDS = [t.name for t in TYPES]
# The GGUF-layout kernels sum in ggml's float order, fusing multiply-adds like its AVX2 code
# (the portable C build, without FMA, rounds them separately); the repacked ones sum whole
# blocks: the same integers, another float order.
EXACT = iq.SIMD_LEVEL != "c"
REPACKS = [None, False]
REPACK_IDS = ["default", "raw"]
needs_llama = pytest.mark.skipif(ggml_ops.available() is not None, reason=str(ggml_ops.available()))


def rand_blocks(rng, qt, nblocks, scale=0.02):
    """Random but valid blocks: random index and scale bytes, finite f16 d of both signs."""
    _, ts = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
    d = (rng.standard_normal(nblocks) * scale).astype(np.float16)
    raw[:, 0:2] = d.view(np.uint8).reshape(nblocks, 2)
    return raw


def rand_weight(rng, qt, rows, cols):
    bs, _ = gguf.GGML_QUANT_SIZES[qt]
    return rand_blocks(rng, qt, rows * (cols // bs)).reshape(rows, -1)


def ref_dequant(raw, qt, shape):
    return gguf.quants.dequantize(np.ascontiguousarray(raw), qt).reshape(shape).astype(np.float32)


def dequant(raw, qt, n_threads=2):
    raw = np.ascontiguousarray(raw).view(np.uint8)
    raw = raw.reshape(-1, raw.shape[-1])
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    out = np.empty((raw.shape[0], raw.shape[1] // ts * bs), np.float32)
    iq.dequantize(raw, int(qt), out, n_threads)
    return out


def emulated(x, W, qt):
    """x quantized like llama.cpp (q8_0 for IQ4_NL, q8_K for IQ4_XS), exact float64 product."""
    xq = R.act_q8_0(x) if qt == QT.IQ4_NL else R.act_q8_k(x)
    return xq @ W.T.astype(np.float64)


def mm(packed, x, n_threads=1):
    y = np.empty((x.shape[0], packed.rows), np.float32)
    iq.matmul(packed, np.ascontiguousarray(x, np.float32), y, n_threads)
    return y


def cols_for(qt):
    return 1056 if qt == QT.IQ4_NL else 768  # IQ4_NL: an odd number of blocks (ggml's tail path)


# --- dequantize, get_rows --------------------------------------------------------------
@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_dequantize_exact_random_blocks(qt):
    rng = np.random.default_rng(int(qt))
    raw = rand_blocks(rng, qt, 300, scale=3.0)
    raw[0, 0:2] = 0                                           # zero scale
    raw[1, 0:2] = np.array([6e-8], np.float16).view(np.uint8)  # subnormal scale
    ref = gguf.quants.dequantize(raw, qt).reshape(-1)
    got = dequant(raw, qt).reshape(-1)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), ref.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(dequant(raw, qt, n_threads=1).reshape(-1), got)  # threads: same values
    shape = (150, 64) if qt == QT.IQ4_NL else (300, 256)  # through the llmcore.quant contract
    np.testing.assert_array_equal(quant.dequantize(raw, qt, shape), ref.reshape(shape))


@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_fixture_quantizer_writes_valid_close_blocks(qt):
    """tests/fixtures.py's NumPy quantizer (the tiny models' i-quant weights): its blocks
    dequantize exactly here and land close to the floats."""
    x = np.random.default_rng(3).standard_normal((12, 512)).astype(np.float32)
    raw = quantize_iq4(x, qt)
    assert raw.shape == (12, 512 // gguf.GGML_QUANT_SIZES[qt][0] * gguf.GGML_QUANT_SIZES[qt][1])
    ref = ref_dequant(raw, qt, x.shape)
    np.testing.assert_array_equal(dequant(raw, qt), ref)
    assert np.mean((ref - x) ** 2) / np.mean(x ** 2) < 0.008  # llama.cpp's quantizer: 0.0058 on this data


@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_get_rows(qt):
    rng = np.random.default_rng(11)
    raw = rand_weight(rng, qt, 21, 512)
    W = ref_dequant(raw, qt, (21, 512))
    for ids in (np.array([20, 0, 5, 5, 13], np.int64), np.arange(21, dtype=np.int64)[::-1].copy()):
        out = np.empty((len(ids), 512), np.float32)
        iq.get_rows(raw, int(qt), ids, out, 2)
        np.testing.assert_array_equal(out, W[ids])
    np.testing.assert_array_equal(quant.get_rows(Tensor("t", int(qt), (21, 512), raw), [3, 7]), W[[3, 7]])
    with pytest.raises(IndexError):
        iq.get_rows(raw, int(qt), np.array([21], np.int64), np.empty((1, 512), np.float32), 1)


# --- matmul ----------------------------------------------------------------------------
@pytest.mark.parametrize("qt", TYPES, ids=IDS)
@pytest.mark.parametrize("n", [1, 3, 70])
def test_matmul_vs_float(qt, n):
    """Both layouts == llama.cpp-quantized activations x dequantized weights, up to float
    rounding (the same integers, summed in another order)."""
    rng = np.random.default_rng(100 + n + int(qt))
    rows, cols = 37, cols_for(qt)  # rows not a multiple of 16
    w = rand_weight(rng, qt, rows, cols)
    W = ref_dequant(w, qt, (rows, cols))
    x = rng.standard_normal((n, cols)).astype(np.float32)
    raw_packed = iq.pack(w, int(qt), repack=False)
    assert raw_packed.layout == "raw" and (raw_packed.rows, raw_packed.cols) == (rows, cols)
    y = mm(raw_packed, x)
    ye = emulated(x, W, qt)
    np.testing.assert_allclose(y, ye, rtol=2e-5, atol=2e-5 * np.abs(ye).max())
    p = iq.pack(w, int(qt))
    assert p.layout == ("repacked16" if iq.SIMD_LEVEL == "avx512vnni" else "raw")
    np.testing.assert_allclose(mm(p, x), y, rtol=1e-5, atol=1e-6 * np.abs(y).max())


def test_repack_switch(monkeypatch):
    w = rand_weight(np.random.default_rng(2), QT.IQ4_XS, 20, 256)
    repacked = "repacked16" if iq.SIMD_LEVEL == "avx512vnni" else "raw"
    assert iq.pack(w, int(QT.IQ4_XS)).layout == iq.pack(w, int(QT.IQ4_XS), repack=True).layout == repacked
    monkeypatch.setenv("LLMCORE_IQ_REPACK", "0")
    assert iq.pack(w, int(QT.IQ4_XS)).layout == "raw"
    assert iq.pack(w, int(QT.IQ4_XS), repack=True).layout == repacked


@pytest.mark.parametrize("qt", TYPES, ids=IDS)
@pytest.mark.parametrize("repack", REPACKS, ids=REPACK_IDS)
def test_matmul_threads_and_batch_invariant(qt, repack):
    rng = np.random.default_rng(41)
    w = rand_weight(rng, qt, 53, 512)
    x = rng.standard_normal((70, 512)).astype(np.float32)
    p = iq.pack(w, int(qt), repack=repack)
    y1 = mm(p, x, 1)
    np.testing.assert_array_equal(mm(p, x, 2), y1)
    for a, b in [(5, 6), (0, 3), (60, 70)]:  # a token's result does not depend on its batch
        np.testing.assert_array_equal(mm(p, x[a:b], 2), y1[a:b])


@pytest.mark.parametrize("qt", TYPES, ids=IDS)
@pytest.mark.parametrize("repack", REPACKS, ids=REPACK_IDS)
def test_matmul_grouped_equals_per_expert(qt, repack):
    rng = np.random.default_rng(47)
    n_exp, rows, cols = 5, 40, 512
    raw3 = rand_weight(rng, qt, n_exp * rows, cols).reshape(n_exp, rows, -1)
    packs = [iq.pack(raw3[e], int(qt), repack=repack) for e in range(n_exp)]
    experts = [3, 0, 4, 1]
    counts = [2, 0, 70, 1]  # an empty group and one over a 64-token work item
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    x = rng.standard_normal((int(offs[-1]), cols)).astype(np.float32)
    for nt in (1, 2):
        y = np.full((len(x), rows), np.nan, np.float32)
        iq.matmul_grouped([packs[e] for e in experts], offs, x, y, nt)
        for i, e in enumerate(experts):
            a, b = offs[i], offs[i + 1]
            np.testing.assert_array_equal(y[a:b], mm(packs[e], x[a:b]))
    el = quant.ExpertLinear(Tensor("blk.0.ffn_up_exps.weight", int(qt), (n_exp, rows, cols), raw3))
    yg = el.grouped(x, experts, offs)
    for i, e in enumerate(experts):
        a, b = offs[i], offs[i + 1]
        np.testing.assert_array_equal(yg[a:b], el(x[a:b], e))
    with pytest.raises(ValueError):
        iq.matmul_grouped(packs[:2], np.array([0, 1], np.int64), x[:1], np.empty((1, rows), np.float32), 1)


@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_linear_through_quant_dispatch(qt):
    rng = np.random.default_rng(31)
    raw = rand_weight(rng, qt, 40, 256)
    assert quant.kernel_for(qt) is iq
    lin = quant.Linear(Tensor("w", int(qt), (40, 256), raw))
    assert isinstance(lin._packed, iq.Packed) and lin.nbytes == lin._packed.nbytes >= raw.nbytes
    x = rng.standard_normal((2, 256)).astype(np.float32)
    np.testing.assert_array_equal(lin(x), mm(iq.pack(raw, int(qt)), x))


def test_bad_inputs():
    rng = np.random.default_rng(1)
    w = rand_weight(rng, QT.IQ4_XS, 4, 256)
    p = iq.pack(w, int(QT.IQ4_XS))
    with pytest.raises(ValueError):
        iq.matmul(p, np.zeros((1, 512), np.float32), np.zeros((1, 4), np.float32), 1)
    with pytest.raises(ValueError):
        iq.pack(w, int(QT.Q4_K))
    with pytest.raises(ValueError):  # rows that are not whole blocks
        iq.dequantize(np.ascontiguousarray(w[:, :100]), int(QT.IQ4_XS), np.empty((4, 256), np.float32), 1)
    with pytest.raises(ValueError):  # out of the wrong shape
        iq.dequantize(w, int(QT.IQ4_XS), np.empty((4, 512), np.float32), 1)


# --- llama.cpp itself ------------------------------------------------------------------
@needs_llama
@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_llama_cpp_quantized_blocks_dequantize_exactly(qt):
    x = np.random.default_rng(5).standard_normal((20, 512)).astype(np.float32)
    raw = ggml_ops.quantize(x, int(qt))
    np.testing.assert_array_equal(dequant(raw, qt), ref_dequant(raw, qt, x.shape))


@needs_llama
@pytest.mark.parametrize("qt", TYPES, ids=IDS)
@pytest.mark.parametrize("repack", REPACKS, ids=REPACK_IDS)
def test_matmul_vs_llama_cpp(qt, repack):
    """The GGUF layout sums in llama.cpp's vec_dot order: IQ4_XS matmuls of up to 7 tokens
    and one-token IQ4_NL matmuls give its bits (its batched paths are other kernels: for
    IQ4_NL from 2 tokens llamafile's tinyBLAS, one chain over the blocks instead of two; for
    IQ4_XS from 8; results here do not depend on the batch). The repacked layout: a float
    rounding apart."""
    rng = np.random.default_rng(7 + int(qt))
    rows, cols = 70, 2 * cols_for(qt)
    w = ggml_ops.quantize(rng.standard_normal((rows, cols)).astype(np.float32), int(qt))
    x = rng.standard_normal((7, cols)).astype(np.float32)
    # activation quantization edge cases: an all-zero block, the largest magnitude negative,
    # a tie on it (the first one sets q8_K's sign), values on rounding ties (x * 127/amax = k + 0.5)
    x[1, :256] = 0
    x[2, 3], x[2, 300], x[2, 290] = -50.0, 40.0, -40.0
    x[3, :32] = np.concatenate([[127.0], np.arange(31) - 15.5])
    x[3, 256:288] = np.concatenate([[-127.0], np.arange(31) * 0.5])
    p = iq.pack(w, int(qt), repack=repack)
    y = mm(p, x, 2)
    ref1 = ggml_ops.mul_mat(w, int(qt), x[:1])
    ref = ggml_ops.mul_mat(w, int(qt), x)
    if EXACT and p.layout == "raw":
        np.testing.assert_array_equal(y[:1], ref1)
        if qt == QT.IQ4_XS:
            np.testing.assert_array_equal(y, ref)
        else:
            np.testing.assert_array_equal(y[3], ggml_ops.mul_mat(w, int(qt), x[3:4])[0])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


@needs_llama
@pytest.mark.parametrize("qt", TYPES, ids=IDS)
@pytest.mark.parametrize("repack", ["1", "0"], ids=REPACK_IDS)
def test_expert_matmul_vs_llama_cpp(qt, repack, monkeypatch):
    """MoE experts: ggml_mul_mat_id runs vec_dot for both types; the GGUF layout's grouped
    matmul gives its bits, the repacked one a float rounding apart."""
    monkeypatch.setenv("LLMCORE_IQ_REPACK", repack)
    rng = np.random.default_rng(9)
    n_exp, rows, cols, n, top = 6, 48, cols_for(qt), 9, 2
    raws = np.stack([ggml_ops.quantize(rng.standard_normal((rows, cols)).astype(np.float32), int(qt))
                     for _ in range(n_exp)])
    x = rng.standard_normal((n, cols)).astype(np.float32)
    ids = np.stack([rng.choice(n_exp, top, replace=False) for _ in range(n)]).astype(np.int32)
    ref = ggml_ops.mul_mat_id(raws, int(qt), x, ids)
    el = quant.ExpertLinear(Tensor("blk.0.ffn_down_exps.weight", int(qt), (n_exp, rows, cols), raws))
    # the MoE layer's dispatch: (token, slot) pairs sorted by expert, one grouped call
    pairs = sorted((int(e), t, j) for t in range(n) for j, e in enumerate(ids[t]))
    experts = sorted({e for e, _, _ in pairs})
    offs = np.searchsorted([e for e, _, _ in pairs], experts + [n_exp]).astype(np.int64)
    y = el.grouped(x[[t for _, t, _ in pairs]], experts, offs)
    got = np.empty_like(ref)
    for row, (_, t, j) in zip(y, pairs):
        got[t, j] = row
    if EXACT and el._packed[0].layout == "raw":
        # IQ4_NL has an odd number of blocks here: ggml's scalar tail block (d_w * d_a * sumi
        # + sum) is one fma or two roundings as the peer's compiler chose (its wheel is built
        # from source), so only the even-block IQ4_XS case can be held to its bits
        if qt == QT.IQ4_XS:
            np.testing.assert_array_equal(got, ref)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


# --- a tiny model ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def iq4_model(built_model):
    return built_model("qwen3moe-iq4")


def test_tiny_moe_model_with_iq4_weights_matches_reference(iq4_model):
    """qwen3moe with IQ4_NL attention / embedding / gate+up experts and IQ4_XS down experts:
    logits = the NumPy reference on the dequantized weights with llama.cpp's activation
    rounding. A token whose expert choice sits on a near-tie (2nd and 3rd router
    probabilities ~0.002 apart) may pick the other expert: a few tokens may be off."""
    types = {t.name: int(t.ggml_type) for t in GGUFFile(iq4_model).tensors.values()}
    assert types["blk.0.ffn_down_exps.weight"] == QT.IQ4_XS and types["blk.0.ffn_up_exps.weight"] == QT.IQ4_NL
    assert types["token_embd.weight"] == QT.IQ4_NL == iq4_type(64)
    W, meta = R.load_gguf(iq4_model)
    m = load_model(iq4_model, kv_type="f32")
    for seed in (2, 5):
        toks = rand_tokens(40, seed, N_VOCAB)
        ref = R.forward_qwen3moe(W, meta, list(map(int, toks)), emulate=True)
        got = m.forward([(m.new_state(), toks)], all_logits=True)
        per_token = np.abs(got - ref).max(1) / np.abs(ref).max()
        close = per_token < 0.05
        assert close.mean() >= 0.9, np.round(per_token, 3)
        assert np.std((got - ref)[close]) / np.std(ref[close]) < 0.03
        top2 = np.sort(ref, axis=1)[:, -2:]
        clear = close & ((top2[:, 1] - top2[:, 0]) > 0.3)
        assert np.mean(got.argmax(1)[clear] == ref.argmax(1)[clear]) > 0.9
