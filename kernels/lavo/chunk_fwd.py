"""LAVO forward kernels: per-chunk value sums, then window + memory in one online softmax.

One program per (query chunk, head). Loops run a compile-time number of times (NKB key
blocks, exactly what an interior chunk's window needs) and mask what lies outside:
loop bounds computed at run time would not run under Triton's interpreter with numpy 2,
and a loop without branches can be software-pipelined. The memory logits come first (they are finite
for every query, so the running maximum never stays -inf), then the window key blocks
in order; scores never leave the chip. See chunk_common.py for the layout.
"""

import triton
import triton.language as tl

from .chunk_common import (
    key_valid, load_basis, load_chunk, load_rows, mem_dot, memory_mean, store_rows, table_logits, window_logits,
)


@triton.jit
def chunk_value_sums_kernel(
    V, KVM, SEGID, SUMS, CHUNKS, per_seq, n_len, m_len, H,
    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, SEG: tl.constexpr, HAS_MASK: tl.constexpr,
    BATCHED: tl.constexpr,
):
    """SUMS[chunk, s, h] = fp32 sum of the valid values of a key chunk in segment s
    (SEGID: each key row's segment, read only when SEG > 1)."""
    cid = tl.program_id(0)
    h = tl.program_id(1)
    q_row0, n, kv_row0, m, c = load_chunk(CHUNKS, cid, per_seq, n_len, m_len, BATCHED)
    j = c * C + tl.arange(0, C)
    j_ok = key_valid(KVM, kv_row0, j, m, HAS_MASK)
    vb = load_rows(V, kv_row0, c * C, j_ok, h, H, C, D, BD).to(tl.float32)
    dd = tl.arange(0, BD)
    if SEG == 1:
        tl.store(SUMS + (cid * H + h).to(tl.int64) * D + dd, tl.sum(vb, 0), mask=dd < D)
    else:
        seg_of = tl.load(SEGID + kv_row0 + j, mask=j_ok, other=-1)
        for s in range(SEG):
            part = tl.sum(tl.where((seg_of == s)[:, None], vb, 0.0), 0)
            tl.store(SUMS + ((cid * SEG + s) * H + h).to(tl.int64) * D + dd, part, mask=dd < D)


@triton.jit
def lavo_fwd_kernel(
    Q, K, V, BAS, RHO, BT, MU, PRE, CNT, KVM, O, LSE, CHUNKS, per_seq, n_len, m_len,
    H, NB, scale,
    D: tl.constexpr, R: tl.constexpr, BD: tl.constexpr, RB: tl.constexpr, NRB: tl.constexpr, C: tl.constexpr,
    WINDOW: tl.constexpr, NKB: tl.constexpr, KB0: tl.constexpr, SEG: tl.constexpr, NS: tl.constexpr,
    HALF: tl.constexpr, TABLE: tl.constexpr, HAS_MASK: tl.constexpr, QMASK: tl.constexpr, PREC: tl.constexpr,
    BATCHED: tl.constexpr,
):
    cid = tl.program_id(0)
    h = tl.program_id(1)
    q_row0, n, kv_row0, m, c = load_chunk(CHUNKS, cid, per_seq, n_len, m_len, BATCHED)
    t = c * C + tl.arange(0, C)
    t_ok = t < n
    tt = tl.minimum(t, m - 1)
    q = load_rows(Q, q_row0, c * C, t_ok, h, H, C, D, BD)

    # memory: r slots h_i b_i per segment, logits scale * h_i (B q)_i + mu_segment, in
    # NRB blocks of RB basis rows (one online softmax across blocks and segments)
    DT: tl.constexpr = Q.dtype.element_ty
    m_i = tl.full([C], float("-inf"), tl.float32)
    l_i = tl.zeros([C], tl.float32)
    acc = tl.zeros([C, BD], tl.float32)
    for seg in range(SEG):  # memory logits are finite, so m_i is finite from here on
        vbar, cnt = memory_mean(
            V, KVM, CNT, PRE, cid, seg, h, H, c * C, t, tt, t_ok, kv_row0, m, D, BD, C, SEG, NS, HAS_MASK, PREC
        )
        mu = tl.load(MU + h * SEG + seg)
        for rb in range(NRB):
            basis, rr = load_basis(BAS, h, rb * RB, R, D, RB, BD)  # [RB, BD]
            g = mem_dot(q, tl.trans(basis), DT, PREC)  # [C, RB]
            hm = mem_dot(vbar, tl.trans(basis), DT, PREC)  # [C, RB]
            e = (scale * hm * g + mu) * 1.4426950408889634
            e = tl.where((rr < R)[None, :], e, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(e, 1))
            alpha = tl.exp2(m_i - m_new)
            pm = tl.exp2(e - m_new[:, None])
            l_i = l_i * alpha + tl.sum(pm, 1)
            acc = acc * alpha[:, None] + mem_dot(pm * hm, basis, DT, PREC)  # [C, BD]
            m_i = m_new

    # window: NKB key blocks from `first`. Self-attention (TABLE) takes the blocks
    # c - KB0 .. whatever the chunk (blocks before the sequence hold no valid key), so
    # that each block's bias tile is the same for every chunk; CC the blocks from that
    # of the clamped window's first key
    if TABLE:
        first = c - KB0
    else:
        first = tl.maximum(tl.minimum(c * C, m - 1) - WINDOW + 1, 0) // C
    for b in range(NKB):  # a fixed trip count; keys past the window are masked out
        start = (first + b) * C
        j = start + tl.arange(0, C)
        j_ok = key_valid(KVM, kv_row0, j, m, HAS_MASK)
        kb = load_rows(K, kv_row0, start, j_ok, h, H, C, D, BD)
        vb = load_rows(V, kv_row0, start, j_ok, h, H, C, D, BD)
        if TABLE:
            s = table_logits(q, kb, BT, h * NKB + b, tl.arange(0, C), j_ok, scale * 1.4426950408889634, C, PREC)
        else:
            s, bias_idx, in_win = window_logits(q, kb, RHO, h, NB, tt, j, j_ok, scale, WINDOW, PREC)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb, input_precision=PREC)
        m_i = m_new

    o = acc / l_i[:, None]
    if QMASK:  # self-attention with padding: a padded query outputs 0
        o = tl.where(key_valid(KVM, kv_row0, t, m, True)[:, None], o, 0.0)
    store_rows(O, o, q_row0, c * C, t_ok, h, H, C, D, BD)
    tl.store(LSE + (q_row0 + t).to(tl.int64) * H + h, m_i + tl.log2(l_i), mask=t_ok)
