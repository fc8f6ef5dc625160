"""The blocked (flash-style) attention kernel against the NumPy reference, and its promises:
every KV type, sliding window, softcap, sinks and GQA shapes in both work-item kinds (tiles
of prefill rows, decode rows per fixed key chunk); decode sequences that share prefix blocks
are computed together and get exactly the bits they get alone; results never depend on the
thread count."""
import numpy as np
import pytest

from llmcore import _kernels, nn

from test_nn import build_case, rng

pytestmark = pytest.mark.skipif(not _kernels.ENABLED,
                                reason="LLMCORE_NO_KERNELS=1: nothing to compare the NumPy references with")

KV_TYPES = ["f16", "f32", "q8_0", "q4_0"]
CHUNK_KEYS = 1024  # pyx/attention.pyx: decode items cover fixed chunks of this many keys


@pytest.fixture
def n_threads():
    from llmcore import threads

    before = threads.get_num_threads()
    yield threads.set_num_threads
    threads.set_num_threads(before)


def both(case, kv_type, scale, **kw):
    q, k_pool, v_pool, tables, seg, q_pos = case
    got = nn.attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, scale, **kw)
    want = nn._ref_attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, scale, **kw)
    return got, want


def assert_close(got, want):
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("H,KVH", [(9, 3), (4, 1), (8, 8), (64, 1)])
def test_prefill_tiles_and_decode_rows(kv_type, H, KVH):
    # a long prefill chunk (tiles), a short one continuing a cached prefix, decodes of one and
    # two tokens (rows); G = 64 takes items of 48-head chunks
    D = 64 if kv_type in ("q8_0", "q4_0") else 48
    case = build_case(kv_type, seq_lens=[150, 90, 33, 300, 7], n_q=[150, 20, 1, 2, 1], H=H, KVH=KVH, D=D,
                      bs=32, seed=31)
    got, want = both(case, kv_type, 1.0 / np.sqrt(D))
    assert_close(got, want)


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("bs", [8, 16, 64])
def test_block_sizes_window_softcap_sinks(kv_type, bs):
    # windowed: the blocks before every window are freed (-1, NaN inside) and never read
    freed = build_case(kv_type, seq_lens=[130, 61, 200], n_q=[130, 1, 3], H=6, KVH=2, D=64, bs=bs,
                       window=40, free_outside=True, seed=32)
    full = build_case(kv_type, seq_lens=[130, 61, 200], n_q=[130, 1, 3], H=6, KVH=2, D=64, bs=bs, seed=32)
    sinks = rng(33).standard_normal(6).astype(np.float32) * 2
    for case, kw in ((freed, dict(window=40)), (full, dict(softcap=8.0)), (full, dict(sinks=sinks)),
                     (freed, dict(window=40, softcap=8.0, sinks=sinks))):
        got, want = both(case, kv_type, 0.3, **kw)
        assert_close(got, want)


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_long_decode_over_several_chunks(kv_type):
    # 3.5 chunks of keys: partials per chunk, merged in order (with sinks, and a window that
    # starts inside a chunk)
    n = 3 * CHUNK_KEYS + 500
    case = build_case(kv_type, seq_lens=[n, n - 7], n_q=[1, 2], H=8, KVH=2, D=64, bs=32, seed=34)
    sinks = np.linspace(-2, 3, 8).astype(np.float32)
    for kw in (dict(), dict(sinks=sinks), dict(window=CHUNK_KEYS + 100, sinks=sinks)):
        got, want = both(case, kv_type, 0.125, **kw)
        assert_close(got, want)


def test_prefill_split_along_keys():
    # one short prefill chunk at depth with a single kv head: few tiles, split along the keys
    case = build_case("f16", seq_lens=[2500], n_q=[30], H=4, KVH=1, D=256, bs=32, seed=35)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    for kw in (dict(), dict(sinks=sinks), dict(window=600)):
        got, want = both(case, "f16", 0.0625, **kw)
        assert_close(got, want)


def shared_prefix_case(kv_type, *, n_seq, prefix, tails, H=9, KVH=3, D=64, bs=32, seed=36):
    """n_seq sequences whose first `prefix` positions (whole blocks) are the same pool
    blocks, each with its own tail; one decode query per sequence at its last position."""
    r = rng(seed)
    assert prefix % bs == 0
    nb_pre = prefix // bs
    lens = [prefix + t for t in tails]
    nb = [(n + bs - 1) // bs for n in lens]
    total = nb_pre + sum(b - nb_pre for b in nb)
    ids = r.permutation(total + 2).astype(np.int32)
    k_pool = nn.make_kv_pool(kv_type, total + 2, bs, KVH, D)
    v_pool = nn.make_kv_pool(kv_type, total + 2, bs, KVH, D)
    tables = np.full((n_seq, max(nb)), -1, np.int32)
    used = nb_pre
    for s in range(n_seq):
        tables[s, :nb_pre] = ids[:nb_pre]
        tables[s, nb_pre:nb[s]] = ids[used:used + nb[s] - nb_pre]
        used += nb[s] - nb_pre
    pos = np.arange(prefix, dtype=np.int32)
    nn.kv_store(k_pool, kv_type, tables[0], pos, r.standard_normal((prefix, KVH, D), dtype=np.float32))
    nn.kv_store(v_pool, kv_type, tables[0], pos, r.standard_normal((prefix, KVH, D), dtype=np.float32))
    for s in range(n_seq):
        p = np.arange(prefix, lens[s], dtype=np.int32)
        nn.kv_store(k_pool, kv_type, tables[s], p, r.standard_normal((len(p), KVH, D), dtype=np.float32))
        nn.kv_store(v_pool, kv_type, tables[s], p, r.standard_normal((len(p), KVH, D), dtype=np.float32))
    q_pos = np.array([n - 1 for n in lens], np.int32)
    q = r.standard_normal((n_seq, H, D), dtype=np.float32)
    return q, k_pool, v_pool, tables, np.arange(n_seq + 1, dtype=np.int32), q_pos


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("n_seq,H,KVH,exact", [(4, 9, 3, True), (3, 4, 1, True), (5, 16, 8, True),
                                               (12, 9, 3, False), (6, 4, 1, False), (3, 64, 8, False)])
def test_shared_prefix_batched_decode_equals_each_alone(kv_type, n_seq, H, KVH, exact):
    # the shared chunks are one item for all the sequences: while they have fewer than 16
    # rows per kv head (rows kernel) the bits are those of each sequence alone; with more
    # (tile kernel) the same within float rounding
    tails = [3 + 37 * i % 300 for i in range(n_seq)]
    case = shared_prefix_case(kv_type, n_seq=n_seq, prefix=2 * CHUNK_KEYS + 64, tails=tails, H=H, KVH=KVH)
    q, k_pool, v_pool, tables, seg, q_pos = case
    sinks = rng(37).standard_normal(H).astype(np.float32)
    for kw in (dict(), dict(sinks=sinks, softcap=20.0)):
        batched = nn.attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, **kw)
        for s in range(n_seq):
            alone = nn.attention(q[s:s + 1], k_pool, v_pool, kv_type, tables[s:s + 1], np.array([0, 1], np.int32),
                                 q_pos[s:s + 1], 0.125, **kw)
            if exact:
                np.testing.assert_array_equal(batched[s], alone[0])
            else:
                np.testing.assert_allclose(batched[s], alone[0], rtol=1e-5, atol=1e-6)
        want = nn._ref_attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, **kw)
        assert_close(batched, want)


def test_shared_prefix_with_prefill_in_the_same_batch():
    # a prefill chunk of another sequence and decodes sharing a prefix, in one call: the
    # decodes' bits do not change
    q, k_pool, v_pool, tables, seg, q_pos = shared_prefix_case("f16", n_seq=5, prefix=CHUNK_KEYS, tails=[5, 9, 40, 1, 70])
    alone = nn.attention(q, k_pool, v_pool, "f16", tables, seg, q_pos, 0.125)
    # sequence 0 as a prefill of its last 20 positions instead of one decode row
    n0 = int(q_pos[0]) + 1
    qp = np.concatenate([np.arange(n0 - 20, n0, dtype=np.int32), q_pos[1:]])
    qq = np.concatenate([rng(38).standard_normal((19, 9, 64), dtype=np.float32), q])
    qq = np.concatenate([qq[:19], qq[19:20], qq[20:]])  # rows 0..19: sequence 0 (last is its old query)
    s2 = np.array([0, 20, 21, 22, 23, 24], np.int32)
    mixed = nn.attention(qq, k_pool, v_pool, "f16", tables, s2, qp, 0.125)
    np.testing.assert_array_equal(mixed[20:], alone[1:])
    want = nn._ref_attention(qq, k_pool, v_pool, "f16", tables, s2, qp, 0.125)
    assert_close(mixed, want)


def test_threads_identical_every_item_kind(n_threads):
    case = build_case("q8_0", seq_lens=[700, 9, 2200, 1500, 64], n_q=[300, 1, 1, 2, 64], H=8, KVH=2, D=64,
                      seed=39)
    q, k_pool, v_pool, tables, seg, q_pos = case
    sinks = np.linspace(-1, 1, 8).astype(np.float32)
    outs = []
    for t in (1, 2, 3):
        n_threads(t)
        outs.append(nn.attention(q, k_pool, v_pool, "q8_0", tables, seg, q_pos, 0.125, window=900, sinks=sinks))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    assert_close(outs[0], nn._ref_attention(q, k_pool, v_pool, "q8_0", tables, seg, q_pos, 0.125, window=900,
                                            sinks=sinks))


def test_large_scores_do_not_overflow():
    # scores in the hundreds (log2 units ~ 1.4x): the running max keeps exp2 in range; the
    # softmax is nearly one-hot, so a score's last bits (1e-5 of 200) show in the output
    case = build_case("f32", seq_lens=[300, 80], n_q=[300, 1], H=4, KVH=2, D=32, seed=40)
    got, want = both(case, "f32", 40.0)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=5e-4)


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("H,KVH,D", [(9, 3, 64), (4, 1, 32), (8, 8, 96), (16, 2, 256)])
def test_decode_seqs_give_each_token_its_one_token_decode_bits(kv_type, H, KVH, D):
    # verify segments (17 and 40 tokens, one crossing a key chunk boundary) next to a plain
    # decode and a prefill chunk: each marked token gets exactly the bits of decoding it
    # alone at its position (the rows kernel whatever the row count), unmarked ones as before
    n_q = [17, 1, 40, 60]
    case = build_case(kv_type, seq_lens=[CHUNK_KEYS + 9, 300, 200, 150], n_q=n_q, H=H, KVH=KVH, D=D, bs=32,
                      seed=37)
    q, k_pool, v_pool, tables, seg, q_pos = case
    dec = np.array([1, 0, 1, 0], np.uint8)
    sinks = np.linspace(-1, 2, H).astype(np.float32)
    for kw in (dict(), dict(window=100, sinks=sinks), dict(softcap=5.0)):
        got = nn.attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, decode_seqs=dec, **kw)
        assert_close(got, nn._ref_attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, **kw))
        plain = nn.attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, **kw)
        for s in (1, 3):
            np.testing.assert_array_equal(got[seg[s]:seg[s + 1]], plain[seg[s]:seg[s + 1]])
        for s in (0, 2):
            for t in range(seg[s], seg[s + 1]):
                alone = nn.attention(q[t:t + 1], k_pool, v_pool, kv_type, tables[s:s + 1],
                                     np.array([0, 1], np.int32), q_pos[t:t + 1], 0.125, **kw)
                np.testing.assert_array_equal(got[t], alone[0], err_msg=f"seq {s} token {t - seg[s]} {kw}")
    with pytest.raises(ValueError, match="decode_seqs"):
        nn.attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, decode_seqs=dec[:2])


def _kernel_switch(setter_name, value):
    """A fixture body: the attention kernel's A/B setter set to value, yielded, and put back."""
    from llmcore._kernels import attention as kernel

    setter = getattr(kernel, setter_name)
    before = setter(value)
    yield setter
    setter(before)


@pytest.fixture
def lanes_min_rows():
    yield from _kernel_switch("_set_lanes_min_rows", 8)


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("H,KVH,D", [(9, 3, 64), (4, 1, 32), (16, 2, 128), (8, 8, 96)])
@pytest.mark.parametrize("n_q", [[17, 1, 40, 3, 1], [6, 1, 11, 5, 1]])
def test_rows_items_in_lanes_form_get_the_rows_kernels_bits(kv_type, H, KVH, D, n_q, lanes_min_rows):
    # a rows item with many rows of one kv head (verify segments; decodes of 8+ query heads per
    # kv head) runs with rows in lanes: the same sums in the same order as the rows kernel,
    # so every row's bits are the rows kernel's (verify tokens keep their decode bits); a few
    # rows past whole lane vectors (18 = 16 + 2, 33 = 32 + 1, 24 = 16 + 8 rows a kv head) go
    # through the rows kernel in the same item
    case = build_case(kv_type, seq_lens=[CHUNK_KEYS + 9, 300, 200, 150, 41], n_q=n_q, H=H, KVH=KVH, D=D, bs=32,
                      seed=41)
    q, k_pool, v_pool, tables, seg, q_pos = case
    dec = np.array([1, 1, 1, 1, 0], np.uint8)
    sinks = np.linspace(-1, 2, H).astype(np.float32)
    q_big = q * 30.0  # scores in the hundreds: alpha and the running max matter
    for qq, kw in ((q, dict()), (q, dict(window=100, sinks=sinks)), (q, dict(softcap=5.0)), (q_big, dict())):
        got = {}
        for min_rows in (8, 2**31 - 1):
            lanes_min_rows(min_rows)
            got[min_rows] = nn.attention(qq, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, decode_seqs=dec,
                                         **kw)
        np.testing.assert_array_equal(got[8], got[2**31 - 1], err_msg=str(kw))
        if qq is q:
            assert_close(got[8], nn._ref_attention(qq, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, **kw))


@pytest.fixture
def split_heads():
    yield from _kernel_switch("_set_split_heads", 1)


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("H,KVH", [(4, 1), (5, 1), (9, 3), (8, 2)])
@pytest.mark.parametrize("seq_len,window", [(200, 0), (700, 0), (1000, 0), (2000, 300)])
def test_lone_decode_item_split_by_heads_keeps_its_bits(kv_type, H, KVH, seq_len, window, split_heads):
    # one sequence's decode whose rows would be one item (one kv head) over at most 1024 keys
    # (SPLIT_HEADS_MAX_KEYS in pyx/attn_plan.pxd) goes out as two items of half the heads, so
    # two threads share it: each row's sums are its own, so the bits are the one item's; more
    # kv heads keep an item each
    from llmcore._kernels import attention as kernel

    case = build_case(kv_type, seq_lens=[seq_len], n_q=[1], H=H, KVH=KVH, D=64, bs=32, seed=43)
    q, k_pool, v_pool, tables, seg, q_pos = case
    kw = dict(window=window) if window else dict(softcap=5.0)
    items = kernel._plan_items(tables, seg, q_pos, H, KVH, 32, window)
    span = ((int(q_pos[0]) // 32) - max(0, int(q_pos[0]) - window + 1 if window else 0) // 32) * 32
    if KVH == 1 and span <= kernel.SPLIT_HEADS_MAX_KEYS:
        H2 = (H + 1) // 2
        assert sorted((it[2], it[3]) for it in items) == [(0, H2), (H2, H)]
    else:
        assert sorted((it[2], it[3]) for it in items) == [(g * (H // KVH), (g + 1) * (H // KVH)) for g in range(KVH)]
    got = {}
    for on in (1, 0):
        split_heads(on)
        got[on] = nn.attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, **kw)
    assert len(kernel._plan_items(tables, seg, q_pos, H, KVH, 32, window)) == KVH
    np.testing.assert_array_equal(got[1], got[0])
    assert_close(got[1], nn._ref_attention(q, k_pool, v_pool, kv_type, tables, seg, q_pos, 0.125, **kw))


@pytest.mark.skipif(not getattr(_kernels.load("attention") if _kernels.ENABLED else None, "AMX_BF16", False),
                    reason="the AMX-BF16 tile items are not in use here (needs AMX-BF16, Linux's tile grant)")
@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_amx_bf16_prompt_tiles_agree_with_the_f32_tiles(kv_type):
    # on AMX-BF16 a prompt's tile items are tile products of bf16 high and low parts (scores
    # and P.V good to ~16 bits, a lazy running max): close to the f32 tiles and the reference
    # with a window, softcap and sinks, GQA of 3 and 8, heads of 64 and 128, a chunk that
    # continues a cached prefix and row counts that are not whole tiles; decode rows keep
    # their bits
    kern = _kernels.load("attention")
    for H, KVH, D in ((9, 3, 64), (16, 2, 128)):
        case = build_case(kv_type, seq_lens=[150, 90, 300, 7], n_q=[150, 20, 2, 1], H=H, KVH=KVH, D=D, bs=32,
                          seed=51)
        seg = case[4]
        sinks = rng(52).standard_normal(H).astype(np.float32)
        for kw in (dict(), dict(window=40), dict(softcap=8.0, sinks=sinks)):
            got, want = both(case, kv_type, 1.0 / np.sqrt(D), **kw)
            try:
                assert not kern._set_amx_bf16(0)
                f32, _ = both(case, kv_type, 1.0 / np.sqrt(D), **kw)
            finally:
                kern._set_amx_bf16(1)
            assert np.isfinite(got).all()
            assert not np.array_equal(got[:seg[2]], f32[:seg[2]])  # the prompts took the tile products
            np.testing.assert_allclose(got, f32, rtol=1e-3, atol=4e-5)
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=4e-5)
            np.testing.assert_array_equal(got[seg[2]:], f32[seg[2]:])


@pytest.mark.parametrize("kv_type", ["q4_0", "q8_0"])
@pytest.mark.parametrize("bs", [8, 32, 256])
def test_block_scales_converted_first_keep_the_bits(kv_type, bs):
    """Decode rows over a Q4_0 / Q8_0 V read the item's block scales as floats converted first (16
    rows a gather) instead of one by one in the P.V loop: the same bits, for one and several
    rows a kv head, a window that starts inside a block, a verify segment past the rows
    kernel's in-place limit, long decodes over several key chunks, and head dims of 64 and 128."""
    kern = _kernels.load("attention")
    for H, KVH, D in ((9, 3, 64), (8, 2, 128)):
        case = build_case(kv_type, seq_lens=[300, 61, 3 * CHUNK_KEYS + 200, 40], n_q=[1, 3, 2, 12], H=H, KVH=KVH,
                          D=D, bs=bs, seed=61)
        for kw in (dict(), dict(window=45)):
            got = both(case, kv_type, 0.125, **kw)[0]
            old = kern._set_pv_scales_first(0)
            try:
                in_loop = both(case, kv_type, 0.125, **kw)[0]
            finally:
                kern._set_pv_scales_first(old)
            np.testing.assert_array_equal(got, in_loop)
