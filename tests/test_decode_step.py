"""The fused decode step (pyx/step.pyx, llmcore/models/decode_step.py): every layer of a
dense model in one parallel region. It runs the work items of the layer-by-layer path, so
its logits must be those bits exactly, whatever the thread count, the batch (one sequence,
a few with private row buffers, many with shared ones), shared prefixes, verify segments,
sliding windows, long contexts (attention split over key chunks and merged), the weight
layouts (legacy quants, float, K-quants repacked and in the GGUF layout, biases) and the
barrier's sleeping path."""
from __future__ import annotations

import contextlib
import os

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llmcore import _kernels, threads
from llmcore.models import load_model

from fixtures import add_tensor, build_gemma3, finish_gguf, rand_tokens, weight_makers
from test_kquants import rand_blocks

pytestmark = pytest.mark.skipif(not _kernels.ENABLED, reason="LLMCORE_NO_KERNELS=1: no fused step")


def llama_writer(path, name: str, d: int, H: int, KVH: int, hd: int, F: int) -> gguf.GGUFWriter:
    """A GGUF writer for a 2-layer llama of these sizes, its metadata written."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(2048)
    w.add_embedding_length(d)
    w.add_block_count(2)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KVH)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    return w


def build_kquant_llama(path, seed: int = 0):
    """2 llama layers 256 wide (head_dim 64, 4 heads / 2 kv heads, FFN 512) with K-quant
    weights of random valid blocks: q/k Q4_K and v Q6_K (three projections of two types,
    so three parts side by side), attn_output Q3_K and Q2_K (no repacked layout: the GGUF
    layout's kernel), gate/up Q4_K, down Q5_K / Q6_K, output Q6_K; q/k/v/o biases on layer 0."""
    rng = np.random.default_rng(seed)
    normal, linear, norm_w = weight_makers(rng)
    d, H, KVH, hd, F, V = 256, 4, 2, 64, 512, 256
    w = llama_writer(path, "tiny-llama-kquant", d, H, KVH, hd, F)

    def kq(name, qt, rows, cols, scale):
        bs, _ = gguf.GGML_QUANT_SIZES[qt]
        w.add_tensor(name, rand_blocks(rng, qt, rows * cols // bs, scale).reshape(rows, -1), raw_dtype=qt)

    add_tensor(w, "token_embd.weight", normal((V, d), 1.0), QT.Q8_0)
    add_tensor(w, "output_norm.weight", norm_w(d))
    kq("output.weight", QT.Q6_K, V, d, 0.01)
    for i, (wo_t, down_t) in enumerate(((QT.Q3_K, QT.Q5_K), (QT.Q2_K, QT.Q6_K))):
        p = f"blk.{i}."
        add_tensor(w, p + "attn_norm.weight", norm_w(d))
        kq(p + "attn_q.weight", QT.Q4_K, H * hd, d, 0.002)
        kq(p + "attn_k.weight", QT.Q4_K, KVH * hd, d, 0.002)
        kq(p + "attn_v.weight", QT.Q6_K, KVH * hd, d, 0.002)
        kq(p + "attn_output.weight", wo_t, d, H * hd, 0.002)
        if i == 0:
            for n, size in (("q", H * hd), ("k", KVH * hd), ("v", KVH * hd), ("output", d)):
                add_tensor(w, p + f"attn_{n}.bias", normal((size,), 0.1))
        add_tensor(w, p + "ffn_norm.weight", norm_w(d))
        kq(p + "ffn_gate.weight", QT.Q4_K, F, d, 0.002)
        kq(p + "ffn_up.weight", QT.Q4_K, F, d, 0.002)
        kq(p + "ffn_down.weight", down_t, d, F, 0.001)
    return finish_gguf(w, path)


def build_legacy_llama(path, seed: int = 1, head_ties: bool = False):
    """2 llama layers 256 wide (head_dim 64, 4 heads / 2 kv heads, FFN 512) in every legacy
    quant format: q/k Q4_1 and v Q5_0 (two parts of one type side by side), attn_output
    Q5_1, gate/up Q5_0, down Q4_1 / Q8_0, output Q4_0 over 264 rows (a last row group of 8);
    v and attn_output biases on layer 0. Wide enough that one-token chunks hold several row
    groups (the step reads a chunk's halves side by side)."""
    rng = np.random.default_rng(seed)
    normal, linear, norm_w = weight_makers(rng)
    d, H, KVH, hd, F, V = 256, 4, 2, 64, 512, 264
    w = llama_writer(path, "tiny-llama-legacy", d, H, KVH, hd, F)
    add_tensor(w, "token_embd.weight", normal((V, d), 1.0), QT.Q8_0)
    add_tensor(w, "output_norm.weight", norm_w(d))
    head = linear(d, V)
    if head_ties:  # one large row at 20, 150 and 263 (the last, short group), its negation at 40 and 200
        big = head[0] * 40.0
        for r in (20, 150, 263):
            head[r] = big
        for r in (40, 200):
            head[r] = -big
    add_tensor(w, "output.weight", head, QT.Q4_0)
    for i, down_t in enumerate((QT.Q4_1, QT.Q8_0)):
        p = f"blk.{i}."
        add_tensor(w, p + "attn_norm.weight", norm_w(d))
        add_tensor(w, p + "attn_q.weight", linear(d, H * hd), QT.Q4_1)
        add_tensor(w, p + "attn_k.weight", linear(d, KVH * hd), QT.Q4_1)
        add_tensor(w, p + "attn_v.weight", linear(d, KVH * hd), QT.Q5_0)
        add_tensor(w, p + "attn_output.weight", linear(H * hd, d), QT.Q5_1)
        if i == 0:
            add_tensor(w, p + "attn_v.bias", normal((KVH * hd,), 0.1))
            add_tensor(w, p + "attn_output.bias", normal((d,), 0.1))
        add_tensor(w, p + "ffn_norm.weight", norm_w(d))
        add_tensor(w, p + "ffn_gate.weight", linear(d, F), QT.Q5_0)
        add_tensor(w, p + "ffn_up.weight", linear(d, F), QT.Q5_0)
        add_tensor(w, p + "ffn_down.weight", linear(F, d), down_t)
    return finish_gguf(w, path)


@pytest.fixture(scope="module")
def models(tiny_models, built_model, tmp_path_factory):
    paths = dict(tiny_models)
    paths["gemma3"] = built_model("gemma3")
    paths["gemma3-q8_0"] = build_gemma3(tmp_path_factory.mktemp("gemma3q") / "tiny-gemma3-q8_0.gguf", proj_type=QT.Q8_0)
    paths["kquant"] = build_kquant_llama(tmp_path_factory.mktemp("kquant") / "tiny-kquant.gguf")
    paths["legacy"] = build_legacy_llama(tmp_path_factory.mktemp("legacy") / "tiny-legacy.gguf")
    paths["legacy-ties"] = build_legacy_llama(tmp_path_factory.mktemp("ties") / "tiny-legacy-ties.gguf", head_ties=True)
    cache = {}

    def get(name, kv_type="f16"):
        if (name, kv_type) not in cache:
            cache[name, kv_type] = load_model(paths[name], kv_type=kv_type, block_size=16)
        return cache[name, kv_type]

    return get


@contextlib.contextmanager
def layer_by_layer(m):
    """The model without its fused step (restored after)."""
    step = m.decode_step()
    m._decode_step = None
    try:
        yield
    finally:
        m._decode_step = step


@contextlib.contextmanager
def n_threads(n):
    old = threads.get_num_threads()
    threads.set_num_threads(n)
    try:
        yield
    finally:
        threads.set_num_threads(old)


@contextlib.contextmanager
def shares(nt, share_min):
    """nt threads, token shares from share_min tokens a thread (restored after)."""
    step = _kernels.load("step")
    old = step.set_share_min(share_min)
    try:
        with n_threads(nt):
            yield
    finally:
        step.set_share_min(old)


def scenario(m, long_prompt: int = 0):
    """Every kind of small step, logits of each in order: decode of one sequence, of three
    (one a fork sharing a prefix), of nine (more than the private-row limit; 8+ rows read
    tile records where the layer-by-layer path reads rows), verify segments of 5 and 10
    (all their rows' logits, decode numerics), a 40-token and a 100-token chunk (tile
    attention; up to 128 tokens a prompt runs in the fused step too)."""
    V = m.n_vocab
    out = []
    a, b = m.new_state(), m.new_state()
    m.forward([(a, rand_tokens(long_prompt or 140, 1, V))])  # > 128 tokens: the layer-by-layer path
    m.forward([(b, rand_tokens(5, 2, V))])
    c = a.fork()  # shares a's blocks
    for k in range(3):
        out.append(m.forward([(a, [k + 3])]))
    for k in range(2):
        out.append(m.forward([(a, [k + 7]), (b, [k + 11]), (c, [k + 13])]))
    many = [m.new_state() for _ in range(6)]  # 9 sequences: the step's matmuls read tile records
    for i, s in enumerate(many):
        m.forward([(s, rand_tokens(3 + 9 * i, 20 + i, V))])
    for k in range(2):
        out.append(m.forward([(s, [(5 * i + k) % V]) for i, s in enumerate([a, b, c, *many])]))
    out.append(m.forward([(b, rand_tokens(5, 30, V))], n_logits=[5]))
    out.append(m.forward([(c, rand_tokens(10, 33, V))], n_logits=[10]))  # 10 rows: tiles, 2 of them
    out.append(m.forward([(c, rand_tokens(40, 31, V))], all_logits=True))
    out.append(m.forward([(b, rand_tokens(100, 32, V))], all_logits=True))
    for s in (a, b, c, *many):
        s.release()
    return out


MODELS = [("llama-q4_0", "f16"), ("llama-f16", "f16"), ("qwen3-q8_0", "f16"), ("qwen3-f32", "q8_0"),
          ("qwen3-q4_0", "q4_0"), ("gemma3", "f16"), ("kquant", "f16"), ("kquant", "q8_0"), ("legacy", "f16")]


@pytest.mark.parametrize("name,kv_type", MODELS)
def test_fused_step_gives_the_layer_by_layer_bits(models, name, kv_type):
    m = models(name, kv_type)
    assert m.decode_step() is not None, f"{name}: no fused step"
    with n_threads(2):
        fused = scenario(m)
        with layer_by_layer(m):
            plain = scenario(m)
    with n_threads(1):
        fused_1 = scenario(m)
    for f, p, f1 in zip(fused, plain, fused_1):
        assert np.isfinite(f).all()
        np.testing.assert_array_equal(f, p)
        np.testing.assert_array_equal(f, f1)


def test_long_context_attention_split_over_key_chunks(models):
    """1100 cached tokens: a decode's attention runs as two key chunks merged at the end."""
    m = models("kquant")
    with n_threads(2):
        fused = scenario(m, long_prompt=1100)
        with layer_by_layer(m):
            plain = scenario(m, long_prompt=1100)
    for f, p in zip(fused, plain):
        np.testing.assert_array_equal(f, p)


def test_barrier_sleeping_path(models):
    """With no spin every wait at a barrier sleeps on the futex: the same logits."""
    step = _kernels.load("step")
    m = models("qwen3-q8_0")
    with n_threads(2):
        ref = scenario(m)
        old = step.set_spin_us(0)
        try:
            slept = scenario(m)
        finally:
            step.set_spin_us(old)
    for r, s in zip(ref, slept):
        np.testing.assert_array_equal(r, s)


def decode_steps(m, sizes, verify: int, seed: int):
    """Logits of decode steps of each of `sizes` sequences (twice over), then of a verify
    segment of `verify` tokens of the first sequence."""
    V = m.n_vocab
    seqs = [m.new_state() for _ in range(max(sizes))]
    for i, s in enumerate(seqs):
        m.forward([(s, rand_tokens(10 + 7 * i, seed + i, V))])
    out = [m.forward([(s, [(11 * k + 3 * i + b) % V]) for i, s in enumerate(seqs[:b])])
           for k in range(2) for b in sizes]
    out.append(m.forward([(seqs[0], rand_tokens(verify, seed + 40, V))], n_logits=[verify]))
    for s in seqs:
        s.release()
    return out


@pytest.mark.parametrize("name", ["legacy", "kquant", "gemma3-q8_0"])
def test_few_token_chunks_read_as_two_streams_give_the_same_bits(models, name):
    """A step of 1 to 7 row-major tokens reads each thread's matmul chunk as two weight
    streams side by side (its halves' row groups in lockstep, of one part or of two of one
    format, 4 tokens a pass): the same logits as one group after the other, at 1, 2 and 3
    threads (chunks of odd and even sizes, pairs across parts, a masked last row group,
    biases), for decode steps of 1, 3 and 7 sequences and a verify segment of 6 tokens (row-
    major up to 7 tokens: tile records from 8, as on AMD CPUs)."""
    step = _kernels.load("step")
    m = models(name)
    old_tiles = step.set_tiles_min(8)
    try:
        for nt in (1, 2, 3):
            with n_threads(nt):
                old = step._set_pair(0)
                try:
                    ref = decode_steps(m, (1, 3, 7), 6, 5)
                finally:
                    step._set_pair(old)
                got = decode_steps(m, (1, 3, 7), 6, 5)
            for r, g in zip(ref, got):
                assert np.isfinite(g).all()
                np.testing.assert_array_equal(r, g)
    finally:
        step.set_tiles_min(old_tiles)


@pytest.mark.parametrize("name", ["legacy", "qwen3-q4_0"])
def test_tile_records_from_two_tokens_give_the_same_bits(models, name):
    """Steps of 2 to 9 tokens read tile records or row-major rows in their legacy-quant
    matmuls by the CPU's threshold (set_tiles_min): the same logits with tiles from 2 tokens
    (a Xeon's default) as from 8 (a Zen's), at 1 and 2 threads (partial tiles of 2, 3 and 4
    tokens; rows split over the threads' half-tile shares)."""
    step = _kernels.load("step")
    m = models(name)
    for nt in (1, 2):
        with n_threads(nt):
            old = step.set_tiles_min(8)
            try:
                ref = decode_steps(m, (2, 3, 4, 5, 8, 9), 3, 60)
                step.set_tiles_min(2)
                got = decode_steps(m, (2, 3, 4, 5, 8, 9), 3, 60)
            finally:
                step.set_tiles_min(old)
        for r, g in zip(ref, got):
            assert np.isfinite(g).all()
            np.testing.assert_array_equal(r, g)


def mixed_sequences(m, n_seq: int):
    """n_seq sequences of mixed lengths, the last a fork of the fourth (sharing its blocks:
    an attention item whose rows belong to two tokens)."""
    seqs = [m.new_state() for _ in range(n_seq - 1)]
    for i, s in enumerate(seqs):
        m.forward([(s, rand_tokens(2 + 13 * i, 50 + i, m.n_vocab))])
    seqs.append(seqs[3].fork())
    return seqs


def many_sequences(m, n_seq: int = 20):
    """Decode steps of n_seq sequences (mixed_sequences), then a verify step of 5 sequences x
    5 tokens; logits of each step."""
    V = m.n_vocab
    seqs = mixed_sequences(m, n_seq)
    out = [m.forward([(s, [(7 * i + k) % V]) for i, s in enumerate(seqs)]) for k in range(3)]
    # verify segments of 5 tokens, every row's logits: a sequence's tokens straddle the shares
    out.append(m.forward([(s, rand_tokens(5, 70 + i, V)) for i, s in enumerate(seqs[:5])], n_logits=[5] * 5))
    for s in seqs:
        s.release()
    return out


@pytest.mark.parametrize("name,kv_type", [("qwen3-q4_0", "q4_0"), ("llama-q4_0", "f16")])
def test_token_shares_give_the_same_bits(models, name, kv_type):
    """A step of many sequences gives each thread a share of the tokens (team.h): the same
    logits with shares off, with every share as small as it goes, at 3 threads (shares of
    unequal tiles) and at 1 thread."""
    m = models(name, kv_type)
    with n_threads(1):
        ref = many_sequences(m)
    for nt, share_min in ((2, 8), (2, 0), (2, 1), (3, 1)):
        with shares(nt, share_min):
            got = many_sequences(m)
        for r, g in zip(ref, got):
            assert np.isfinite(g).all()
            np.testing.assert_array_equal(r, g)


def argmax_steps(m, n_seq: int = 20, with_argmax: bool = True):
    """Decode steps of 1, 3 and n_seq sequences (mixed_sequences), a verify step and a
    prompt chunk, with forward(argmax=...) (None: without): (logits, argmax) of each."""
    V = m.n_vocab
    seqs = mixed_sequences(m, n_seq)
    out = []
    for k in range(3):
        for b in (1, 3, n_seq):
            am = np.full(b, -7, np.int64) if with_argmax else None
            out.append((m.forward([(s, [(7 * i + k) % V]) for i, s in enumerate(seqs[:b])], argmax=am), am))
    am = np.full(25, -7, np.int64) if with_argmax else None
    out.append((m.forward([(s, rand_tokens(5, 70 + i, V)) for i, s in enumerate(seqs[:5])], n_logits=[5] * 5,
                          argmax=am), am))
    am = np.full(12, -7, np.int64) if with_argmax else None
    out.append((m.forward([(seqs[0], rand_tokens(12, 90, V))], all_logits=True, argmax=am), am))
    for s in seqs:
        s.release()
    return out


@pytest.mark.parametrize("name,kv_type", [("legacy", "f16"), ("legacy-ties", "f16"), ("kquant", "q8_0"),
                                          ("llama-f16", "f16"), ("qwen3-q4_0", "q4_0"), ("gemma3", "f16")])
def test_argmax_found_by_the_head_is_np_argmax(models, name, kv_type):
    """forward(argmax=...) gives each logits row's np.argmax (the first maximum: the ties
    model's head has three equal largest rows, one in the last, short row group) for one,
    three and many sequences, verify rows, a prompt chunk, at 1-3 threads and with token
    shares as small as they go, and leaves the logits as they were."""
    m = models(name, kv_type)
    with n_threads(1):
        ref = argmax_steps(m, with_argmax=False)
    for nt, share_min in ((1, 8), (2, 8), (2, 1), (3, 1)):
        with shares(nt, share_min):
            got = argmax_steps(m)
        for (logits, am), (r, _) in zip(got, ref):
            np.testing.assert_array_equal(am, np.argmax(logits, axis=1))
            np.testing.assert_array_equal(logits, r)
    if name == "legacy-ties":
        logits, am = got[2]
        np.testing.assert_array_equal(logits[:, 20], logits[:, 150])
        np.testing.assert_array_equal(logits[:, 20], logits[:, 263])
        # rows whose maximum is the tied row: always its first copy
        assert 20 in am.tolist() and not {150, 263, 200} & set(am.tolist())


def test_argmax_rejects_a_wrong_buffer(models):
    m = models("legacy")
    st = m.new_state()
    m.forward([(st, [1, 2, 3])])
    with pytest.raises(ValueError, match="argmax"):
        m.forward([(st, [4])], argmax=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="argmax"):
        m.forward([(st, [4])], argmax=np.zeros(1, np.int32))
    assert st.n_tokens == 3  # nothing appended
    am = np.zeros(1, np.int64)
    lg = m.forward([(st, [4])], argmax=am)
    assert am[0] == np.argmax(lg[0]) and st.n_tokens == 4
    st.release()


def test_token_shares_by_default_on_amd_cpus_only():
    """Token shares are the default where they were measured faster (a Zen 5) and not where
    they were measured slower (a Xeon) or never measured; $LLMCORE_STEP_SHARE_MIN overrides."""
    step = _kernels.load("step")
    assert step.default_share_min("AuthenticAMD") == 8
    assert step.default_share_min("GenuineIntel") == 0
    assert step.default_share_min("") == 0
    if "LLMCORE_STEP_SHARE_MIN" not in os.environ:
        old = step.set_share_min(0)
        step.set_share_min(old)
        assert old == step.default_share_min()


def test_tile_records_from_two_tokens_by_default_on_intel_cpus():
    """Tile records start at 8 tokens on AMD CPUs (measured slower below) and at 2 elsewhere
    (measured faster on a Xeon); $LLMCORE_STEP_TILES_MIN overrides."""
    step = _kernels.load("step")
    assert step.default_tiles_min("AuthenticAMD") == 8
    assert step.default_tiles_min("GenuineIntel") == 2
    if "LLMCORE_STEP_TILES_MIN" not in os.environ:
        old = step.set_tiles_min(5)
        step.set_tiles_min(old)
        assert old == step.default_tiles_min()


@pytest.mark.parametrize("n_seq", [6, 8, 9])
def test_row_shares_give_the_same_bits(models, n_seq):
    """Below the token-share size a step's row phases give each thread half tiles of rows
    (their tile-record lines its own): the same logits with them off, at 2 and 3 threads
    (a thread with an empty share takes the others' rows) and at 1 thread."""
    step = _kernels.load("step")
    m = models("qwen3-q4_0", "q4_0")
    with n_threads(1):
        ref = many_sequences(m, n_seq)
    for nt in (2, 3):
        for on in (1, 0):
            old = step._set_row_shares(on)
            try:
                with n_threads(nt):
                    got = many_sequences(m, n_seq)
            finally:
                step._set_row_shares(old)
            for r, g in zip(ref, got):
                assert np.isfinite(g).all()
                np.testing.assert_array_equal(r, g)


@pytest.mark.parametrize("name,kv_type", [("llama-q4_0", "f16"), ("qwen3-q8_0", "f16"), ("gemma3-q8_0", "f16")])
def test_attention_items_quantizing_their_rows_for_wo_give_the_same_bits(models, name, kv_type):
    """Where the output projection is a 32-block quant format and no row is split over key
    chunks, no row phase sits between attention and wo: each attention item quantizes its
    rows' blocks for wo. The same logits as with the row phase, at 1, 2 and 3 threads (rows
    split over key chunks keep the row phase: test_long_context_attention_split_over_key_chunks)."""
    step = _kernels.load("step")
    m = models(name, kv_type)
    assert m.decode_step().prog.wo_layers() > 0
    old = step._set_wo_fuse(0)
    try:
        with n_threads(2):
            ref = scenario(m)
    finally:
        step._set_wo_fuse(old)
    for nt in (1, 2, 3):
        with n_threads(nt):
            got = scenario(m)
        for r, g in zip(ref, got):
            assert np.isfinite(g).all()
            np.testing.assert_array_equal(r, g)


@pytest.mark.parametrize("name", ["qwen3moe-f32", "mamba", "lfm2", "qwen35moe"])
def test_models_with_other_layers_run_layer_by_layer(built_model, name):
    m = load_model(built_model(name), block_size=16)
    assert m.decode_step() is None
    st = m.new_state()
    assert np.isfinite(m.forward([(st, [1, 2, 3])])).all()
    assert np.isfinite(m.forward([(st, [4])])).all()
    st.release()


def test_a_position_without_a_block_is_refused(models):
    """A step whose tables do not cover a position raises before anything is written."""
    m = models("llama-q4_0")
    step = m.decode_step()
    st = m.new_state()
    m.forward([(st, [1, 2, 3])])
    x = np.zeros((1, m.args.n_embd), np.float32)
    tables = [np.full((1, 1), -1, np.int32) for _ in step.groups]
    logits = np.empty((1, m.n_vocab), np.float32)
    with pytest.raises(ValueError, match="maps to no block"):
        step.prog.run(x, np.array([3], np.int32), np.array([0, 1], np.int32), tables,
                      np.array([0], np.int64), logits, None, 1)
    before = m.forward([(st.fork(), [4])])
    again = m.forward([(st, [4])])
    np.testing.assert_array_equal(before, again)
    st.release()


def test_head_softcap_applied(models):
    """A final logit soft-cap (gemma2-style heads) is applied to the fused step's logits."""
    m = models("llama-q4_0")
    st = m.new_state()
    m.forward([(st, [1, 2, 3])])
    plain = m.forward([(st.fork(), [4])])[0]
    old = m.head.softcap
    m.__dict__.pop("_decode_step", None)
    m.head.softcap = 2.0
    try:
        capped = m.forward([(st, [4])])[0]
    finally:
        m.head.softcap = old
        m.__dict__.pop("_decode_step", None)
    np.testing.assert_allclose(capped, np.tanh(plain / 2.0) * 2.0, rtol=1e-6, atol=1e-6)
    assert np.abs(plain).max() > 2.0 and np.abs(capped).max() <= 2.0
    st.release()
