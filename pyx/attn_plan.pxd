# The attention plan: which work items (simd_attention.h) one attention call runs, inlined
# into every module that cimports it (attention.pyx plans each call; step.pyx plans once
# per decode step and runs the plan in every layer, since the items depend only on the
# positions, the block tables and the window, never on the layer).
#
# Work items: a set of query rows of one kv head (tokens x heads of its group) and a range
# of K/V blocks. Prefill tokens of a sequence form tiles of up to 96 rows over the keys the
# tile sees (split along the keys, at block boundaries, when the call has few items).
# Decode tokens (few rows) form items per fixed key chunk; decode sequences whose blocks in
# a chunk are the same (a shared prefix) are one item, so each shared block is read once
# per step for all of them (with the rows kernel while they are few: each sequence gets the
# bits it gets alone; with the tile kernel when they have 16 or more rows per kv head). A
# row covered by several items ends as partials (o, m, l), merged in chunk order. Items
# depend on the shapes and tables only, never on the thread count. Sequences marked in
# decode_seqs (speculative decoding's verify segments) take rows items whatever their row
# count, never tiles: each token gets the bits a one-token decode at its position gets.
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcmp

cdef extern from "simd_attention.h" nogil:
    int ATTN_KV_F32, ATTN_KV_F16, ATTN_KV_Q8_0, ATTN_KV_Q4_0
    int ATTN_TILE_ROWS, ATTN_MAX_ROWS, ATTN_MAX_BS
    ctypedef struct attn_ctx:
        const float *q
        float *out
        const uint8_t *k
        const uint8_t *v
        long k_bstride, v_bstride
        int k_row, v_row
        int kv_type, bs, KVH, H, G, D, Dv
        const int32_t *tables
        int max_blocks
        const int32_t *q_pos
        float scale, softcap
        int window
        const float *sinks
        const int32_t *toks
        const int32_t *slot_base
        const int32_t *chunk0
        const int32_t *nparts
        float *partial
        int k_tiled
    ctypedef struct attn_item:
        int32_t kind, seq, h0, h1, tok0, tok1, b0, b1, chunk
    long attn_scratch_floats(int D, int Dv, int bs)
    void attn_run_item(const attn_ctx *c, const attn_item *it, float *buf)
    void attn_merge(const attn_ctx *c, int t, int h)
    int attn_set_lanes_min_rows(int n)
    int attn_set_pf_spread(int on)
    int attn_set_pf_lin(int on)
    int attn_split_heads
    int attn_set_split_heads(int on)
    int attn_set_pv_scales_first(int on)

cdef enum:
    # a sequence with at most this many query rows per kv head (query tokens x GQA group)
    # takes the rows kernel (decode); more take the tile kernel (prefill). Decodes that
    # share blocks take the tile kernel there when together they have this many rows.
    ROWS_MAX_QG = 16
    # rows items cover chunks of this many keys at fixed positions (0, CHUNK_KEYS, ...), so
    # a sequence's result does not depend on the batch it is decoded in
    CHUNK_KEYS = 1024
    # tile items are split along the keys when a call has fewer items than this
    SPLIT_MIN_ITEMS = 32
    SPLIT_MIN_BLOCKS = 8
    # a chunk with at least this many groups of decode rows gives each group one rows item
    # over all its kv heads (enough items to share out without splitting a sequence by kv
    # head): a token's K/V rows of all kv heads are adjacent, and a Q4_0 row of 36 bytes
    # straddles lines, so per-kv-head items each fetched most of a block's lines
    # (bench/attn_decode.py -t 1 --kv q4_0, SmolLM2's shape: 32 sequences 16.7-17.0 ->
    # 14.7-15.5 ms, 8 sequences 3.81-3.94 -> 3.51-3.67 ms; f16 even)
    ROWS_WHOLE_MIN_GROUPS = 8
    # a call whose only item is one decode's rows of its one kv head (gemma-3: 4 heads, 1 kv
    # head) over at most this many keys (one key chunk; past it the chunks are items enough)
    # gives each half of the heads an item, so both threads work (rows are independent: the
    # same bits); each item reads the whole K/V. gemma-3-270m, one sequence, alternated in
    # one process: 0.97-0.99x the step's time at 128-450 keys; on a Xeon with AMX (session
    # 43) 0.93x at 600 and 900 keys, 0.94x at 700 with a Q8_0 cache (a limit of 512 had
    # measured 1.01x at 1000 keys on an earlier build). SmolLM2's three kv-head items split
    # the same way (two items across kv heads) were even: its threads hardly waited at
    # attention (~5 us a step)
    SPLIT_HEADS_MAX_KEYS = 1024


cdef struct attn_plan:
    attn_item *items      # (n_items,), costliest first
    long n_items
    int32_t *toks         # the items' token lists
    int32_t *tinfo        # (3, N): slot_base, chunk0, nparts of each token
    float *partial        # (n_slots, H, Dv + 2): o, m, l of split rows
    long n_slots
    long n_merge          # tokens whose rows are split over several items
    long kv_bytes         # K/V bytes the items read


cdef inline int _cmp_cost(const void *a, const void *b) noexcept nogil:
    """qsort: costlier items first (rows x blocks), ties in plan order."""
    cdef const attn_item *x = <const attn_item *>a
    cdef const attn_item *y = <const attn_item *>b
    cdef long cx = <long>(x.tok1 - x.tok0) * (x.h1 - x.h0) * (x.b1 - x.b0)
    cdef long cy = <long>(y.tok1 - y.tok0) * (y.h1 - y.h0) * (y.b1 - y.b0)
    if cx != cy:
        return -1 if cx > cy else 1
    return -1 if x.chunk < y.chunk else (1 if x.chunk > y.chunk else 0)


cdef inline int _key_lo(int qp, int window) noexcept nogil:
    cdef int lo = qp - window + 1 if window > 0 else 0
    return lo if lo > 0 else 0


cdef inline uint64_t _hash_ids(const int32_t *ids, int n) noexcept nogil:
    cdef uint64_t h = 1469598103934665603ULL
    cdef int i
    for i in range(n):
        h = (h ^ <uint32_t>ids[i]) * 1099511628211ULL
    return h


cdef inline void _rows_item(attn_item *it, int seq, int h0, int h1, long tok0, long tok1, int b0, int b1,
                            int chunk) noexcept nogil:
    it.kind = 1
    it.seq = seq
    it.h0 = h0
    it.h1 = h1
    it.tok0 = <int32_t>tok0
    it.tok1 = <int32_t>tok1
    it.b0 = b0
    it.b1 = b1
    it.chunk = chunk


cdef inline void attn_plan_free(attn_plan *pl) noexcept nogil:
    free(pl.items)
    free(pl.toks)
    free(pl.tinfo)
    free(pl.partial)
    pl.items = NULL
    pl.toks = NULL
    pl.tinfo = NULL
    pl.partial = NULL
    pl.n_items = 0


cdef inline void attn_plan_ctx(const attn_plan *pl, attn_ctx *c, int N) noexcept nogil:
    """Point the call's context at the plan's token lists and partials."""
    c.toks = pl.toks
    c.slot_base = pl.tinfo
    c.chunk0 = pl.tinfo + N
    c.nparts = pl.tinfo + 2 * N
    c.partial = pl.partial


cdef inline int attn_plan_build(attn_plan *pl, int N, int H, int KVH, int Dv, int bs, int k_row, int v_row,
                                const int32_t *block_tables, int S, int MB, const int32_t *seg_start,
                                const int32_t *q_pos, int window, const uint8_t *dec) noexcept nogil:
    """The items of one attention call (arguments as attention.attention's, validated;
    block_tables (S, MB) row-major). Returns 0, or -1 when memory runs out (nothing to free).
    """
    cdef int G = H // KVH
    # rows of an item: T tokens x Gi heads; a group larger than an item takes head chunks
    cdef int Gi = G if G <= ATTN_MAX_ROWS else ATTN_MAX_ROWS
    cdef int n_gc = (G + Gi - 1) // Gi
    cdef int T_tile = ATTN_TILE_ROWS // Gi if Gi <= ATTN_TILE_ROWS else 1
    cdef int T_rows = ATTN_MAX_ROWS // Gi if Gi <= ATTN_MAX_ROWS else 1
    cdef int CH = CHUNK_KEYS // bs if bs < CHUNK_KEYS else 1
    cdef int s, r0, r1, t, qp, qmin, qmax, k, ns, nb, gc, kvh, b0, b1, ch, nq
    cdef long max_items = 0, max_toks = 0, n_tile_base = 0, n_row_items = 0
    cdef int c_max = -1
    pl.items = NULL
    pl.toks = NULL
    pl.tinfo = NULL
    pl.partial = NULL
    pl.n_items = 0
    cdef int *seq_lo = <int *>malloc(5 * (S if S > 1 else 1) * sizeof(int))
    if seq_lo == NULL:
        return -1
    cdef int *seq_hi = seq_lo + S
    cdef int *seq_rows = seq_hi + S  # > 0: rows kernel
    cdef int *seq_c0 = seq_rows + S
    cdef int *seq_c1 = seq_c0 + S
    for s in range(S):
        r0 = seg_start[s]
        r1 = seg_start[s + 1]
        nq = r1 - r0
        seq_rows[s] = 0
        seq_lo[s] = 0
        seq_hi[s] = -1
        if nq == 0:
            continue
        qmin = q_pos[r0]
        qmax = q_pos[r0]
        for t in range(r0, r1):
            qp = q_pos[t]
            qmin = qp if qp < qmin else qmin
            qmax = qp if qp > qmax else qmax
        seq_lo[s] = _key_lo(qmin, window) // bs
        seq_hi[s] = qmax // bs
        # 2: rows kernel asked for (decode numerics), 1: few rows
        seq_rows[s] = 2 if dec != NULL and dec[s] else (1 if nq * G <= ROWS_MAX_QG else 0)
        if seq_rows[s]:
            seq_c0[s] = seq_lo[s] // CH
            seq_c1[s] = seq_hi[s] // CH
            if seq_c1[s] > c_max:
                c_max = seq_c1[s]
            max_toks += <long>nq * (seq_c1[s] - seq_c0[s] + 1)
            n_row_items += (<long>(nq + T_rows - 1) // T_rows) * (seq_c1[s] - seq_c0[s] + 1) * n_gc * KVH
        else:
            n_tile_base += (<long>(nq + T_tile - 1) // T_tile) * n_gc * KVH
            max_toks += nq
    # one sequence's few rows of one kv head over few keys: two items of half the heads each
    # (SPLIT_HEADS_MAX_KEYS)
    cdef int halves = 0
    if (attn_split_heads and n_tile_base == 0 and S == 1 and n_row_items == 1 and KVH == 1 and H > 1
            and (seg_start[1] - seg_start[0]) * G < ROWS_MAX_QG
            and (seg_start[1] - seg_start[0]) * ((H + 1) // 2) <= ATTN_MAX_ROWS
            and (seq_hi[0] - seq_lo[0]) * bs <= SPLIT_HEADS_MAX_KEYS):
        halves = 1
        n_row_items = 2
    # split tile items along the keys when there are few items in all
    cdef long base_items = n_tile_base + n_row_items
    cdef int want = <int>((SPLIT_MIN_ITEMS + base_items - 1) // base_items) if 0 < base_items < SPLIT_MIN_ITEMS else 1
    max_items = n_tile_base * want + n_row_items
    cdef attn_item *items = <attn_item *>malloc((max_items if max_items > 1 else 1) * sizeof(attn_item))
    cdef int32_t *toks = <int32_t *>malloc((max_toks if max_toks > 1 else 1) * sizeof(int32_t))
    cdef int32_t *tinfo = <int32_t *>malloc(3 * (N if N > 1 else 1) * sizeof(int32_t))
    # rows-kernel grouping, per chunk: group representative, its block range and ids' hash
    cdef int *grp_rep = <int *>malloc(5 * (S if S > 1 else 1) * sizeof(int))
    cdef uint64_t *grp_hash = <uint64_t *>malloc((S if S > 1 else 1) * sizeof(uint64_t))
    cdef int *mem_next = <int *>malloc((S if S > 1 else 1) * sizeof(int))
    if items == NULL or toks == NULL or tinfo == NULL or grp_rep == NULL or grp_hash == NULL or mem_next == NULL:
        free(seq_lo); free(items); free(toks); free(tinfo); free(grp_rep); free(grp_hash); free(mem_next)
        return -1
    cdef int *grp_b0 = grp_rep + S
    cdef int *grp_b1 = grp_b0 + S
    cdef int *grp_last = grp_b1 + S
    cdef int *grp_exact = grp_last + S  # a member asked for decode numerics
    cdef int32_t *slot_base = tinfo
    cdef int32_t *chunk0 = tinfo + N
    cdef int32_t *nparts = tinfo + 2 * N
    cdef long n_items = 0, n_toks = 0, n_slots = 0, tk0, tk, i, kv_bytes = 0
    cdef int n_grp, gi, m, found, T
    cdef bint tile
    cdef uint64_t hsh
    cdef attn_item *it
    for t in range(N):
        nparts[t] = 1
        slot_base[t] = 0
        chunk0[t] = 0
    # tile items
    for s in range(S):
        if seq_rows[s] or seg_start[s + 1] == seg_start[s]:
            continue
        r0 = seg_start[s]
        r1 = seg_start[s + 1]
        t = r0
        while t < r1:
            tk0 = n_toks
            qmin = q_pos[t]
            qmax = q_pos[t]
            for k in range(t, t + T_tile if t + T_tile < r1 else r1):
                toks[n_toks] = k
                n_toks += 1
                qmin = q_pos[k] if q_pos[k] < qmin else qmin
                qmax = q_pos[k] if q_pos[k] > qmax else qmax
            b0 = _key_lo(qmin, window) // bs
            b1 = qmax // bs + 1
            if b1 > MB:
                b1 = MB
            nb = b1 - b0
            ns = (want if want < nb // SPLIT_MIN_BLOCKS else nb // SPLIT_MIN_BLOCKS) if want > 1 else 1
            if ns < 1:
                ns = 1
            for tk in range(tk0, n_toks):
                nparts[toks[tk]] = ns
                chunk0[toks[tk]] = 0
                slot_base[toks[tk]] = <int32_t>n_slots
                if ns > 1:
                    n_slots += ns
            for k in range(ns):
                for kvh in range(KVH):
                    for gc in range(n_gc):
                        it = &items[n_items]
                        it.kind = 2  # a prompt's tile (simd_attention.h: kinds)
                        it.seq = s
                        it.h0 = kvh * G + gc * Gi
                        it.h1 = kvh * G + (G if G < (gc + 1) * Gi else (gc + 1) * Gi)
                        it.tok0 = <int32_t>tk0
                        it.tok1 = <int32_t>n_toks
                        it.b0 = b0 + nb * k // ns
                        it.b1 = b0 + nb * (k + 1) // ns
                        it.chunk = k
                        n_items += 1
            t += T_tile
    # rows items: chunk by chunk, sequences with the same blocks in the chunk grouped
    for s in range(S):
        if not seq_rows[s]:
            continue
        ns = seq_c1[s] - seq_c0[s] + 1
        for t in range(seg_start[s], seg_start[s + 1]):
            nparts[t] = ns
            chunk0[t] = seq_c0[s]
            slot_base[t] = <int32_t>n_slots
            if ns > 1:
                n_slots += ns
    for ch in range(c_max + 1):
        n_grp = 0
        for s in range(S):
            if not seq_rows[s] or ch < seq_c0[s] or ch > seq_c1[s]:
                continue
            b0 = seq_lo[s] if seq_lo[s] > ch * CH else ch * CH
            b1 = (seq_hi[s] if seq_hi[s] < ch * CH + CH - 1 else ch * CH + CH - 1) + 1
            if b1 > MB:
                b1 = MB
            hsh = _hash_ids(block_tables + <long>s * MB + b0, b1 - b0) if b1 > b0 else 0
            found = -1
            for gi in range(n_grp):
                if (grp_hash[gi] == hsh and grp_b0[gi] == b0 and grp_b1[gi] == b1
                        and memcmp(block_tables + <long>grp_rep[gi] * MB + b0, block_tables + <long>s * MB + b0,
                                   (b1 - b0) * sizeof(int32_t)) == 0):
                    found = gi
                    break
            mem_next[s] = -1
            if found < 0:
                grp_rep[n_grp] = s
                grp_b0[n_grp] = b0
                grp_b1[n_grp] = b1
                grp_hash[n_grp] = hsh
                grp_last[n_grp] = s
                grp_exact[n_grp] = seq_rows[s] == 2
                n_grp += 1
            else:
                mem_next[grp_last[found]] = s
                grp_last[found] = s
                if seq_rows[s] == 2:
                    grp_exact[found] = 1
        for gi in range(n_grp):
            # the group's tokens, member by member, in items of T_rows tokens
            tk0 = n_toks
            m = grp_rep[gi]
            while m >= 0:
                for t in range(seg_start[m], seg_start[m + 1]):
                    toks[n_toks] = t
                    n_toks += 1
                m = mem_next[m]
            # many rows per kv head (decodes sharing these blocks, none asking for decode
            # numerics): tile items (rows in lanes); else rows items per kv head (its rows
            # of each block are a strided stream of their own: measured faster than one item
            # reading whole blocks, and several items share a sequence's attention out)
            tile = (n_toks - tk0) * Gi >= ROWS_MAX_QG and not grp_exact[gi]
            T = T_tile if tile else T_rows
            tk = tk0
            if halves:  # (tile is 0: fewer than ROWS_MAX_QG rows a kv head)
                _rows_item(&items[n_items], grp_rep[gi], 0, (H + 1) // 2, tk0, n_toks, grp_b0[gi], grp_b1[gi], ch)
                _rows_item(&items[n_items + 1], grp_rep[gi], (H + 1) // 2, H, tk0, n_toks, grp_b0[gi], grp_b1[gi], ch)
                n_items += 2
                tk = n_toks
            # many groups: one item for all of a group's rows and kv heads (ROWS_WHOLE_MIN_GROUPS)
            if (not tile and n_grp >= ROWS_WHOLE_MIN_GROUPS and 1 < KVH
                    and (n_toks - tk0) * H <= ATTN_MAX_ROWS):
                _rows_item(&items[n_items], grp_rep[gi], 0, H, tk0, n_toks, grp_b0[gi], grp_b1[gi], ch)
                n_items += 1
                tk = n_toks
            while tk < n_toks:
                for kvh in range(KVH):
                    for gc in range(n_gc):
                        _rows_item(&items[n_items], grp_rep[gi], kvh * G + gc * Gi,
                                   kvh * G + (G if G < (gc + 1) * Gi else (gc + 1) * Gi), tk,
                                   tk + T if tk + T < n_toks else n_toks, grp_b0[gi], grp_b1[gi], ch)
                        if tile:
                            items[n_items].kind = 0
                        n_items += 1
                tk += T
            kv_bytes += <long>(grp_b1[gi] - grp_b0[gi]) * bs * (k_row + v_row) * KVH
    free(seq_lo)
    free(grp_rep)
    free(grp_hash)
    free(mem_next)
    for i in range(n_items):
        if items[i].kind != 1 and items[i].h0 % G == 0:
            kv_bytes += <long>(items[i].b1 - items[i].b0) * bs * (k_row + v_row)
    qsort(items, n_items, sizeof(attn_item), _cmp_cost)
    pl.partial = <float *>malloc((n_slots * H * (Dv + 2) if n_slots * H * (Dv + 2) > 1 else 1) * sizeof(float))
    if pl.partial == NULL:
        free(items); free(toks); free(tinfo)
        return -1
    pl.items = items
    pl.n_items = n_items
    pl.toks = toks
    pl.tinfo = tinfo
    pl.n_slots = n_slots
    pl.kv_bytes = kv_bytes
    pl.n_merge = 0
    for t in range(N):
        if nparts[t] > 1:
            pl.n_merge += 1
    return 0
