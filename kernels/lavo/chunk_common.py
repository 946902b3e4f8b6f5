"""Triton pieces shared by the LAVO forward and backward kernels (inlined at compile time).

Layout every kernel sees: q, k, v, o flattened to `[rows, heads, dim]` (contiguous), one
sequence after another; a chunk `(q_row0, n, kv_row0, m, c)` names a sequence by its
first query row, its query length, its first key row, its key length, and the chunk
index `c` inside it (chunk `c` covers local positions `c*C .. c*C+C-1`): a row of the
chunk table, or, for equal-length sequences, computed (`load_chunk`).
Logits are kept in log2 units (multiplied by log2(e) = 1.4426950408889634) so that
`exp2` does the softmax; the saved log-sum-exp is in the same units.

Patterns: the memory of CS and CC shares one code path (`NS=False`): query `t` is
anchored at `t' = min(t, m-1)`, which is `t` itself in self-attention. NS (`NS=True`)
uses the symmetric window `|t-j| <= HALF` and one memory per segment for the whole
sequence (one segment); NC is the same with no window blocks (NKB = 0) and SEG
segments. The window of self-attention (CS, NS: `TABLE=True`) takes its bias and mask
from precomputed tiles (`table_logits`), that of CC from the anchored positions
(`window_logits`).
"""

import triton
import triton.language as tl


@triton.jit
def load_chunk(CHUNKS, cid, per_seq, n_len, m_len, BATCHED: tl.constexpr):
    """Chunk `cid` -> (q_row0, n, kv_row0, m, c).

    BATCHED (equal-length sequences, no `cu_seqlens`): computed from the chunks per
    sequence and the lengths, with no load, so the program's first loads do not wait on
    another (the table's load: docs/benchmarks.md, "Where the kernels' time goes").
    Otherwise chunk-table row `cid`, read as one vector and split by masked sums: this
    gives true scalars both compiled and under the interpreter (where a scalar load is
    a 1-element array, which a loop bound cannot use)."""
    if BATCHED:
        b = cid // per_seq
        q_row0, n, kv_row0, m, c = b * n_len, n_len, b * m_len, m_len, cid - b * per_seq
    else:
        col = tl.arange(0, 8)
        row = tl.load(CHUNKS + cid * 5 + col, mask=col < 5, other=0)
        q_row0 = tl.sum(tl.where(col == 0, row, 0))
        n = tl.sum(tl.where(col == 1, row, 0))
        kv_row0 = tl.sum(tl.where(col == 2, row, 0))
        m = tl.sum(tl.where(col == 3, row, 0))
        c = tl.sum(tl.where(col == 4, row, 0))
    return q_row0, n, kv_row0, m, c


@triton.jit
def row_ptrs(PTR, row0, first, h, H, N: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """Pointers [N, BD] to rows `row0 + first ..` (N of them) of head `h` of a
    `[rows, H, D]` tensor: an int64 scalar base plus int32 offsets inside the block
    (int64 offsets per element measured ~20-60 more registers per thread in ptxas)."""
    base = PTR + ((row0 + first).to(tl.int64) * H + h) * D
    return base + (tl.arange(0, N) * (H * D))[:, None] + tl.arange(0, BD)[None, :]


@triton.jit
def load_rows(PTR, row0, first, ok, h, H, N: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """Rows `row0 + first ..` (N of them) of head `h` of a `[rows, H, D]` tensor -> [N, BD]
    (0 where not ok)."""
    dd = tl.arange(0, BD)
    return tl.load(row_ptrs(PTR, row0, first, h, H, N, BD, D), mask=ok[:, None] & (dd < D)[None, :], other=0.0)


@triton.jit
def store_rows(PTR, x, row0, first, ok, h, H, N: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    dd = tl.arange(0, BD)
    ptrs = row_ptrs(PTR, row0, first, h, H, N, BD, D)
    tl.store(ptrs, x.to(PTR.dtype.element_ty), mask=ok[:, None] & (dd < D)[None, :])


@triton.jit
def key_valid(KVM, kv_row0, j, m, HAS_MASK: tl.constexpr):
    """Key positions `j` that exist and are not padding."""
    ok = (j >= 0) & (j < m)
    if HAS_MASK:
        ok = ok & (tl.load(KVM + kv_row0 + j, mask=ok, other=0) != 0)
    return ok


@triton.jit
def load_basis(BAS, h, r0, R: tl.constexpr, D: tl.constexpr, RB: tl.constexpr, BD: tl.constexpr):
    """Rows r0 .. r0+RB-1 of the head's basis B [R, D] (stored in the inputs' dtype),
    zero-padded -> [RB, BD], and those rows' indices [RB]."""
    rr = r0 + tl.arange(0, RB)
    dd = tl.arange(0, BD)
    offs = h * R * D + rr[:, None] * D + dd[None, :]
    return tl.load(BAS + offs, mask=(rr < R)[:, None] & (dd < D)[None, :], other=0.0), rr


@triton.jit
def chunk_cumsum(x, C: tl.constexpr, REVERSE: tl.constexpr, PREC: tl.constexpr):
    """Cumulative sums of x [C, BD] along the chunk axis (REVERSE: from the end), fp32, as
    a product with the 0/1 triangular matrix on the tensor cores: x in its own dtype
    (bf16 / fp16 values are exact operands; fp32 ones take PREC, tf32 on bf16 / fp16
    inputs), fp32 accumulation. Measured faster than `tl.cumsum`, a scan that crosses
    warps through shared memory (docs/benchmarks.md)."""
    i = tl.arange(0, C)
    if REVERSE:
        tri = i[:, None] <= i[None, :]
    else:
        tri = i[:, None] >= i[None, :]
    return tl.dot(tri.to(x.dtype), x, input_precision=PREC)


@triton.jit
def memory_mean(
    V, KVM, CNT, PRE, cid, seg, h, H, first, t, tt, t_ok, kv_row0, m,
    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, SEG: tl.constexpr, NS: tl.constexpr, HAS_MASK: tl.constexpr,
    PREC: tl.constexpr,
):
    """Mean of the values in each query's memory set (segment `seg`), vbar [C, BD] fp32,
    and its count [C], for the queries t = first + arange(C) of chunk `cid`.

    `PRE[chunk, seg, h]` holds the fp32 sum of the values the chunk's queries all share:
    the keys before the chunk (causal) or all keys of the segment (noncausal). Causal
    queries add the keys of their own chunk up to `t'` (`chunk_cumsum`); their counts are
    t'+1, or with padding `CNT[key row]` (valid keys so far). Noncausal counts are
    `CNT[chunk, seg]`. A query with an empty memory set gets vbar = 0.
    """
    dd = tl.arange(0, BD)
    pre = tl.load(PRE + ((cid * SEG + seg) * H + h).to(tl.int64) * D + dd, mask=dd < D, other=0.0)
    if NS:
        cnt = tl.load(CNT + cid * SEG + seg) + tl.zeros([C], tl.float32)
        csum = pre[None, :] + tl.zeros([C, BD], tl.float32)
    else:
        # the chunk's own keys sit at the same local positions as its queries, j = t
        # (keys j >= m load as 0, so a clamped query t' = m - 1 gets the same sum)
        j_ok = key_valid(KVM, kv_row0, t, m, HAS_MASK)
        vb = load_rows(V, kv_row0, first, j_ok, h, H, C, D, BD)
        csum = pre[None, :] + chunk_cumsum(vb, C, False, PREC)
        if HAS_MASK:
            cnt = tl.load(CNT + kv_row0 + tt, mask=t_ok, other=0.0)
        else:
            cnt = (tt + 1).to(tl.float32)
    vbar = tl.where(cnt[:, None] > 0, csum / tl.maximum(cnt, 1.0)[:, None], 0.0)
    return vbar, cnt


@triton.jit
def window_logits(q, kb, RHO, h, NB, tt, j, j_ok, scale, window, PREC: tl.constexpr):
    """Causal cross-attention window logits of queries anchored at tt [QB] against keys
    j [C], log2 units, -inf outside the window.

    Returns (logits [QB, C], the bias index t'-j, in-window mask)."""
    s = tl.dot(q, tl.trans(kb), input_precision=PREC)
    delta = tt[:, None] - j[None, :]
    ok = (delta >= 0) & (delta < window) & j_ok[None, :]
    bias = tl.load(RHO + h * NB + delta, mask=ok, other=0.0)
    s = tl.where(ok, (s * scale + bias) * 1.4426950408889634, float("-inf"))
    return s, delta, ok


@triton.jit
def table_logits(q, kb, BT, tile, rows, j_ok, scale2, C: tl.constexpr, PREC: tl.constexpr):
    """Self-attention window logits (log2 units) of the query rows `rows` [QB] of a chunk
    against key block `tile` of its window: scale * q.k + the bias tile BT[tile] (which
    holds -inf outside the window), -inf for keys that are not valid (j_ok [C] False).

    BT [heads * NKB, C, C] fp32 (`chunk._window_bias_tiles`): with the key blocks of
    every query chunk at the same offsets, tile b's bias index is a fixed function of
    (row, key) whatever the chunk, so one coalesced load replaces the per-score index
    arithmetic, window mask and gather of `window_logits` (a quarter of the stall samples
    of the forward and of dkv: docs/benchmarks.md, "Where the kernels' time goes")."""
    jj = tl.arange(0, C)
    bt = tl.load(BT + (tile * C + rows)[:, None] * C + jj[None, :])
    s = tl.dot(q, tl.trans(kb), input_precision=PREC)
    return s * scale2 + bt + tl.where(j_ok, 0.0, float("-inf"))[None, :]


@triton.jit
def mem_dot(a, b, DT: tl.constexpr, PREC: tl.constexpr):
    """A product on the memory path: operands in the inputs' dtype DT (bf16/fp16 tensor
    cores; fp32 inputs stay fp32 with PREC="ieee"), fp32 accumulation."""
    return tl.dot(a.to(DT), b.to(DT), input_precision=PREC)
