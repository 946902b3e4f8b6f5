"""LAVO backward kernels.

Per query t (log-sum-exp `lse` saved by the forward, Delta_t = dO_t . o_t):
- window, key j: ds = p (dO . v_j - Delta); dq += scale ds k_j, dk_j += scale ds q_t,
  dv_j += p dO_t, drho[t'-j] += ds;
- memory, slot i (g = B q, h = B vbar, u = B dO, pm = slot weight):
  de_i = pm_i (h_i u_i - Delta), dmu += de_i, dg_i = scale de_i h_i,
  dh_i = scale de_i g_i + pm_i u_i; dq += B^T dg; dB += dg q^T + (pm h) dO^T + dh vbar^T;
  and dvbar = B^T dh reaches every value of the memory set divided by its count:
  dv_j += sum over queries t whose set holds j of dvbar_t / count_t, a reverse
  cumulative sum (causal) or one sum per segment (noncausal).

Three kernels, in this order: `lavo_delta_kernel` (Delta, as FlashAttention's
preprocessing step, which keeps o out of the memory kernel's registers),
`lavo_mem_bwd_kernel` (the memory, query side: the memory's dq into the fp32 buffer
DQM, dB, dmu) and `lavo_dkv_kernel` (per key chunk, the
window's dk and dv, and, FlashAttention-2 style, the window's dq and drho added into
DQM and DRHO with fp32 atomics, so no kernel recomputes the scores for dq; plus the
memory's reverse cumulative sum: its in-chunk part DVL and the per-key-chunk suffix sums
SUF, which the caller makes from the chunk totals WSUM). The memory and the window have
separate kernels to keep each one's live registers small.
"""

import triton
import triton.language as tl

from .chunk_common import (
    chunk_cumsum, key_valid, load_basis, load_chunk, load_rows, mem_dot, memory_mean, row_ptrs, store_rows,
    table_logits, window_logits,
)


@triton.jit
def _bias_grad(DRHO, ds, h, NB, base, QB: tl.constexpr, C: tl.constexpr):
    """drho[base + i - jj] += ds[i, jj] for a [QB, C] tile (QB <= C) whose bias index is
    base + i - jj.

    The tile is sheared with a gather (column (i - e) mod C of row i), so each
    diagonal becomes a column; its sum is one atomic add per bias entry, not per score."""
    i = tl.arange(0, QB)
    e = tl.arange(0, C)
    sheared = tl.gather(ds, (i[:, None] - e[None, :] + C) % C, 1)
    below = tl.sum(tl.where(i[:, None] >= e[None, :], sheared, 0.0), 0)  # diagonal i - jj = e
    above = tl.sum(tl.where(i[:, None] < e[None, :], sheared, 0.0), 0)  # diagonal i - jj = e - C
    idx_b = base + e
    idx_a = base + e - C
    tl.atomic_add(DRHO + h * NB + idx_b, below, mask=(e < QB) & (idx_b >= 0) & (idx_b < NB), sem="relaxed")
    tl.atomic_add(DRHO + h * NB + idx_a, above, mask=(e > 0) & (idx_a >= 0) & (idx_a < NB), sem="relaxed")


@triton.jit
def lavo_delta_kernel(O, DO, DELTA, n_rows, D: tl.constexpr, BD: tl.constexpr, BLOCK: tl.constexpr):
    """DELTA[r] = dO_r . o_r in fp32, for the rows r of o, dO flattened to [rows * H, D]
    (a padded query has o = 0, so its Delta is 0)."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    dd = tl.arange(0, BD)
    offs = r.to(tl.int64)[:, None] * D + dd[None, :]
    mask = (r < n_rows)[:, None] & (dd < D)[None, :]
    do = tl.load(DO + offs, mask=mask, other=0.0).to(tl.float32)
    o = tl.load(O + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + r, tl.sum(do * o, 1), mask=r < n_rows)


@triton.jit
def _slot_grads(g, u, hm, lse, delta, mu, rr, t_ok, scale, R: tl.constexpr):
    """Per query and memory slot of one rank block ([C, RB] each): the slot weight pm,
    de (d loss / d logit), dg (d loss / d (B q)) and dh (d loss / d (B vbar))."""
    e = (scale * hm * g + mu) * 1.4426950408889634
    pm = tl.where((rr < R)[None, :] & t_ok[:, None], tl.exp2(e - lse[:, None]), 0.0)
    de = pm * (hm * u - delta[:, None])
    return pm, de, scale * de * hm, scale * de * g + pm * u


@triton.jit
def _store_value_grads(
    WSUM, DVL, dvbar, cnt, cid, live, seg, kv_row0, first, t, m, h, H,
    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, SEG: tl.constexpr, NS: tl.constexpr, PREC: tl.constexpr,
):
    """The memory's value gradient of a query chunk, dvbar [C, BD] (per query), spread
    over the memory sets: wv = dvbar / count; WSUM[chunk, seg] = sum of wv, and, causal,
    DVL[j] = sum over the chunk's queries t >= j of wv[t] (keys j at the rows of t).
    Nothing is stored for a chunk that is not `live` (`_memory_bwd_rows`)."""
    dd = tl.arange(0, BD)
    wv = tl.where((cnt > 0)[:, None], dvbar / tl.maximum(cnt, 1.0)[:, None], 0.0)
    tl.store(WSUM + ((cid * SEG + seg) * H + h).to(tl.int64) * D + dd, tl.sum(wv, 0), mask=(dd < D) & live)
    if not NS:
        store_rows(DVL, chunk_cumsum(wv, C, True, PREC), kv_row0, first, t < m, h, H, C, D, BD)


@triton.jit
def _memory_bwd_rows(
    Q, DO, LSE, DELTA, KVM, CHUNKS, per_seq, n_len, m_len, cid, live, h, H,
    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, QMASK: tl.constexpr, BATCHED: tl.constexpr,
):
    """What both memory-backward kernels read of query chunk `cid`: its table row, the
    positions t (anchored tt), which of them carry a gradient (t_ok: a padded query has
    no output, so none flows from it), and q, dO, lse, Delta of those rows.

    A chunk that is not `live` (a group's steps past the last chunk repeat it, so that
    the loop over a group has no branch and its loads can be pipelined) is read as a
    sequence of length 0: no row carries a gradient or is stored."""
    q_row0, n, kv_row0, m, c = load_chunk(CHUNKS, cid, per_seq, n_len, m_len, BATCHED)
    n = tl.where(live, n, 0)
    m = tl.where(live, m, 0)
    t = c * C + tl.arange(0, C)
    t_ok = t < n
    if QMASK:
        t_ok = t_ok & key_valid(KVM, kv_row0, t, m, True)
    tt = tl.minimum(t, m - 1)
    do = load_rows(DO, q_row0, c * C, t_ok, h, H, C, D, BD)
    delta = tl.load(DELTA + (q_row0 + t).to(tl.int64) * H + h, mask=t < n, other=0.0)
    lse = tl.load(LSE + (q_row0 + t).to(tl.int64) * H + h, mask=t < n, other=0.0)
    q = load_rows(Q, q_row0, c * C, t_ok, h, H, C, D, BD)
    return q_row0, n, kv_row0, m, c, t, t_ok, tt, q, do, lse, delta


@triton.jit
def lavo_mem_bwd_kernel(
    Q, V, DO, LSE, DELTA, BAS, MU, PRE, CNT, KVM, CHUNKS, per_seq, n_len, m_len,
    DQM, DB_PART, DMU_PART, DVL, WSUM,
    H, n_chunks, scale,
    D: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, RB: tl.constexpr, NRB: tl.constexpr, C: tl.constexpr,
    GROUP: tl.constexpr, SEG: tl.constexpr, BS: tl.constexpr, NS: tl.constexpr, HAS_MASK: tl.constexpr,
    QMASK: tl.constexpr, PREC: tl.constexpr, BATCHED: tl.constexpr,
):
    """The memory's backward, one program per GROUP query chunks, head and block of RB
    basis rows: the group's dB rows and dmu partial sums (dmu per segment, BS >= SEG
    slots); with one rank block (NRB = 1) also the memory part of dq (fp32, DQM) and the
    parts of the reverse cumulative sum (DVL per key row in the chunk, causal; WSUM per
    chunk and segment). Given the saved log-sum-exp and Delta, each slot's gradient is
    independent of the other slots, so the rank blocks run in parallel; their sums over
    the blocks (dq, dvbar) come from `lavo_mem_sums_kernel` when NRB > 1 (summing them
    here takes fp32 atomics of NRB times the bytes; docs/benchmarks.md, "Launch settings")."""
    DT: tl.constexpr = Q.dtype.element_ty
    SUMS: tl.constexpr = NRB == 1
    gid = tl.program_id(0)
    h = tl.program_id(1)
    rb = tl.program_id(2)
    dd = tl.arange(0, BD)
    segs = tl.arange(0, BS)
    basis, rr = load_basis(BAS, h, rb * RB, R, D, RB, BD)  # [RB, BD]
    db_acc = tl.zeros([RB, BD], tl.float32)
    dmu_acc = tl.zeros([BS], tl.float32)
    for i in range(GROUP):
        live = gid * GROUP + i < n_chunks
        cid = tl.minimum(gid * GROUP + i, n_chunks - 1)
        q_row0, n, kv_row0, m, c, t, t_ok, tt, q, do, lse, delta = _memory_bwd_rows(
            Q, DO, LSE, DELTA, KVM, CHUNKS, per_seq, n_len, m_len, cid, live, h, H, D, BD, C, QMASK, BATCHED
        )
        g = mem_dot(q, tl.trans(basis), DT, PREC)  # [C, RB]
        u = mem_dot(do, tl.trans(basis), DT, PREC)  # [C, RB]
        dg = tl.zeros([C, RB], tl.float32)
        for seg in range(SEG):
            vbar, cnt = memory_mean(
                V, KVM, CNT, PRE, cid, seg, h, H, c * C, t, tt, t_ok, kv_row0, m, D, BD, C, SEG, NS, HAS_MASK, PREC,
            )
            hm = mem_dot(vbar, tl.trans(basis), DT, PREC)  # [C, RB]
            mu = tl.load(MU + h * SEG + seg)
            pm, de, dg_seg, dh = _slot_grads(g, u, hm, lse, delta, mu, rr, t_ok, scale, R)
            dmu_acc += tl.where(segs == seg, tl.sum(tl.sum(de, 1), 0), 0.0)
            dg += dg_seg
            db_acc += mem_dot(tl.trans(pm * hm), do, DT, PREC)
            db_acc += mem_dot(tl.trans(dh), vbar, DT, PREC)
            if SUMS:
                dvbar = mem_dot(dh, basis, DT, PREC)  # [C, BD]
                _store_value_grads(
                    WSUM, DVL, dvbar, cnt, cid, live, seg, kv_row0, c * C, t, m, h, H, D, BD, C, SEG, NS, PREC
                )
        if SUMS:
            store_rows(DQM, mem_dot(dg, basis, DT, PREC), q_row0, c * C, t < n, h, H, C, D, BD)
        db_acc += mem_dot(tl.trans(dg), q, DT, PREC)

    db_offs = ((gid * H + h) * R + rr)[:, None].to(tl.int64) * D + dd[None, :]
    tl.store(DB_PART + db_offs, db_acc, mask=(rr < R)[:, None] & (dd < D)[None, :])
    tl.store(DMU_PART + ((gid * NRB + rb) * H + h) * SEG + segs, dmu_acc, mask=segs < SEG)


@triton.jit
def lavo_mem_sums_kernel(
    Q, V, DO, LSE, DELTA, BAS, MU, PRE, CNT, KVM, CHUNKS, per_seq, n_len, m_len, DQM, DVL, WSUM,
    H, n_chunks, scale,
    D: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, RB: tl.constexpr, NRB: tl.constexpr, C: tl.constexpr,
    GROUP: tl.constexpr, SEG: tl.constexpr, NS: tl.constexpr, HAS_MASK: tl.constexpr, QMASK: tl.constexpr,
    PREC: tl.constexpr, BATCHED: tl.constexpr,
):
    """With several rank blocks: the memory's dq (DQM) and value-gradient parts (DVL,
    WSUM), summed over the NRB blocks on chip; one program per GROUP query chunks and
    head (the slot math of `lavo_mem_bwd_kernel`, which then skips these sums)."""
    DT: tl.constexpr = Q.dtype.element_ty
    gid = tl.program_id(0)
    h = tl.program_id(1)
    for i in range(GROUP):
        live = gid * GROUP + i < n_chunks
        cid = tl.minimum(gid * GROUP + i, n_chunks - 1)
        q_row0, n, kv_row0, m, c, t, t_ok, tt, q, do, lse, delta = _memory_bwd_rows(
            Q, DO, LSE, DELTA, KVM, CHUNKS, per_seq, n_len, m_len, cid, live, h, H, D, BD, C, QMASK, BATCHED
        )
        dq = tl.zeros([C, BD], tl.float32)
        for seg in range(SEG):
            vbar, cnt = memory_mean(
                V, KVM, CNT, PRE, cid, seg, h, H, c * C, t, tt, t_ok, kv_row0, m, D, BD, C, SEG, NS, HAS_MASK, PREC,
            )
            mu = tl.load(MU + h * SEG + seg)
            dvbar = tl.zeros([C, BD], tl.float32)
            for rb in range(NRB):
                basis, rr = load_basis(BAS, h, rb * RB, R, D, RB, BD)  # [RB, BD]
                g = mem_dot(q, tl.trans(basis), DT, PREC)  # [C, RB]
                u = mem_dot(do, tl.trans(basis), DT, PREC)
                hm = mem_dot(vbar, tl.trans(basis), DT, PREC)
                pm, de, dg, dh = _slot_grads(g, u, hm, lse, delta, mu, rr, t_ok, scale, R)
                dq += mem_dot(dg, basis, DT, PREC)
                dvbar += mem_dot(dh, basis, DT, PREC)
            _store_value_grads(
                WSUM, DVL, dvbar, cnt, cid, live, seg, kv_row0, c * C, t, m, h, H, D, BD, C, SEG, NS, PREC
            )
        store_rows(DQM, dq, q_row0, c * C, t < n, h, H, C, D, BD)


@triton.jit
def _score_grads(
    p, q, do, delta, kb, vb, DQM, q_row0, first, t_ok, h, H, scale,
    D: tl.constexpr, BD: tl.constexpr, QB: tl.constexpr, PREC: tl.constexpr,
):
    """From the window's probabilities p [QB, C] of query rows first .. first+QB-1 (0
    where a score does not count) against one key block: their dk (unscaled), dv and ds
    [QB, C]; their dq is added into DQM (fp32 atomics: other key chunks add to the same
    rows)."""
    dv = tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PREC)
    dp = tl.dot(do, tl.trans(vb), input_precision=PREC)
    ds = p * (dp - delta[:, None])
    dk = tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PREC)
    dq = tl.dot(ds.to(kb.dtype), kb, input_precision=PREC) * scale  # [QB, BD]
    dd = tl.arange(0, BD)
    dq_ptrs = row_ptrs(DQM, q_row0, first, h, H, QB, BD, D)
    tl.atomic_add(dq_ptrs, dq, mask=t_ok[:, None] & (dd < D)[None, :], sem="relaxed")
    return dk, dv, ds


@triton.jit
def _dkv_tile(
    Q, DO, LSE, DELTA, RHO, KVM, DQM, DRHO, kb, vb, j, j_ok, c, start, t_from, t_to, q_row0, n, kv_row0, m, h, H, NB,
    scale,
    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, QB: tl.constexpr, WINDOW: tl.constexpr, PREC: tl.constexpr,
):
    """Causal cross-attention: the window's scores of queries start..start+QB-1 (those in
    [t_from, t_to]) against the keys j of chunk c: returns their dk (unscaled) and dv,
    and adds their dq and drho into DQM and DRHO (fp32 atomics: other key chunks add to
    the same rows)."""
    t = start + tl.arange(0, QB)
    t_ok = (t >= t_from) & (t <= t_to)
    tt = tl.minimum(t, m - 1)
    q = load_rows(Q, q_row0, start, t_ok, h, H, QB, D, BD)
    do = load_rows(DO, q_row0, start, t_ok, h, H, QB, D, BD)
    lse = tl.load(LSE + (q_row0 + t).to(tl.int64) * H + h, mask=t_ok, other=0.0)
    delta = tl.load(DELTA + (q_row0 + t).to(tl.int64) * H + h, mask=t_ok, other=0.0)
    s, bias_idx, in_win = window_logits(q, kb, RHO, h, NB, tt, j, j_ok, scale, WINDOW, PREC)  # [t, j]
    p = tl.where(in_win & t_ok[:, None], tl.exp2(s - lse[:, None]), 0.0)
    # ds is 0 outside the window and for queries not in [t_from, t_to]
    dk, dv, ds = _score_grads(p, q, do, delta, kb, vb, DQM, q_row0, start, t_ok, h, H, scale, D, BD, QB, PREC)
    if (start + QB - 1 < m) | (n <= m):  # no query of the tile is clamped: index t - j
        _bias_grad(DRHO, ds, h, NB, start - c * C, QB, C)
    else:  # queries past the source share t' = m - 1: one add per score
        tl.atomic_add(DRHO + h * NB + bias_idx, ds, mask=in_win & t_ok[:, None], sem="relaxed")
    return dk, dv


@triton.jit
def _dkv_table_tile(
    Q, DO, LSE, DELTA, KVM, DQM, BT, kb, vb, j_ok, tile, r0, first, q_row0, n, kv_row0, m, h, H, scale,
    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, QB: tl.constexpr, QMASK: tl.constexpr, PREC: tl.constexpr,
):
    """Self-attention: the window's scores of rows r0 .. r0+QB-1 of the query chunk that
    starts at `first` against the keys of this program's chunk, whose bias tile is
    BT[tile]. Returns their dk (unscaled), dv and ds [QB, C], and adds their dq into DQM
    (fp32 atomics). A query with no gradient (outside the sequence, padding) gets
    lse = +inf, so its p, and with it ds, is 0 without a mask over the scores."""
    t = first + r0 + tl.arange(0, QB)
    t_ok = (t >= 0) & (t < n)
    if QMASK:
        t_ok = t_ok & key_valid(KVM, kv_row0, t, m, True)
    q = load_rows(Q, q_row0, first + r0, t_ok, h, H, QB, D, BD)
    do = load_rows(DO, q_row0, first + r0, t_ok, h, H, QB, D, BD)
    lse = tl.load(LSE + (q_row0 + t).to(tl.int64) * H + h, mask=t_ok, other=float("inf"))
    delta = tl.load(DELTA + (q_row0 + t).to(tl.int64) * H + h, mask=t_ok, other=0.0)
    s = table_logits(q, kb, BT, tile, r0 + tl.arange(0, QB), j_ok, scale * 1.4426950408889634, C, PREC)  # [t, j]
    p = tl.exp2(s - lse[:, None])
    return _score_grads(p, q, do, delta, kb, vb, DQM, q_row0, first + r0, t_ok, h, H, scale, D, BD, QB, PREC)


@triton.jit
def _diagonal_sums(z, r0, QB: tl.constexpr, C: tl.constexpr):
    """For rows r0 .. r0+QB-1 of a [C, C] tile z whose entry (i, jj) belongs to diagonal
    (i - jj) mod C: the sums of those rows' entries per diagonal [C]. The rows are
    rotated by a gather (column (i - e) mod C of row i), so each diagonal is a column."""
    i = r0 + tl.arange(0, QB)
    e = tl.arange(0, C)
    return tl.sum(tl.gather(z, (i[:, None] - e[None, :] + C) % C, 1), 0)


@triton.jit
def _dkv_table(
    Q, DO, LSE, DELTA, KVM, DQM, BT, DRHO, kb, vb, j_ok, c, q_row0, n, kv_row0, m, h, H, NB, scale,
    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, NQB: tl.constexpr, QB0: tl.constexpr, HALF: tl.constexpr,
    LAST: tl.constexpr, SPLIT: tl.constexpr, QMASK: tl.constexpr, PREC: tl.constexpr,
):
    """dk (unscaled) and dv of the window of key chunk c in self-attention, and its drho.

    The queries come in the NQB chunks c - QB0 + b, as SPLIT tiles of QB rows each.
    Query chunk b scores key (i, jj) at bias index (b - QB0) * C + HALF + i - jj, and
    uses the forward's bias tile NQB - 1 - b. drho is not taken tile by tile: the
    lower triangle (i >= jj) of chunk b and the strict upper triangle of chunk b + 1
    together hold one index per diagonal mod C, (b - QB0) * C + HALF + (i - jj) mod C,
    so each such pair takes one rotation and one column sum (per tile they were a fifth
    of this kernel's stall samples: docs/benchmarks.md, "Where the kernels' time goes").
    The upper triangle of chunk 0 is outside every window, the lower one of the last
    chunk (LAST) inside it exactly when (w - 1) % C == 0 (causal) or HALF % C == 0
    (noncausal)."""
    QB: tl.constexpr = C // SPLIT
    NZ: tl.constexpr = triton.next_power_of_2(NQB)
    zk = tl.arange(0, NZ)
    e = tl.arange(0, C)
    sums = tl.zeros([NZ, C], tl.float32)  # [pair, diagonal]
    dk = tl.zeros([C, BD], tl.float32)
    dv = tl.zeros([C, BD], tl.float32)
    for part in tl.static_range(SPLIT):
        r0 = part * QB
        lower = (r0 + tl.arange(0, QB))[:, None] >= e[None, :]
        prev = tl.zeros([QB, C], tl.float32)
        for b in range(NQB):
            dk_b, dv_b, ds = _dkv_table_tile(
                Q, DO, LSE, DELTA, KVM, DQM, BT, kb, vb, j_ok, h * NQB + NQB - 1 - b, r0, (c - QB0 + b) * C, q_row0,
                n, kv_row0, m, h, H, scale, D, BD, C, QB, QMASK, PREC,
            )
            dk += dk_b
            dv += dv_b
            if b > 0:
                col = _diagonal_sums(tl.where(lower, prev, ds), r0, QB, C)
                sums = tl.where((zk == b - 1)[:, None], sums + col[None, :], sums)
            prev = ds
        if LAST:
            col = _diagonal_sums(tl.where(lower, prev, 0.0), r0, QB, C)
            sums = tl.where((zk == NQB - 1)[:, None], sums + col[None, :], sums)
    idx = (zk[:, None] - QB0) * C + HALF + e[None, :]
    ok = (zk < NQB)[:, None] & (idx >= 0) & (idx < NB)
    tl.atomic_add(DRHO + h * NB + idx, sums, mask=ok, sem="relaxed")
    return dk, dv


@triton.jit
def lavo_dkv_kernel(
    Q, K, V, DO, LSE, DELTA, RHO, BT, KVM, SEGID, CHUNKS, per_seq, n_len, m_len, DVL, SUF, DQM, DRHO, DK, DV,
    H, NB, scale,
    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, WINDOW: tl.constexpr, NQB: tl.constexpr, QB0: tl.constexpr,
    LAST: tl.constexpr, TAIL: tl.constexpr, SEG: tl.constexpr, NS: tl.constexpr, HALF: tl.constexpr,
    TABLE: tl.constexpr, HAS_MASK: tl.constexpr, QMASK: tl.constexpr, PREC: tl.constexpr, BATCHED: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """One program per (key chunk, head). The queries whose window holds these keys come
    in NQB blocks of C: in self-attention (TABLE) from chunk c - QB0 on (`_dkv_table`),
    in CC from the chunk on, and, with a target longer than the source, the queries past
    the source (all anchored at m - 1) in at most TAIL more. Each block of C queries is
    taken as SPLIT tiles of C // SPLIT rows (fewer live registers)."""
    QB: tl.constexpr = C // SPLIT
    kid = tl.program_id(0)
    h = tl.program_id(1)
    q_row0, n, kv_row0, m, c = load_chunk(CHUNKS, kid, per_seq, n_len, m_len, BATCHED)
    dd = tl.arange(0, BD)
    j = c * C + tl.arange(0, C)
    j_ok = key_valid(KVM, kv_row0, j, m, HAS_MASK)
    kb = load_rows(K, kv_row0, c * C, j_ok, h, H, C, D, BD)
    vb = load_rows(V, kv_row0, c * C, j_ok, h, H, C, D, BD)
    dk = tl.zeros([C, BD], tl.float32)
    dv = tl.zeros([C, BD], tl.float32)

    if TABLE:  # self-attention (CS, NS)
        dk, dv = _dkv_table(
            Q, DO, LSE, DELTA, KVM, DQM, BT, DRHO, kb, vb, j_ok, c, q_row0, n, kv_row0, m, h, H, NB, scale,
            D, BD, C, NQB, QB0, HALF, LAST, SPLIT, QMASK, PREC,
        )
    else:  # causal cross-attention: queries past the source are anchored at m - 1
        hi = tl.minimum(c * C + C - 1 + WINDOW - 1, n - 1)
        for b in range(NQB * SPLIT):
            start = c * C + b * QB
            dk_b, dv_b = _dkv_tile(
                Q, DO, LSE, DELTA, RHO, KVM, DQM, DRHO, kb, vb, j, j_ok, c, start, 0, hi, q_row0, n, kv_row0, m, h,
                H, NB, scale, D, BD, C, QB, WINDOW, PREC,
            )
            dk += dk_b
            dv += dv_b
        tail_from = tl.maximum(hi + 1, m)  # queries not seen above, anchored at m - 1
        if c * C + C - 1 > m - 1 - WINDOW:  # some key of the chunk is in the last window
            for b in range(TAIL * SPLIT):
                start = tail_from - tail_from % C + b * QB
                if start < n:
                    dk_b, dv_b = _dkv_tile(
                        Q, DO, LSE, DELTA, RHO, KVM, DQM, DRHO, kb, vb, j, j_ok, c, start, tail_from, n - 1, q_row0,
                        n, kv_row0, m, h, H, NB, scale, D, BD, C, QB, WINDOW, PREC,
                    )
                    dk += dk_b
                    dv += dv_b

    if SEG == 1:
        dv += tl.load(SUF + (kid * H + h).to(tl.int64) * D + dd, mask=dd < D, other=0.0)[None, :]
    else:  # each key gets the memory gradient of its own segment
        seg_of = tl.load(SEGID + kv_row0 + j, mask=j_ok, other=0)
        suf_offs = ((kid * SEG + seg_of) * H + h).to(tl.int64)[:, None] * D + dd[None, :]
        dv += tl.load(SUF + suf_offs, mask=j_ok[:, None] & (dd < D)[None, :], other=0.0)
    if not NS:  # DVL rows j >= n (CC, source longer than the target) hold nothing: no query is there
        dv += load_rows(DVL, kv_row0, c * C, (j < m) & (j < n), h, H, C, D, BD)
    dk = tl.where(j_ok[:, None], dk * scale, 0.0)
    dv = tl.where(j_ok[:, None], dv, 0.0)
    store_rows(DK, dk, kv_row0, c * C, j < m, h, H, C, D, BD)
    store_rows(DV, dv, kv_row0, c * C, j < m, h, H, C, D, BD)
