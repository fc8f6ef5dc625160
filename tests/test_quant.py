"""Float and legacy-quant kernels (pyx/quants.pyx) against gguf.quants and NumPy float32."""
import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as QT

from llmcore import _kernels, quant
from llmcore.hugepages import HUGE_PAGE
from llmcore.gguf_file import Tensor

kq = pytest.importorskip("llmcore._kernels.quants")
# quant.* with the kernels off is gguf.quants itself: nothing to compare with
needs_kernels = pytest.mark.skipif(not _kernels.ENABLED, reason="LLMCORE_NO_KERNELS=1: quant.* runs gguf.quants")

TYPES = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]
QUANT_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0]
BLOCK_BYTES = {QT.Q4_0: 18, QT.Q4_1: 20, QT.Q5_0: 22, QT.Q5_1: 24, QT.Q8_0: 34}


def make_raw(qt, rows, cols, seed=0):
    """Raw GGUF bytes (rows, bytes_per_row) for random weights quantized by gguf.quants."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.5 + rng.standard_normal((rows, 1)) * 0.1).astype(np.float32)
    if qt == QT.F32:
        return w.view(np.uint8).reshape(rows, -1).copy()
    return np.ascontiguousarray(gguf.quants.quantize(w, qt)).view(np.uint8).reshape(rows, -1)


def random_blocks(qt, rows, cols, seed=0):
    """Random valid blocks: arbitrary quant bits, finite f16 scales/mins."""
    rng = np.random.default_rng(seed)
    if qt in (QT.F16, QT.BF16):
        bits = rng.integers(0, 2**16, size=(rows, cols), dtype=np.uint16)
        if qt == QT.F16:
            bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # no inf/nan
        else:
            bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF
        return bits.view(np.uint8).reshape(rows, -1)
    if qt == QT.F32:
        return rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8).reshape(rows, -1)
    bs = BLOCK_BYTES[qt]
    nb = cols // 32
    raw = rng.integers(0, 256, size=(rows, nb, bs), dtype=np.uint8)
    n_scales = 2 if qt in (QT.Q4_1, QT.Q5_1) else 1
    sc = (rng.standard_normal((rows, nb, n_scales)) * 0.05).astype(np.float16)
    sc[..., 0].flat[::7] = np.float16(6e-8)  # subnormal scales too
    raw[..., : 2 * n_scales] = sc.view(np.uint8).reshape(rows, nb, 2 * n_scales)
    return raw.reshape(rows, -1)


def ref_dequant(raw, qt, rows, cols):
    if qt == QT.F32:
        return raw.view(np.float32).reshape(rows, cols)
    if qt == QT.F16:
        return raw.view(np.float16).reshape(rows, cols).astype(np.float32)
    return np.asarray(gguf.quants.dequantize(raw, qt), dtype=np.float32).reshape(rows, cols)


def nmse(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-30))


@needs_kernels
@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("maker", [make_raw, random_blocks], ids=["quantized", "random"])
def test_dequantize_exact(qt, maker):
    rows, cols = 23, 160
    raw = maker(qt, rows, cols)
    ref = ref_dequant(raw, qt, rows, cols)
    got = quant.dequantize(raw, qt, (rows, cols))
    assert got.dtype == np.float32 and got.shape == (rows, cols)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@needs_kernels
@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_dequantize_and_get_rows_on_two_threads(qt):
    # past the one-thread sizes (65536 values, 64 ids): chunks of blocks over both threads,
    # the float types' "blocks" one value each
    rows, cols = 300, 512
    raw = random_blocks(qt, rows, cols, seed=4)
    ref = ref_dequant(raw, qt, rows, cols)
    k = quant.kernel_for(qt)
    out = np.empty((rows, cols), np.float32)
    k.dequantize(raw.reshape(rows, -1), int(qt), out, 2)
    np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))
    ids = np.arange(rows - 1, -1, -3, dtype=np.int64)
    got = np.empty((len(ids), cols), np.float32)
    k.get_rows(raw.reshape(rows, -1), int(qt), ids, got, 2)
    np.testing.assert_array_equal(got.view(np.uint32), ref[ids].view(np.uint32))
    with pytest.raises(ValueError, match="dequantize: out"):
        k.dequantize(raw.reshape(rows, -1), int(qt), np.empty((rows, cols - 1), np.float32), 2)


@needs_kernels
@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_get_rows(qt):
    rows, cols = 40, 96
    raw = random_blocks(qt, rows, cols, seed=3)
    t = Tensor("emb", int(qt), (rows, cols), raw)
    ref = ref_dequant(raw, qt, rows, cols)
    for ids in ([5, 0, 39, 5, 17], list(range(39, -1, -3))):  # a few ids (one thread), many
        got = quant.get_rows(t, ids)
        np.testing.assert_array_equal(got.view(np.uint32), ref[ids].view(np.uint32))
    with pytest.raises(IndexError):
        quant.get_rows(t, [rows])


@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [37, 16, 5])
@pytest.mark.parametrize("n", [1, 3, 17])
def test_matmul_vs_float(qt, rows, n):
    cols = 256
    raw = make_raw(qt, rows, cols, seed=rows + n)
    w = ref_dequant(raw, qt, rows, cols)
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    pk = kq.pack(raw, int(qt))
    assert (pk.rows, pk.cols) == (rows, cols)
    y1 = np.full((n, rows), np.nan, np.float32)
    y2 = np.full((n, rows), np.nan, np.float32)
    kq.matmul(pk, x, y1, 1)
    kq.matmul(pk, x, y2, 2)
    np.testing.assert_array_equal(y1, y2)  # thread count does not change results
    assert nmse(y1, ref) < 5e-4
    if qt in FLOAT_EXACT:
        assert nmse(y1, ref) < 1e-10
    ys = np.empty_like(y1)
    kq.matmul_portable(pk, x, ys, 2)  # portable C path, same packed layout
    assert nmse(ys, ref) < 5e-4
    assert nmse(ys, y1) < 1e-9



@needs_kernels
@pytest.mark.parametrize("qt", QUANT_TYPES, ids=lambda t: t.name)
def test_matmul_rows_do_not_depend_on_the_batch(qt):
    """A token's outputs are the same bits alone or in a batch: 40 tokens go through the
    prefill kernel (AVX-512 VNNI: token-tile records, 5 tiles of 8, each tile unpacking the
    weights it reads; AMX: two 16-token tiles and an 8-token tile; AVX2: 8-token tiles), 80
    through it with each group unpacked once for all its tiles (VNNI), one token through
    the single-token kernel; rows not a multiple of 16 (a masked last group)."""
    rows, cols = 37, 192
    raw = random_blocks(qt, rows, cols, seed=5)
    pk = kq.pack(raw, int(qt))
    w = ref_dequant(raw, qt, rows, cols)
    for n in (40, 80):
        x = np.random.default_rng(4).standard_normal((n, cols)).astype(np.float32)
        y = np.empty((n, rows), np.float32)
        kq.matmul(pk, x, y, 2)
        for i in sorted({0, 15, 16, 33, 39, n - 1}):
            yi = np.empty((1, rows), np.float32)
            kq.matmul(pk, x[i:i + 1], yi, 1)
            np.testing.assert_array_equal(y[i], yi[0])
        assert nmse(y, x.astype(np.float64) @ w.T.astype(np.float64)) < 5e-4


@needs_kernels
@pytest.mark.skipif(not kq.AMX, reason="the AMX tile kernel is not in use on this machine")
@pytest.mark.parametrize("cols", [576, 160, 128])
@pytest.mark.parametrize("qt", QUANT_TYPES, ids=lambda t: t.name)
def test_amx_tiles_give_the_vnni_bits(qt, cols):
    """Whole 16-token tiles on AMX (blocks four at a time, then a remainder of 1-3: 18, 5 and
    4 blocks a row) give the VNNI kernels' bits, with a masked last row group, at 1 and 2
    threads."""
    rows = 37
    raw = random_blocks(qt, rows, cols, seed=21)
    pk = kq.pack(raw, int(qt))
    x = np.random.default_rng(22).standard_normal((40, cols)).astype(np.float32)
    try:
        assert not kq._set_amx(0)
        ref = np.empty((len(x), rows), np.float32)
        kq.matmul(pk, x, ref, 1)
        assert kq._set_amx(1)
        for nt in (1, 2):
            y = np.empty_like(ref)
            kq.matmul(pk, x, y, nt)
            np.testing.assert_array_equal(y, ref)
    finally:
        kq._set_amx(1)


@needs_kernels
@pytest.mark.parametrize("qt", QUANT_TYPES, ids=lambda t: t.name)
def test_unpacked_groups_give_the_pair_loop_bits(qt):
    """AVX2 builds run work items of many Q4_0 / Q4_1 tokens on a group unpacked once: the
    same bits as the pair and one-token loops, for token counts around the threshold, partial
    4-token tiles, a masked last row group, threads 1 and 2 (other types and builds: the
    override changes nothing and the check holds as well)."""
    rows, cols = 37, 256
    raw = random_blocks(qt, rows, cols, seed=11)
    pk = kq.pack(raw, int(qt))
    x = np.random.default_rng(12).standard_normal((70, cols)).astype(np.float32)
    try:
        kq._set_unpacked_min_tokens(0)  # never: the pair / one-token loops
        ref = np.empty((len(x), rows), np.float32)
        kq.matmul(pk, x, ref, 1)
        for umin in (1, 12):
            kq._set_unpacked_min_tokens(umin)
            for n in (1, 2, 5, 6, 12, 13, 16, 70):
                for nt in (1, 2):
                    y = np.full((n, rows), np.nan, np.float32)
                    kq.matmul(pk, x[:n], y, nt)
                    np.testing.assert_array_equal(y, ref[:n])
    finally:
        kq._set_unpacked_min_tokens(-1)
    w = ref_dequant(raw, qt, rows, cols)
    assert nmse(ref, x.astype(np.float64) @ w.T.astype(np.float64)) < 5e-4


@needs_kernels
@pytest.mark.parametrize("qt", TYPES, ids=lambda t: t.name)
def test_matmul_glu_is_matmul_then_act_rows(qt):
    """quants.matmul_glu (a gated FFN's gate/up product and activation in one kernel) gives
    the bits of matmul followed by activations.act_rows, for prefill-sized inputs (token
    tiles, a partial last one; from 128 tokens, on AMX-BF16 tiles where the CPU has them: gate
    group g beside up group g + F/16 in one work item), a few tokens (the unfused fallback),
    both activations, 1 and 2 threads; rows not a multiple of 32 and the float types take
    the fallback."""
    act = _kernels.load("activations")
    for F, n in ((48, 37), (48, 3), (40, 20), (48, 147)):
        raw = random_blocks(qt, 2 * F, 128, seed=F + n)
        pk = kq.pack(raw, int(qt))
        x = np.random.default_rng(n).standard_normal((n, 128)).astype(np.float32)
        gu = np.empty((n, 2 * F), np.float32)
        kq.matmul(pk, x, gu, 1)
        for kind in (0, 1):
            want = np.empty((n, F), np.float32)
            act.act_rows(kind, gu[:, :F], gu[:, F:], want, 1)
            for nt in (1, 2):
                got = np.full((n, F), np.nan, np.float32)
                kq.matmul_glu(pk, x, got, kind, nt)
                np.testing.assert_array_equal(got, want)


@needs_kernels
@pytest.mark.parametrize("mod", ["quants", "kquants"])
def test_pack_into_caller_memory(mod):
    """pack(alloc=) puts the repacked bytes where the caller says (the huge-page arena) and
    refuses a buffer it cannot use."""
    m = _kernels.load(mod)
    qt = QT.Q4_1 if mod == "quants" else QT.Q4_K
    if mod == "kquants":
        from test_kquants import rand_weight
        raw = rand_weight(np.random.default_rng(0), qt, 32, 256)
    else:
        raw = make_raw(qt, 32, 256)
    arena = quant.WeightArena()
    got = []

    def alloc(nbytes):
        got.append(arena.alloc(nbytes))
        return got[-1]

    pk = m.pack(raw, int(qt), alloc=alloc)
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    y1, y2 = np.empty((3, 32), np.float32), np.empty((3, 32), np.float32)
    m.matmul(pk, x, y1, 1)
    m.matmul(m.pack(raw, int(qt)), x, y2, 1)
    np.testing.assert_array_equal(y1, y2)
    if pk.layout == "repacked16":
        assert len(got) == 1 and pk.buf.ctypes.data == got[0].ctypes.data
        with pytest.raises(ValueError):
            m.pack(raw, int(qt), alloc=lambda n: np.empty(n + 1, np.uint8)[1:])  # misaligned


def test_weight_arena_allocations():
    arena = quant.WeightArena()
    a, b = arena.alloc(100), arena.alloc(5000)
    big = arena.alloc(arena.CHUNK // 2)  # its own mapping
    for buf, n in ((a, 100), (b, 5000), (big, arena.CHUNK // 2)):
        assert buf.dtype == np.uint8 and buf.shape == (n,) and buf.ctypes.data % 64 == 0
        assert buf.flags.writeable
    assert b.ctypes.data >= a.ctypes.data + 100  # consecutive, not overlapping
    assert big.ctypes.data % HUGE_PAGE == 0
    a[:] = 1
    b[:] = 2
    assert (a == 1).all()


@needs_kernels
def test_linear_weights_are_packed_in_load_order():
    """Consecutive Linears are consecutive memory (the arena): a decode step streams one run."""
    ts = [Tensor(f"w{i}", int(QT.Q8_0), (64, 128), make_raw(QT.Q8_0, 64, 128, seed=i)) for i in range(2)]
    a, b = (quant.Linear(t)._packed for t in ts)
    start = b.buf.ctypes.data
    assert start == a.buf.ctypes.data + -(-a.nbytes // 64) * 64 or start % HUGE_PAGE == 0

FLOAT_EXACT = {QT.F32, QT.F16, QT.BF16}


@pytest.mark.parametrize("qt", QUANT_TYPES, ids=lambda t: t.name)
def test_matmul_random_blocks(qt):
    """Arbitrary quant bit patterns (all 5th bits, extreme Q8 values) through the int8 path."""
    rows, cols, n = 21, 128, 4
    raw = random_blocks(qt, rows, cols, seed=11)
    w = ref_dequant(raw, qt, rows, cols)
    x = np.random.default_rng(2).standard_normal((n, cols)).astype(np.float32)
    y = np.empty((n, rows), np.float32)
    kq.matmul(kq.pack(raw, int(qt)), x, y, 2)
    assert nmse(y, x.astype(np.float64) @ w.T.astype(np.float64)) < 5e-4


def test_linear_api_bias_concat():
    cols = 128
    ts = [Tensor(f"w{i}", int(QT.Q4_1), (r, cols), make_raw(QT.Q4_1, r, cols, seed=i)) for i, r in enumerate([48, 16, 21])]
    x = np.random.default_rng(0).standard_normal((3, cols)).astype(np.float32)
    bias = np.arange(48, dtype=np.float32)
    lin = quant.Linear(ts[0], bias=bias)
    assert (lin.out_features, lin.in_features) == (48, cols)
    assert lin.nbytes > 0
    ref0 = x @ ts[0].dequantize().T + bias
    assert nmse(lin(x), ref0) < 5e-4
    out = np.empty((3, 48), np.float32)
    assert lin(x, out=out) is out
    np.testing.assert_array_equal(out, lin(x))
    assert lin(x[0]).shape == (48,)

    fused = quant.Linear.concat(ts)
    parts = fused.split(fused(x))
    for t, p in zip(ts, parts):
        np.testing.assert_allclose(p, quant.Linear(t)(x), rtol=1e-5, atol=1e-5)
    other = Tensor("f", int(QT.Q8_0), (16, cols), make_raw(QT.Q8_0, 16, cols))
    assert quant.Linear.concat([ts[0], other]) is None


def test_expert_linear_grouped():
    ne, rows, cols = 4, 24, 96
    raws = np.stack([make_raw(QT.Q8_0, rows, cols, seed=e) for e in range(ne)])
    t = Tensor("exps", int(QT.Q8_0), (ne, rows, cols), raws)
    el = quant.ExpertLinear(t)
    w = t.dequantize()
    x = np.random.default_rng(1).standard_normal((7, cols)).astype(np.float32)
    assert nmse(el(x, 2), x @ w[2].T) < 5e-4
    ids, offs = [3, 0, 2], [0, 2, 2, 7]
    y = el.grouped(x, ids, offs)
    ref = np.concatenate([x[0:2] @ w[3].T, x[2:7] @ w[2].T])
    assert nmse(y, ref) < 5e-4


def test_numpy_fallback_matches(monkeypatch):
    cols = 64
    t = Tensor("w", int(QT.Q5_0), (19, cols), make_raw(QT.Q5_0, 19, cols))
    x = np.random.default_rng(0).standard_normal((2, cols)).astype(np.float32)
    fast = quant.Linear(t)(x)
    monkeypatch.setattr(_kernels, "ENABLED", False)  # what LLMCORE_NO_KERNELS=1 sets at import
    slow = quant.Linear(t)
    assert slow._packed is None
    assert nmse(fast, slow(x)) < 5e-4


def test_real_model_embedding_and_linear(smollm2_path):
    from llmcore.gguf_file import GGUFFile

    f = GGUFFile(smollm2_path)
    emb = f.tensor("token_embd.weight")  # Q8_0 49152 x 576
    ids = [0, 1, 49151, 1234]
    ref = ref_dequant(emb.raw()[ids], emb.ggml_type, len(ids), emb.shape[1])
    np.testing.assert_array_equal(quant.get_rows(emb, ids), ref)
    w = f.tensor("blk.0.ffn_down.weight")  # Q4_1 576 x 1536
    lin = quant.Linear(w)
    x = np.random.default_rng(0).standard_normal((5, w.shape[1])).astype(np.float32)
    assert nmse(lin(x), x.astype(np.float64) @ w.dequantize().T.astype(np.float64)) < 5e-4


C_HARNESS = r"""
#include "simd_quants.h"
#include <stdio.h>
static uint32_t rs = 12345; static uint32_t rnd(void){ rs ^= rs<<13; rs ^= rs>>17; rs ^= rs<<5; return rs; }
/* what quants.pyx does, on one thread */
static void matmul(const lq_packed *P, const float *x, float *y, int64_t n, int portable){
  int8_t *qa; float *da, *sa; const int64_t K = P->cols, nb = P->nb;
  if (lq_act_buffers(n, K, &qa, &da, &sa)) exit(2);
  for (int64_t i=0;i<n;i++) lq_quant_row_q8(x+i*K, K, qa+i*K, da+i*nb, sa+i*nb, P->moff);
  for (int64_t g=0;g<P->ngroups;g++) lq_group_rows(P, g, qa, da, sa, n, lq_tile_tokens(P, portable), y, portable);
}
int main(void){
  int types[5] = {GT_Q4_0, GT_Q4_1, GT_Q5_0, GT_Q5_1, GT_Q8_0}; int bad = 0;
  printf("simd level %d\n", lq_simd_level());
  for (int ti=0; ti<5; ti++){
    int type = types[ti]; int64_t R = 37, K = 128, n = 11; int bs = lq_block_bytes(type); int64_t bpr = K/32*bs;
    uint8_t *raw = malloc(R*bpr); for (int64_t i=0;i<R*bpr;i++) raw[i]=rnd();
    for (int64_t r=0;r<R;r++) for (int b=0;b<K/32;b++){ uint8_t*p=raw+r*bpr+b*bs; _Float16 d=(_Float16)(((int)(rnd()%2000)-1000)/20000.0f); memcpy(p,&d,2); if(type==GT_Q4_1||type==GT_Q5_1){ d=(_Float16)(((int)(rnd()%2000)-1000)/20000.0f); memcpy(p+2,&d,2);} }
    lq_packed P; int64_t sz = lq_init_packed(&P, type, R, K, NULL); uint8_t *pk = aligned_alloc(64, (sz+63)/64*64); lq_pack(raw,bpr,type,R,K,0,P.ngroups,pk); P.data=pk;
    float *x = malloc(n*K*4), *y0 = malloc(n*R*4), *y1 = malloc(n*R*4), *w = malloc(R*K*4);
    for (int64_t i=0;i<n*K;i++) x[i] = ((int)(rnd()%20000)-10000)/5000.0f;
    for (int64_t r=0;r<R;r++) lq_dequant_row(raw+r*bpr,type,K,w+r*K);
    matmul(&P,x,y0,n,1); matmul(&P,x,y1,n,0);
    double num=0, den=0, d01=0;
    for (int t=0;t<n;t++) for (int r=0;r<R;r++){ double ref=0; for(int k=0;k<K;k++) ref+= (double)w[r*K+k]*x[t*K+k];
      num += (y1[t*R+r]-ref)*(y1[t*R+r]-ref); den += ref*ref; d01 += (y1[t*R+r]-y0[t*R+r])*(y1[t*R+r]-y0[t*R+r]); }
    printf("type %d nmse %.3g simd-vs-scalar %.3g\n", type, num/den, d01/den); if (num/den > 5e-4 || d01/den > 1e-9) bad++;
  }
  return bad;
}
"""


@pytest.mark.parametrize("flags", [["-mavx2", "-mfma", "-mf16c"], []], ids=["avx2", "portable"])
def test_c_fallback_paths(tmp_path, flags):
    """The AVX2 and plain-C kernels (not the ones built here) agree with the float reference."""
    import subprocess

    from c_harness import build_c_harness

    exe = build_c_harness(tmp_path, C_HARNESS, flags, opt="-O1")
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    assert f"simd level {1 if flags else 0}" in out.stdout


@pytest.mark.parametrize("qt", [QT.F16, QT.Q4_1], ids=lambda t: t.name)
def test_pack_layouts(qt):
    raw = make_raw(qt, 20, 64)
    pk = kq.pack(raw, int(qt))
    assert pk.layout == ("raw" if qt == QT.F16 else "repacked16")
    assert (pk.ggml_type, pk.rows, pk.cols) == (int(qt), 20, 64)
    if qt == QT.F16:
        assert kq.pack(raw, int(qt), repack=False).layout == "raw"
    else:  # no kernel reads the quant types in the GGUF layout
        with pytest.raises(ValueError):
            kq.pack(raw, int(qt), repack=False)


@needs_kernels
def test_weight_kernel_modules_share_one_interface():
    """quants, kquants and iquants implement the one interface of llmcore.quant (its KERNEL
    MODULE INTERFACE): the same functions with the same parameters, disjoint SUPPORTED sets,
    and quant.kernel_for sends each type to its module."""
    import inspect

    mods = [_kernels.load(name) for name in quant.WEIGHT_KERNELS]
    for fn in ("pack", "matmul", "matmul_grouped", "dequantize", "get_rows"):
        sigs = {str(inspect.signature(getattr(m, fn))) for m in mods}
        assert len(sigs) == 1, (fn, sigs)
    assert str(inspect.signature(kq.matmul)) == "(packed, x, y, n_threads)"
    for m in mods:
        assert isinstance(m.SUPPORTED, frozenset) and m.SIMD_LEVEL in ("avx512vnni", "avx2", "c")
        assert all(hasattr(m.Packed, a) for a in ("ggml_type", "rows", "cols", "nbytes", "layout"))
        assert all(quant.kernel_for(t) is m for t in m.SUPPORTED)
    assert sum(len(m.SUPPORTED) for m in mods) == len(frozenset().union(*(m.SUPPORTED for m in mods)))
    assert quant.kernel_for(QT.IQ2_XXS) is None  # no kernel: the NumPy fallback


def test_missing_kernel_module_is_an_error_not_a_fallback():
    with pytest.raises(_kernels.KernelsNotBuilt, match="LLMCORE_NO_KERNELS=1"):
        _kernels.load("no_such_kernel")
    assert issubclass(_kernels.KernelsNotBuilt, ImportError)


needs_amx_bf16 = pytest.mark.skipif(
    not getattr(kq, "AMX_BF16", False),
    reason="the AMX-BF16 path is not in use here (needs AMX-BF16, Linux's tile grant, LLMCORE_NO_AMX_BF16 unset)")


@needs_kernels
@needs_amx_bf16
@pytest.mark.parametrize("qt", QUANT_TYPES, ids=lambda t: t.name)
def test_amx_bf16_matmul_is_the_float_product_within_bf16(qt):
    """Matmuls of 128 tokens or more on AMX-BF16 tiles: within bf16 rounding of the float64
    product of the dequantized weights, and closer to it than the int8 kernels (Q8 activations);
    a token's outputs are the same bits whatever the call's token count or thread count.
    Shapes: a masked last row group and an odd group count, partial token tiles, rows of 2
    and of 64 blocks."""
    for rows, cols, n in ((37, 576, 150), (48, 64, 128), (80, 2048, 301)):
        raw = make_raw(qt, rows, cols, seed=rows)
        pk = kq.pack(raw, int(qt))
        x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
        ref = x.astype(np.float64) @ ref_dequant(raw, qt, rows, cols).T.astype(np.float64)
        y = np.full((n, rows), np.nan, np.float32)
        kq.matmul(pk, x, y, 2)
        err = nmse(y, ref)
        assert err < 2e-5, err
        try:
            kq._set_amx_bf16(0)
            y8 = np.empty_like(y)
            kq.matmul(pk, x, y8, 2)
        finally:
            kq._set_amx_bf16(1)
        assert err < nmse(y8, ref)
        for a, b, nt in ((0, n, 1), (0, 128, 2), (n - 128, n, 2), (5, min(n, 140), 1)):
            if b - a >= 128:
                part = np.full((b - a, rows), np.nan, np.float32)
                kq.matmul(pk, x[a:b], part, nt)
                np.testing.assert_array_equal(part, y[a:b])


@needs_kernels
@pytest.mark.parametrize("env", ["LLMCORE_NO_AMX_BF16", "LLMCORE_NO_AMX"])
def test_amx_bf16_path_can_be_turned_off(env):
    """LLMCORE_NO_AMX_BF16=1 (or LLMCORE_NO_AMX=1) keeps every matmul on the int8 kernels."""
    import os
    import subprocess
    import sys

    code = ("from llmcore._kernels import quants, kquants; "
            "print(int(quants.AMX_BF16), int(kquants.AMX_BF16))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, env: "1"}).stdout.split()
    assert out == ["0", "0"]
