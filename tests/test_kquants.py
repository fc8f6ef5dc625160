"""K-quant (Q2_K..Q6_K) and MXFP4 kernels: exact dequantization vs gguf.quants, integer
matmul vs float references (plain and with llama.cpp's activation quantization)."""
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT

kq = pytest.importorskip("llmcore._kernels.kquants")

from llmcore import _kernels, quant  # noqa: E402
from llmcore.gguf_file import Tensor  # noqa: E402

pytestmark = pytest.mark.skipif(not _kernels.ENABLED, reason="LLMCORE_NO_KERNELS=1: quant.* runs gguf.quants")

TYPES = [QT.Q4_K, QT.Q6_K, QT.MXFP4, QT.Q5_K, QT.Q3_K, QT.Q2_K]
IDS = [t.name for t in TYPES]


def rand_blocks(rng, qt, nblocks, scale=0.02):
    """Random but valid blocks: random bytes, finite f16 / e8m0 scales."""
    _, ts = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)

    def f16(lo, hi=None):
        v = (np.abs(rng.standard_normal(nblocks)) * scale).astype(np.float16)
        raw[:, lo:lo + 2] = v.view(np.uint8).reshape(nblocks, 2)

    if qt == QT.Q2_K:
        f16(80), f16(82)
    elif qt == QT.Q3_K:
        f16(108)
    elif qt in (QT.Q4_K, QT.Q5_K):
        f16(0), f16(2)
    elif qt == QT.Q6_K:
        f16(208)
    elif qt == QT.MXFP4:
        raw[:, 0] = rng.integers(118, 127, size=nblocks)
    return raw


def rand_weight(rng, qt, rows, cols):
    bs, _ = gguf.GGML_QUANT_SIZES[qt]
    return rand_blocks(rng, qt, rows * (cols // bs)).reshape(rows, -1)


def ref_dequant(raw, qt, shape):
    return gguf.quants.dequantize(np.ascontiguousarray(raw), qt).reshape(shape).astype(np.float32)


def nmse(y, ref):
    ref = np.asarray(ref, np.float64)
    return float(((np.asarray(y, np.float64) - ref) ** 2).mean() / (ref ** 2).mean())


# --- llama.cpp activation quantization, NumPy (as in reference_archs.act_q8_0 / act_q8_k) ---
def act_q8_k(x):
    b = x.reshape(-1, 256).astype(np.float32)
    mx = b[np.arange(len(b)), np.abs(b).argmax(1)][:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0)).astype(np.float32)
        q = np.minimum(np.rint(iscale * b), 127)
        d = np.where(mx != 0, np.float32(1.0) / iscale, np.float32(0)).astype(np.float32)
    return q, d


def act_q8_0(x):
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(1, keepdims=True)
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
    return np.rint(b * idv), d


def emulated(x, W, qt):
    """x quantized like llama.cpp, then exact float64 product with dequantized W."""
    q, d = act_q8_0(x) if qt == QT.MXFP4 else act_q8_k(x)
    xq = (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)
    return xq @ W.T.astype(np.float64)


def dequant(raw, qt, n_threads=2):
    """kq.dequantize of GGUF bytes (any shape whose last axis holds whole blocks), flat."""
    raw = np.ascontiguousarray(raw).view(np.uint8)
    raw = raw.reshape(-1, raw.shape[-1])
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    out = np.empty((raw.shape[0], raw.shape[1] // ts * bs), np.float32)
    kq.dequantize(raw, int(qt), out, n_threads)
    return out.reshape(-1)


def _mm(packed, x, n_threads=1):
    y = np.empty((x.shape[0], packed.rows), np.float32)
    kq.matmul(packed, np.ascontiguousarray(x, np.float32), y, n_threads)
    return y


# ------------------------------------------------------------------------------------
@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_dequantize_exact_random_blocks(qt):
    rng = np.random.default_rng(int(qt))
    raw = rand_blocks(rng, qt, 300, scale=3.0)
    ref = gguf.quants.dequantize(raw, qt).reshape(-1)
    got = dequant(raw, qt)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), ref.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(dequant(raw, qt, n_threads=1), got)  # threads: same values
    # through the llmcore.quant contract (dispatches to this module)
    shape = (300 * gguf.GGML_QUANT_SIZES[qt][0] // 64, 64) if qt == QT.MXFP4 else (300, 256)
    np.testing.assert_array_equal(quant.dequantize(raw, qt, shape), ref.reshape(shape))


def test_dequantize_exact_gguf_quantized_mxfp4():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((16, 128)) * 0.3).astype(np.float32)
    raw = gguf.quants.quantize(x, QT.MXFP4)
    np.testing.assert_array_equal(dequant(raw, QT.MXFP4).reshape(x.shape),
                                  gguf.quants.dequantize(raw, QT.MXFP4).reshape(x.shape))


def test_dequantize_exact_special_scales():
    """e8m0 0/1/254/255 (subnormal, huge, inf), f16 zero/negative/subnormal scales."""
    rng = np.random.default_rng(3)
    raw = rand_blocks(rng, QT.MXFP4, 8)
    raw[:4, 0] = [0, 1, 254, 255]
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(raw, QT.MXFP4).reshape(-1)
    np.testing.assert_array_equal(dequant(raw, QT.MXFP4).view(np.uint32), ref.view(np.uint32))
    raw = rand_blocks(rng, QT.Q4_K, 4)
    raw[0, 0:4] = 0
    raw[1, 0:2] = np.array([-0.5], np.float16).view(np.uint8)
    raw[2, 0:2] = np.array([1e-7], np.float16).view(np.uint8)
    raw[3, 2:4] = np.array([6e-8], np.float16).view(np.uint8)
    ref = gguf.quants.dequantize(raw, QT.Q4_K).reshape(-1)
    np.testing.assert_array_equal(dequant(raw, QT.Q4_K).view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K, QT.MXFP4], ids=["Q4_K", "Q6_K", "MXFP4"])
def test_get_rows(qt):
    rng = np.random.default_rng(11)
    raw = rand_weight(rng, qt, 21, 512)
    ids = np.array([20, 0, 5, 5, 13], np.int64)
    out = np.empty((len(ids), 512), np.float32)
    kq.get_rows(raw, int(qt), ids, out, 2)
    np.testing.assert_array_equal(out, ref_dequant(raw, qt, (21, 512))[ids])
    many = np.arange(21, dtype=np.int64)[::-1].copy()  # enough ids for the threaded loop
    out = np.empty((len(many), 512), np.float32)
    kq.get_rows(raw, int(qt), many, out, 2)
    np.testing.assert_array_equal(out, ref_dequant(raw, qt, (21, 512))[many])
    with pytest.raises(IndexError):
        kq.get_rows(raw, int(qt), np.array([21], np.int64), np.empty((1, 512), np.float32), 1)


def test_quantize_q8_k_matches_llama_cpp_reference():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 768)).astype(np.float32)
    x[1, 256:512] = 0  # all-zero block
    x[2, 3] = -50.0    # largest magnitude negative
    x[2, 300], x[2, 290] = 40.0, -40.0  # tie on |max|: the first one sets the sign
    x[0, 600], x[0, 700] = -9.0, 9.0
    d, qs, bsums = kq.quantize_q8_k(x)
    q_ref, d_ref = act_q8_k(x)
    np.testing.assert_array_equal(qs.reshape(-1, 256), q_ref.astype(np.int8))
    np.testing.assert_array_equal(d.reshape(-1), d_ref.reshape(-1))
    np.testing.assert_array_equal(bsums.reshape(-1, 16), q_ref.reshape(-1, 16, 16).sum(-1))


@pytest.mark.parametrize("qt", TYPES, ids=IDS)
@pytest.mark.parametrize("n", [1, 3, 67])
def test_matmul_vs_float(qt, n):
    rng = np.random.default_rng(100 + n + int(qt))
    rows, cols = 37, (768 if qt != QT.MXFP4 else 736)  # odd row count, odd number of blocks
    w = rand_weight(rng, qt, rows, cols)
    W = ref_dequant(w, qt, (rows, cols))
    x = rng.standard_normal((n, cols)).astype(np.float32)
    y = kq.matmul_raw(w, int(qt), x)
    assert y.shape == (n, rows) and y.dtype == np.float32
    assert nmse(y, x.astype(np.float64) @ W.T.astype(np.float64)) <= 5e-4
    # the integer kernel equals llama.cpp-style quantized activations x float weights
    ye = emulated(x, W, qt)
    np.testing.assert_allclose(y, ye, rtol=2e-5, atol=2e-5 * np.abs(ye).max())


@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_matmul_threads_identical(qt):
    rng = np.random.default_rng(9)
    w = rand_weight(rng, qt, 53, 512)
    x = rng.standard_normal((70, 512)).astype(np.float32)
    y1 = kq.matmul_raw(w, int(qt), x, n_threads=1)
    y2 = kq.matmul_raw(w, int(qt), x, n_threads=2)
    np.testing.assert_array_equal(y1, y2)
    # a token's result does not depend on the batch it came in
    np.testing.assert_array_equal(kq.matmul_raw(w, int(qt), x[5:6], n_threads=2), y1[5:6])


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.MXFP4], ids=["Q4_K", "MXFP4"])
def test_expert_slices_3d(qt):
    rng = np.random.default_rng(21)
    n_exp, rows, cols = 4, 24, 512
    raw3 = rand_weight(rng, qt, n_exp * rows, cols).reshape(n_exp, rows, -1)
    W3 = ref_dequant(raw3, qt, (n_exp, rows, cols))
    x = rng.standard_normal((5, cols)).astype(np.float32)
    t = Tensor("blk.0.ffn_up_exps.weight", int(qt), (n_exp, rows, cols), raw3)
    el = quant.ExpertLinear(t)
    for e in range(n_exp):
        y = kq.matmul_raw(raw3[e], int(qt), x)
        assert nmse(y, x.astype(np.float64) @ W3[e].T.astype(np.float64)) <= 5e-4
        # ExpertLinear uses the repacked kernel: same integers, float sums in another order
        np.testing.assert_allclose(el(x, e), y, rtol=1e-5, atol=1e-5 * np.abs(y).max())
        np.testing.assert_array_equal(el(x, e), _mm(kq.pack(raw3[e], int(qt)), x))
    # a strided slice (every other row of an expert) works too
    y = kq.matmul_raw(raw3[1, ::2], int(qt), x)
    np.testing.assert_array_equal(y, kq.matmul_raw(raw3[1], int(qt), x)[:, ::2])


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K], ids=["Q4_K", "Q6_K"])
def test_linear_through_quant_dispatch(qt):
    rng = np.random.default_rng(31)
    raw = rand_weight(rng, qt, 40, 256)
    lin = quant.Linear(Tensor("w", int(qt), (40, 256), raw))
    assert isinstance(lin._packed, kq.Packed)
    assert lin.nbytes == lin._packed.nbytes >= raw.nbytes
    x = rng.standard_normal((2, 256)).astype(np.float32)
    np.testing.assert_array_equal(lin(x), _mm(kq.pack(raw, int(qt)), x))
    y = kq.matmul_raw(raw, int(qt), x)
    np.testing.assert_allclose(lin(x), y, rtol=1e-5, atol=1e-5 * np.abs(y).max())


def test_bad_inputs():
    rng = np.random.default_rng(1)
    w = rand_weight(rng, QT.Q4_K, 4, 256)
    with pytest.raises(ValueError):
        kq.matmul_raw(w, int(QT.Q4_K), np.zeros((1, 512), np.float32))
    with pytest.raises(ValueError):
        kq.matmul_raw(w, int(QT.Q8_0), np.zeros((1, 256), np.float32))
    with pytest.raises(ValueError):  # rows that are not whole blocks
        kq.dequantize(np.ascontiguousarray(w[:, :100]), int(QT.Q4_K), np.empty((4, 256), np.float32), 1)
    with pytest.raises(ValueError):  # out of the wrong shape
        kq.dequantize(w, int(QT.Q4_K), np.empty((4, 512), np.float32), 1)


@pytest.mark.slow  # loading three GGUFs takes ~10 s
def test_conformance_model_tensors_dequantize_exactly(conformance):
    """K-quant / MXFP4 tensors made by a real quantizer (the conformance GGUFs; gguf.quants
    has no K-quant quantizer to build them here), not random bytes as above."""
    from llmcore.gguf_file import GGUFFile

    seen = set()
    for name in ("tiny-qwen3-q4_k_m.gguf", "tiny-gpt-oss.gguf", "tiny-qwen3moe-q4_k.gguf"):
        f = GGUFFile(conformance / "models" / name)
        picked = {}  # the two smallest tensors of each type (NumPy reference is slow)
        for t in sorted(f.tensors.values(), key=lambda t: t.nbytes):
            if int(t.ggml_type) in kq.SUPPORTED and len(picked.setdefault(int(t.ggml_type), [])) < 2:
                picked[int(t.ggml_type)].append(t)
        for t in (t for ts in picked.values() for t in ts):
            seen.add(int(t.ggml_type))
            ref = gguf.quants.dequantize(np.ascontiguousarray(t.raw()), QT(t.ggml_type)).reshape(-1)
            np.testing.assert_array_equal(dequant(t.raw(), QT(t.ggml_type)), ref, err_msg=t.name)
    assert {int(QT.Q4_K), int(QT.Q6_K), int(QT.MXFP4)} <= seen


# --- repacked (16-row interleaved) layout and the grouped expert kernel ---------------
REPACKED = [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.MXFP4]
RP_IDS = [t.name for t in REPACKED]
needs_repack = pytest.mark.skipif(kq.SIMD_LEVEL != "avx512vnni", reason="repacked kernels need AVX-512 VNNI")


def needs_repack_of(qt):
    """The repacked layout of qt where this build has it (VNNI: all four; AVX2: the K-quants)."""
    # (getattr: bench/matmul_ab.py imports this module beside builds older than REPACK_TYPES)
    return pytest.param(qt, id=qt.name, marks=pytest.mark.skipif(
        int(qt) not in getattr(kq, "REPACK_TYPES", ()), reason=f"{qt.name} is not repacked by this build ({kq.SIMD_LEVEL})"))


RP_PARAMS = [needs_repack_of(t) for t in REPACKED]


@pytest.mark.parametrize("qt", RP_PARAMS)
@pytest.mark.parametrize("n", [1, 3, 6, 130])
@pytest.mark.usefixtures("int8_matmuls")
def test_repacked_matmul(qt, n):
    """Repacked == llama.cpp-quantized activations x dequantized weights, ~= the raw-layout
    kernel; rows not a multiple of 16, more tokens than one work item (64)."""
    rng = np.random.default_rng(200 + n + int(qt))
    rows, cols = 37, (768 if qt != QT.MXFP4 else 736)
    w = rand_weight(rng, qt, rows, cols)
    W = ref_dequant(w, qt, (rows, cols))
    x = rng.standard_normal((n, cols)).astype(np.float32)
    p = kq.pack(w, int(qt))
    assert p.layout == "repacked16" and (p.rows, p.cols) == (rows, cols)
    y = _mm(p, x)
    ye = emulated(x, W, qt)
    np.testing.assert_allclose(y, ye, rtol=2e-5, atol=2e-5 * np.abs(ye).max())
    yr = kq.matmul_raw(w, int(qt), x)
    np.testing.assert_allclose(y, yr, rtol=1e-5, atol=1e-5 * np.abs(yr).max())
    raw_packed = kq.pack(w, int(qt), repack=False)
    assert raw_packed.layout == "raw"
    np.testing.assert_array_equal(_mm(raw_packed, x), yr)


@pytest.mark.parametrize("qt", RP_PARAMS)
def test_repacked_threads_and_batch_invariant(qt):
    rng = np.random.default_rng(41)
    w = rand_weight(rng, qt, 53, 512)
    x = rng.standard_normal((70, 512)).astype(np.float32)
    p = kq.pack(w, int(qt))
    y1 = _mm(p, x, 1)
    np.testing.assert_array_equal(_mm(p, x, 2), y1)
    for a, b in [(5, 6), (0, 3), (60, 70)]:  # a token's result does not depend on its batch
        np.testing.assert_array_equal(_mm(p, x[a:b], 2), y1[a:b])


@needs_repack
@pytest.mark.skipif(not kq.AMX, reason="the AMX tile kernel is not in use on this machine")
@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.usefixtures("int8_matmuls")
def test_amx_tiles_give_the_vnni_bits(qt):
    """Token tiles on the AMX kernel (whole and partial 16-token tiles, more than one work
    item, a masked last row group) give the VNNI kernel's bits, in matmul and matmul_grouped."""
    rng = np.random.default_rng(61)
    rows, cols = 53, 768
    w = rand_weight(rng, qt, rows, cols)
    p = kq.pack(w, int(qt))
    x = rng.standard_normal((300, cols)).astype(np.float32)
    counts = [7, 16, 0, 21, 40]
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    try:
        kq._set_amx_min_tokens(1000)  # VNNI only
        ref = _mm(p, x, 2)
        refg = np.empty((int(offs[-1]), rows), np.float32)
        kq.matmul_grouped([p] * len(counts), offs, x[:len(refg)], refg, 2)
        for tile, call in ((1, 1), (6, 1), (0, 0)):  # every tile on AMX; partial tiles; the defaults
            kq._set_amx_min_tokens(tile, call)
            for n in (5, 16, 300):
                np.testing.assert_array_equal(_mm(p, x[:n], 2), ref[:n])
            yg = np.empty_like(refg)
            kq.matmul_grouped([p] * len(counts), offs, x[:len(refg)], yg, 1)
            np.testing.assert_array_equal(yg, refg)
    finally:
        kq._set_amx_min_tokens(0, 0)


@pytest.mark.parametrize("qt", [needs_repack_of(t) for t in (QT.Q4_K, QT.Q5_K, QT.Q6_K)])
@pytest.mark.usefixtures("int8_matmuls")
def test_unpacked_tiles_give_the_4_token_kernel_bits(qt):
    """Work items of many tokens run on unpacked super-blocks (VNNI: two 16-row groups at a
    time; AVX2: one group unpacked once):
    the same bits as the 4-token kernel on the packed tiles, for token counts around its
    threshold and its 6-token tiles, more than one work item (64 tokens), an odd number of
    row groups with a masked last one, threads 1 and 2, in matmul and matmul_grouped."""
    rng = np.random.default_rng(67)
    rows, cols = 37, 768  # 3 row groups: a pair and a single, the last one masked
    w = rand_weight(rng, qt, rows, cols)
    p = kq.pack(w, int(qt))
    x = rng.standard_normal((150, cols)).astype(np.float32)
    counts = [7, 8, 0, 13, 70, 1, 40]
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    try:
        kq._set_unpacked_min_tokens(0)  # the 4-token kernel only
        ref = _mm(p, x, 1)
        refg = np.empty((int(offs[-1]), rows), np.float32)
        kq.matmul_grouped([p] * len(counts), offs, x[:len(refg)], refg, 1)
        np.testing.assert_array_equal(refg, ref[:len(refg)])
        for umin in (1, 8):
            kq._set_unpacked_min_tokens(umin)
            for n in (1, 5, 8, 13, 64, 65, 150):
                for nt in (1, 2):
                    np.testing.assert_array_equal(_mm(p, x[:n], nt), ref[:n])
            for nt in (1, 2):
                yg = np.full_like(refg, np.nan)
                kq.matmul_grouped([p] * len(counts), offs, x[:len(refg)], yg, nt)
                np.testing.assert_array_equal(yg, refg)
        ye = emulated(x[:20], ref_dequant(w, qt, (rows, cols)), qt)  # and right, not only the same
        np.testing.assert_allclose(ref[:20], ye, rtol=2e-5, atol=2e-5 * np.abs(ye).max())
    finally:
        kq._set_unpacked_min_tokens(-1)
    assert kq._unpacked_min_tokens(int(qt)) > 0


@pytest.mark.parametrize("qt", REPACKED + [QT.Q3_K], ids=RP_IDS + ["Q3_K"])
def test_matmul_grouped_rows_equals_the_gathered_rows(qt):
    """The row-mapped grouped matmul (each token's row quantized once, copied to every expert
    that chose it) gives the bits of the grouped matmul over the gathered rows; so does
    ExpertLinear.grouped(rows=), also for a type whose kernel module has no row map (Q8_0)."""
    rng = np.random.default_rng(71)
    n_exp, rows, cols, n_tok, k = 5, 40, 512, 23, 3
    raw3 = rand_weight(rng, qt, n_exp * rows, cols).reshape(n_exp, rows, -1)
    packs = [kq.pack(raw3[e], int(qt)) for e in range(n_exp)]
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    ids = np.stack([rng.permutation(n_exp)[:k] for _ in range(n_tok)]).astype(np.int32)
    from llmcore.models.moe import group_by_expert
    g = group_by_expert(ids, n_exp)
    sel = [packs[int(e)] for e in g.expert_ids]
    want = np.empty((n_tok * k, rows), np.float32)
    kq.matmul_grouped(sel, g.offsets, np.ascontiguousarray(x[g.token]), want, 1)
    for nt in (1, 2):
        got = np.full_like(want, np.nan)
        kq.matmul_grouped_rows(sel, g.offsets, x, g.token, got, nt)
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError):
        kq.matmul_grouped_rows(sel, g.offsets, x, np.full(n_tok * k, n_tok, np.int64), want, 1)
    el = quant.ExpertLinear(Tensor("blk.0.ffn_up_exps.weight", int(qt), (n_exp, rows, cols), raw3))
    np.testing.assert_array_equal(el.grouped(x, g.expert_ids, g.offsets, rows=g.token),
                                  el.grouped(x[g.token], g.expert_ids, g.offsets))
    w8 = rng.standard_normal((n_exp, rows, cols)).astype(np.float32)
    q8 = gguf.quants.quantize(w8.reshape(-1, cols), QT.Q8_0).reshape(n_exp, rows, -1)
    el8 = quant.ExpertLinear(Tensor("blk.0.ffn_up_exps.weight", int(QT.Q8_0), (n_exp, rows, cols), q8))
    np.testing.assert_array_equal(el8.grouped(x, g.expert_ids, g.offsets, rows=g.token),
                                  el8.grouped(x[g.token], g.expert_ids, g.offsets))


@pytest.mark.parametrize("qt", [needs_repack_of(QT.Q6_K)])
def test_repacked_row_subset_and_env(monkeypatch, qt):
    rng = np.random.default_rng(43)
    raw3 = rand_weight(rng, qt, 3 * 20, 512).reshape(3, 20, -1)
    x = rng.standard_normal((4, 512)).astype(np.float32)
    with pytest.raises(ValueError):  # pack takes C-contiguous rows (the interface of llmcore.quant)
        kq.pack(raw3[1, ::2], int(qt))
    np.testing.assert_array_equal(_mm(kq.pack(np.ascontiguousarray(raw3[1, ::2]), int(qt)), x),
                                  _mm(kq.pack(raw3[1], int(qt)), x)[:, ::2])
    monkeypatch.setenv("LLMCORE_KQ_REPACK", "0")
    assert kq.pack(raw3[0], int(qt)).layout == "raw"
    assert kq.pack(raw3[0], int(qt), repack=True).layout == "repacked16"


@pytest.mark.parametrize("qt", REPACKED + [QT.Q3_K], ids=RP_IDS + ["Q3_K"])
@pytest.mark.parametrize("repack", [True, False], ids=["repacked", "raw"])
def test_matmul_grouped_equals_per_expert(qt, repack):
    rng = np.random.default_rng(47)
    n_exp, rows, cols = 5, 40, 512
    raw3 = rand_weight(rng, qt, n_exp * rows, cols).reshape(n_exp, rows, -1)
    packs = [kq.pack(raw3[e], int(qt), repack=repack) for e in range(n_exp)]
    experts = [3, 0, 4, 1]
    counts = [2, 0, 70, 1]          # an empty group and one over a 64-token work item
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    x = rng.standard_normal((int(offs[-1]), cols)).astype(np.float32)
    for nt in (1, 2):
        y = np.full((len(x), rows), np.nan, np.float32)
        kq.matmul_grouped([packs[e] for e in experts], offs, x, y, nt)
        for i, e in enumerate(experts):
            a, b = offs[i], offs[i + 1]
            np.testing.assert_array_equal(y[a:b], _mm(packs[e], x[a:b]))
    # through quant.ExpertLinear.grouped (MoE dispatch)
    t = Tensor("blk.0.ffn_up_exps.weight", int(qt), (n_exp, rows, cols), raw3)
    el = quant.ExpertLinear(t)
    yg = el.grouped(x, experts, offs)
    for i, e in enumerate(experts):
        a, b = offs[i], offs[i + 1]
        if b > a:
            np.testing.assert_array_equal(yg[a:b], el(x[a:b], e))
    with pytest.raises(ValueError):
        kq.matmul_grouped(packs[:2], np.array([0, 1], np.int64), x[:1], np.empty((1, rows), np.float32), 1)


@needs_repack
@pytest.mark.skipif(not getattr(kq, "AMX_BF16", False),
                    reason="the AMX-BF16 path is not in use here (needs AMX-BF16, Linux's tile grant)")
@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=["Q4_K", "Q5_K", "Q6_K"])
def test_amx_bf16_matmul_is_the_float_product_within_bf16(qt):
    """K-quant matmuls of 128 tokens or more on AMX-BF16 tiles (each sub-block's d * sc and
    dmin * mn, Q6_K's offset): within bf16 rounding of the float64 product of the dequantized
    weights and closer to it than the int8 kernels; a token's outputs the same bits whatever
    the call's token count or thread count; a masked last row group, an odd group count,
    partial token tiles."""
    rng = np.random.default_rng(71)
    for rows, cols, n in ((37, 768, 150), (64, 2048, 131)):
        w = rand_weight(rng, qt, rows, cols)
        p = kq.pack(w, int(qt))
        x = rng.standard_normal((n, cols)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_dequant(w, qt, (rows, cols)).T.astype(np.float64)
        y = _mm(p, x, 2)
        err = nmse(y, ref)
        assert err < 2e-5, err
        try:
            kq._set_amx_bf16(0)
            y8 = _mm(p, x, 2)
        finally:
            kq._set_amx_bf16(1)
        assert err < nmse(y8, ref)
        np.testing.assert_array_equal(_mm(p, x, 1), y)
        np.testing.assert_array_equal(_mm(p, x[n - 128:], 2), y[n - 128:])
