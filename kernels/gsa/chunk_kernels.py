"""Triton kernels of the chunked GSA (causal pattern), forward and backward.

Everything works on packed token-major tensors: x [N, H, D] holds the sequences one after
another (a batch of B sequences of length T is N = B*T packed tokens), log-gates g and
their chunk-local cumulative sums b [N, H, M] are fp32. Two tilings:

- chunks of BT positions (64): the states (K~ [M, dk], V~ [M, dv]) are kept, in fp32,
  at the start of every chunk. They do not depend on q: each chunk's own write is
  computed in parallel (`_chunk_write_kernel`), then `_state_scan_kernel` runs the
  elementwise recurrence over chunks; in the backward `_chunk_read_grad_kernel` and the
  same scan, right to left, give the state gradients.
- sub-chunks of BC positions (16) inside a chunk: one program per sub-chunk reads its
  chunk's start state and the earlier sub-chunks of its chunk. Both gated-linear-attention
  passes and the slot softmax between them run in that one program; the forward stores
  the slot logits only for the backward. Products over the head dim go by column blocks
  (DB / DBK / DBV columns), loaded again for each use rather than kept in registers.

Stability: inside a chunk b is non-increasing in time, so for query row t in sub-chunk i
and key row j in an earlier sub-chunk, exp(b_t - b_j) = exp(b_t - b_r) * exp(b_r - b_j)
with r the first row of sub-chunk i is a product of two factors <= 1, which turns the
block into matrix products. Pairs inside one sub-chunk use the same split with r the
sub-chunk's first row (factors up to exp(SPAN)) when the gates decay by less than
exp(-SPAN) across it, and otherwise take exp(b_t - b_j) directly, one row at a time.

Dot precision comes in two families (constexpr strings, chosen in `chunk.py`): PREC_S for
the dots whose results reach the log-gate gradient (state writes and their gradients,
slot-side reads, ds) and PREC_V for those that only reach o, dq, dk, dv (value-side
reads). Each is "ieee" (fp32), "tf32x3" or "bf16x3" (each operand split in two, three
products: about 21 or 16 significant bits), "tf32" (11) or "bf16" (operands rounded to
bf16, 8); accumulation is fp32 in all.
"""

import triton
import triton.language as tl

from ..common import interpreted

# Triton's interpreter multiplies the raw bits of bf16 dot operands, rounds fp32 to bf16
# toward zero and has no "bf16x3": there `_dot` rounds operands to the nearest bf16 value
# (`_round_bf16`) and multiplies them in fp32 (products of two bf16 values are exact).
_INTERPRETED = tl.constexpr(interpreted())


@triton.jit
def _round_bf16(x):
    """fp32 x rounded to the nearest bf16 value (ties to even), kept in fp32 (finite x)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    """a @ b with fp32 accumulation, operands at precision PREC (see the module docstring)."""
    if _INTERPRETED and (PREC == "bf16" or PREC == "bf16x3"):
        a_hi = _round_bf16(a.to(tl.float32))
        b_hi = _round_bf16(b.to(tl.float32))
        out = tl.dot(a_hi, b_hi, input_precision="ieee")
        if PREC == "bf16x3":  # the split of the GPU: x = hi + lo, products hi*hi + hi*lo + lo*hi
            out += tl.dot(a_hi, _round_bf16(b - b_hi), input_precision="ieee")
            out += tl.dot(_round_bf16(a - a_hi), b_hi, input_precision="ieee")
        return out
    elif PREC == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _chunk_slot_tile(chunk_ptr, i_c, i_h, H, M, BT: tl.constexpr, BM: tl.constexpr):
    """Chunk i_c's rows (table entry: first row, end of its sequence) and the offsets of
    their [BT, BM] tile of a [N, H, M] tensor, head i_h:
    (rows, row mask, slot offsets, slot mask, tile mask, tile offsets)."""
    t0 = tl.load(chunk_ptr + 2 * i_c)
    eos = tl.load(chunk_ptr + 2 * i_c + 1)
    rows = t0 + tl.arange(0, BT)
    o_m = tl.arange(0, BM)
    m_t = rows < eos
    m_m = o_m < M
    return rows, m_t, o_m, m_m, m_t[:, None] & m_m[None, :], (rows[:, None] * H + i_h) * M + o_m[None, :]


@triton.jit
def _chunk_write_kernel(
    k_ptr, v_ptr, g_ptr, b_ptr, gsum_ptr, sk_ptr, sv_ptr, chunk_ptr, H, M, DK, DV,
    BT: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
):
    """What chunk c writes into both states, one head, by column blocks of BD:
    out[c] = sum_j diag(s_j exp(G_c - b_j)) 1 x_j^T [M, D], G_c = b at the chunk's last row,
    with x = k into K~ (sk) and x = v into V~ (sv). Also stores the chunk-local cumulative
    sums b of g and G_c (gsum [NC, H, M]). BK, BV: the head dims padded."""
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    rows, m_t, o_m, m_m, m_tm, p_tm = _chunk_slot_tile(chunk_ptr, i_c, i_h, H, M, BT, BM)
    g = tl.load(g_ptr + p_tm, mask=m_tm, other=0.0)
    b = tl.cumsum(g, 0)  # [BT, BM]; rows past the end add 0
    g_last = tl.sum(g, 0)  # [BM] = b at the chunk's last row
    tl.store(b_ptr + p_tm, b, mask=m_tm)
    tl.store(gsum_ptr + (i_c * H + i_h) * M + o_m, g_last, mask=m_m)
    w = tl.trans((1.0 - tl.exp(g)) * tl.exp(g_last[None, :] - b))  # [BM, BT], s_j decayed to the chunk end
    for d0 in tl.static_range(0, BK, BD):
        _store_state(sk_ptr, _dot(w, _load_cols(k_ptr, rows, m_t, i_h, H, DK, d0, BD), PREC), i_c, i_h, H, M, DK,
                     d0, BM, BD)
    for d0 in tl.static_range(0, BV, BD):
        _store_state(sv_ptr, _dot(w, _load_cols(v_ptr, rows, m_t, i_h, H, DV, d0, BD), PREC), i_c, i_h, H, M, DV,
                     d0, BM, BD)


@triton.jit
def _chunk_read_grad_kernel(
    w_ptr, x_ptr, b_ptr, out_ptr, chunk_ptr, scale, H, M, D,
    BT: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, PREC: tl.constexpr,
):
    """Gradient of chunk c's start state from the chunk's own reads, columns of one head:
    out[c] = scale * (w_c * exp(b_c))^T x_c [M, D]; (w, x) is (dz, q) for K~, (p, do) for V~."""
    i_c, i_h, i_d = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows, m_t, o_m, m_m, m_tm, p_tm = _chunk_slot_tile(chunk_ptr, i_c, i_h, H, M, BT, BM)
    w = tl.load(w_ptr + p_tm, mask=m_tm, other=0.0) * tl.exp(tl.load(b_ptr + p_tm, mask=m_tm, other=0.0))
    x = _load_cols(x_ptr, rows, m_t, i_h, H, D, i_d * BD, BD)
    _store_state(out_ptr, scale * _dot(tl.trans(w), x, PREC), i_c, i_h, H, M, D, i_d * BD, BM, BD)


@triton.jit
def _scan_load(i_c, ok, buf_ptr, gsum_ptr, c_first, i_h, H, M, D, o_r, o_d, m_rd):
    """What chunk i_c adds to a state tile, and its decay exp(G_c) per row (0 if not ok)."""
    add = tl.load(buf_ptr + ((c_first + i_c) * H + i_h) * M * D + o_r[:, None] * D + o_d[None, :],
                  mask=m_rd & ok, other=0.0)
    decay = tl.exp(tl.load(gsum_ptr + ((c_first + i_c) * H + i_h) * M + o_r, mask=(o_r < M) & ok, other=0.0))
    return add, decay


@triton.jit
def _scan_step(state, add, decay, i, n_c, buf_ptr, gsum_ptr, c_first, i_h, H, M, D, o_r, o_d, m_rd,
               REVERSE: tl.constexpr):
    """Step i of the scan (chunk i, or n_c-1-i in reverse): store the state the chunk met
    into buf in place of what it adds, load the next chunk's (one step ahead, so that
    the load's latency overlaps this step), return (next state, next add, next decay)."""
    i_c = i + REVERSE * (n_c - 1 - 2 * i)
    i_next = i_c + 1 - 2 * REVERSE
    add_next, decay_next = _scan_load(i_next, i + 1 < n_c, buf_ptr, gsum_ptr, c_first, i_h, H, M, D, o_r, o_d, m_rd)
    tl.store(buf_ptr + ((c_first + i_c) * H + i_h) * M * D + o_r[:, None] * D + o_d[None, :], state, mask=m_rd)
    return decay[:, None] * state + add, add_next, decay_next


@triton.jit
def _scan_tile(buf_ptr, gsum_ptr, init_ptr, last_ptr, c_first, n_c, i_nh, i_h, i_tile, H, M, D,
               HAS_INIT: tl.constexpr, STORE_LAST: tl.constexpr, REVERSE: tl.constexpr,
               BR: tl.constexpr, BD: tl.constexpr, WHILE_LOOPS: tl.constexpr):
    """S <- diag(exp(G_c)) S + buf[c] over the chunks, on tile i_tile ([BR, BD]) of the
    [M, D] state of one (sequence, head); buf[c] is replaced by the S chunk c met."""
    n_d = tl.cdiv(D, BD)
    o_r = (i_tile // n_d) * BR + tl.arange(0, BR)
    o_d = (i_tile % n_d) * BD + tl.arange(0, BD)
    m_rd = (o_r < M)[:, None] & (o_d < D)[None, :]
    p_rd = i_nh * M * D + o_r[:, None] * D + o_d[None, :]
    state = tl.zeros([BR, BD], dtype=tl.float32)
    if HAS_INIT:
        state = tl.load(init_ptr + p_rd, mask=m_rd, other=0.0)
    add, decay = _scan_load(REVERSE * (n_c - 1), n_c > 0, buf_ptr, gsum_ptr, c_first, i_h, H, M, D, o_r, o_d, m_rd)
    if WHILE_LOOPS:
        i = 0
        while i < n_c:
            state, add, decay = _scan_step(state, add, decay, i, n_c, buf_ptr, gsum_ptr, c_first, i_h, H, M, D,
                                           o_r, o_d, m_rd, REVERSE)
            i += 1
    else:
        for i in range(0, n_c):
            state, add, decay = _scan_step(state, add, decay, i, n_c, buf_ptr, gsum_ptr, c_first, i_h, H, M, D,
                                           o_r, o_d, m_rd, REVERSE)
    if STORE_LAST:
        tl.store(last_ptr + p_rd, state, mask=m_rd)


@triton.jit
def _state_scan_kernel(
    buf_k_ptr, buf_v_ptr, gsum_ptr, init_k_ptr, init_v_ptr, last_k_ptr, last_v_ptr, coff_ptr,
    H, M, DK, DV, tiles_k,
    HAS_INIT: tl.constexpr, STORE_LAST: tl.constexpr, REVERSE: tl.constexpr,  # REVERSE: 0 or 1
    BR: tl.constexpr, BD: tl.constexpr, WHILE_LOOPS: tl.constexpr,
):
    """The scan over chunks of both states (K~ tiles first, then V~ tiles), one launch.

    Forward (REVERSE=0): buf holds the chunk writes, becomes the chunk-start states;
    init = initial state, last = final state. Backward (REVERSE=1): buf holds the
    gradients of the chunk-start states from each chunk's reads, becomes the gradients of
    the chunk-end states; init = final state's gradient, last = initial state's gradient.
    """
    i_nh, i_tile = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    c_first = tl.load(coff_ptr + i_n)
    n_c = tl.load(coff_ptr + i_n + 1) - c_first
    if i_tile < tiles_k:
        _scan_tile(buf_k_ptr, gsum_ptr, init_k_ptr, last_k_ptr, c_first, n_c, i_nh, i_h, i_tile, H, M, DK,
                   HAS_INIT, STORE_LAST, REVERSE, BR, BD, WHILE_LOOPS)
    else:
        _scan_tile(buf_v_ptr, gsum_ptr, init_v_ptr, last_v_ptr, c_first, n_c, i_nh, i_h, i_tile - tiles_k, H, M, DV,
                   HAS_INIT, STORE_LAST, REVERSE, BR, BD, WHILE_LOOPS)


@triton.jit
def _load_cols(ptr, rows, m_t, i_h, H, D, d0, DB: tl.constexpr):
    """Columns [d0, d0+DB) of rows `rows` of head i_h of a [N, H, D] tensor ->
    [len(rows), DB] fp32 (0 where not m_t or past D)."""
    o_d = d0 + tl.arange(0, DB)
    return tl.load(ptr + (rows[:, None] * H + i_h) * D + o_d[None, :],
                   mask=m_t[:, None] & (o_d < D)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _state(s_ptr, i_c, i_h, H, M, D, d0, BM: tl.constexpr, DB: tl.constexpr):
    """Columns [d0, d0+DB) of the fp32 [M, D] state (or state gradient) kept for chunk i_c,
    head i_h: (pointer to the state, offsets, mask) of the [BM, DB] tile; an int64 base and
    int32 offsets inside the state."""
    o_m = tl.arange(0, BM)
    o_d = d0 + tl.arange(0, DB)
    return (s_ptr + (i_c.to(tl.int64) * H + i_h) * M * D, o_m[:, None] * D + o_d[None, :],
            (o_m < M)[:, None] & (o_d < D)[None, :])


@triton.jit
def _load_state(s_ptr, i_c, i_h, H, M, D, d0, BM: tl.constexpr, DB: tl.constexpr):
    """The [BM, DB] tile of `_state`."""
    base, offs, mask = _state(s_ptr, i_c, i_h, H, M, D, d0, BM, DB)
    return tl.load(base + offs, mask=mask, other=0.0)


@triton.jit
def _store_state(s_ptr, x, i_c, i_h, H, M, D, d0, BM: tl.constexpr, DB: tl.constexpr):
    """Store x [BM, DB] as the tile of `_state`."""
    base, offs, mask = _state(s_ptr, i_c, i_h, H, M, D, d0, BM, DB)
    tl.store(base + offs, x, mask=mask)


@triton.jit
def _subchunk_gates(g_ptr, b_ptr, rows_j, o_m, m_m, i_h, H, M):
    """Log gates g and their chunk-local cumulative sums b of the rows j of an earlier
    sub-chunk (all valid) -> two [BC, BM] tiles."""
    p_jm = (rows_j[:, None] * H + i_h) * M + o_m[None, :]
    return tl.load(g_ptr + p_jm, mask=m_m[None, :], other=0.0), tl.load(b_ptr + p_jm, mask=m_m[None, :], other=0.0)


@triton.jit
def _diagonal_span(b_i, b_r):
    """min over a sub-chunk's rows and slots of b_t - b_r (<= 0): how far its gates decay."""
    return tl.min(tl.min(b_i - b_r[None, :], 1), 0)


@triton.jit
def _row_dots(x_ptr, rows_x, m_x, y_ptr, rows_y, m_y, i_h, H, D, BD: tl.constexpr, DB: tl.constexpr,
              PREC: tl.constexpr):
    """[len(rows_x), len(rows_y)] matrix of the dot products x_t . y_j over the head dim,
    accumulated over column blocks of DB (blocks are loaded again, not kept)."""
    a = _dot(_load_cols(x_ptr, rows_x, m_x, i_h, H, D, 0, DB),
             tl.trans(_load_cols(y_ptr, rows_y, m_y, i_h, H, D, 0, DB)), PREC)
    for kb in range(1, BD // DB):
        a += _dot(_load_cols(x_ptr, rows_x, m_x, i_h, H, D, kb * DB, DB),
                  tl.trans(_load_cols(y_ptr, rows_y, m_y, i_h, H, D, kb * DB, DB)), PREC)
    return a


@triton.jit
def _row_state_dots(x_ptr, rows, m_t, s_ptr, i_c, i_h, H, M, D, BM: tl.constexpr, BD: tl.constexpr,
                    DB: tl.constexpr, PREC: tl.constexpr):
    """[len(rows), BM] = x_rows S^T for the state S [M, D] of chunk i_c, over column blocks."""
    out = _dot(_load_cols(x_ptr, rows, m_t, i_h, H, D, 0, DB),
               tl.trans(_load_state(s_ptr, i_c, i_h, H, M, D, 0, BM, DB)), PREC)
    for kb in range(1, BD // DB):
        out += _dot(_load_cols(x_ptr, rows, m_t, i_h, H, D, kb * DB, DB),
                    tl.trans(_load_state(s_ptr, i_c, i_h, H, M, D, kb * DB, BM, DB)), PREC)
    return out


@triton.jit
def _read_slots(x_ptr, y_ptr, s_ptr, g_ptr, b_ptr, b_i, r, c0, i_c, eos, i_h, H, M, D, BT: tl.constexpr,
                BC: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr, PREC: tl.constexpr,
                SPAN: tl.constexpr):
    """Slot-side read of one sub-chunk (rows r..r+BC): [BC, BM] with entry (t, m) =
    exp(b_t) (s0 x_t)_m + sum_{c0 <= j <= t} s_j,m exp(b_t,m - b_j,m) (x_t . y_j).

    (x, y, s0) = (q, k, K~0) gives the slot logits before scaling, (do, v, V~0) the
    gradient of the probabilities; s0 is chunk i_c's start state in s_ptr. b_i [BC, BM].
    Products over the head dim go by column blocks of DB.
    Pairs inside the sub-chunk use the reference row r too (one matrix product) when the
    gates decay by less than exp(-SPAN) across it, else one key row at a time.
    """
    o_c = tl.arange(0, BC)
    o_m = tl.arange(0, BM)
    m_m = o_m < M
    rows = r + o_c
    m_t = rows < eos
    out = _row_state_dots(x_ptr, rows, m_t, s_ptr, i_c, i_h, H, M, D, BM, BD, DB, PREC) * tl.exp(b_i)
    b_r = tl.load(b_ptr + (r * H + i_h) * M + o_m, mask=m_m, other=0.0)
    acc = tl.zeros([BC, BM], dtype=tl.float32)
    for jj in tl.static_range(BT // BC - 1):  # earlier sub-chunks of the chunk (all rows valid)
        j0 = c0 + jj * BC
        if j0 < r:
            rows_j = j0 + o_c
            g_j, b_j = _subchunk_gates(g_ptr, b_ptr, rows_j, o_m, m_m, i_h, H, M)
            a = _row_dots(x_ptr, rows, m_t, y_ptr, rows_j, rows_j < eos, i_h, H, D, BD, DB, PREC)  # [BC, BC]
            w = (1.0 - tl.exp(g_j)) * tl.exp(b_r[None, :] - b_j)
            acc += _dot(a, w, PREC)
    if _diagonal_span(b_i, b_r) > -SPAN:  # the sub-chunk itself, as one product (rows past the end: s = 0)
        g_s = tl.load(g_ptr + (rows[:, None] * H + i_h) * M + o_m[None, :], mask=m_t[:, None] & m_m[None, :],
                      other=0.0)
        a = tl.where(o_c[:, None] >= o_c[None, :],
                     _row_dots(x_ptr, rows, m_t, y_ptr, rows, m_t, i_h, H, D, BD, DB, PREC), 0.0)
        acc += _dot(a, (1.0 - tl.exp(g_s)) * tl.exp(b_r[None, :] - b_i), PREC)
        out += acc * tl.exp(tl.minimum(b_i - b_r[None, :], 0.0))  # rows past the end: b_i = 0
    else:
        out += acc * tl.exp(tl.minimum(b_i - b_r[None, :], 0.0))
        for kb in range(0, BD // DB):  # one key row at a time, exp(b_t - b_j) directly
            x_b = _load_cols(x_ptr, rows, m_t, i_h, H, D, kb * DB, DB)
            o_d = kb * DB + tl.arange(0, DB)
            for kk in range(0, BC):
                t = r + kk
                y_t = tl.load(y_ptr + (t * H + i_h) * D + o_d, mask=(o_d < D) & (t < eos), other=0.0).to(tl.float32)
                g_t = tl.load(g_ptr + (t * H + i_h) * M + o_m, mask=m_m & (t < eos), other=0.0)
                b_t = tl.load(b_ptr + (t * H + i_h) * M + o_m, mask=m_m & (t < eos), other=0.0)
                a = tl.sum(x_b * y_t[None, :], 1)  # [BC]: this block's share of x_t' . y_t
                decay = tl.exp(tl.minimum(b_i - b_t[None, :], 0.0))
                out += tl.where((o_c >= kk)[:, None], a[:, None] * (1.0 - tl.exp(g_t))[None, :] * decay, 0.0)
    return out


@triton.jit
def _read_values(w_i, y_ptr, s_ptr, out_ptr, out_scale, g_ptr, b_ptr, b_i, r, c0, i_c, eos, i_h, H, M, D,
                 BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr,
                 PREC: tl.constexpr, SPAN: tl.constexpr):
    """Value-side read of one sub-chunk, stored times out_scale into out [N, H, D] (rows
    r..r+BC, by column blocks of DB): row t =
    (w_t * exp(b_t)) s0 + sum_{c0 <= j <= t} (sum_m w_t,m s_j,m exp(b_t,m - b_j,m)) y_j.

    (w, y, s0) = (p, v, V~0) gives the output, (dz, k, K~0) the query gradient (out_scale:
    the attention scale); s0 is chunk i_c's start state in s_ptr. w_i, b_i [BC, BM].
    Diagonal as in `_read_slots`.
    """
    o_c = tl.arange(0, BC)
    o_m = tl.arange(0, BM)
    m_m = o_m < M
    rows = r + o_c
    m_t = rows < eos
    b_r = tl.load(b_ptr + (r * H + i_h) * M + o_m, mask=m_m, other=0.0)
    w_0 = w_i * tl.exp(b_i)
    w_r = w_i * tl.exp(tl.minimum(b_i - b_r[None, :], 0.0))  # rows past the end: b_i = 0
    for kb in range(0, BD // DB):
        d0 = kb * DB
        out = _dot(w_0, _load_state(s_ptr, i_c, i_h, H, M, D, d0, BM, DB), PREC)
        for jj in tl.static_range(BT // BC - 1):
            j0 = c0 + jj * BC
            if j0 < r:
                rows_j = j0 + o_c
                g_j, b_j = _subchunk_gates(g_ptr, b_ptr, rows_j, o_m, m_m, i_h, H, M)
                key = (1.0 - tl.exp(g_j)) * tl.exp(b_r[None, :] - b_j)
                a = _dot(w_r, tl.trans(key), PREC)  # [BC, BC]
                out += _dot(a, _load_cols(y_ptr, rows_j, rows_j < eos, i_h, H, D, d0, DB), PREC)
        if _diagonal_span(b_i, b_r) > -SPAN:
            g_s = tl.load(g_ptr + (rows[:, None] * H + i_h) * M + o_m[None, :], mask=m_t[:, None] & m_m[None, :],
                          other=0.0)
            key = (1.0 - tl.exp(g_s)) * tl.exp(b_r[None, :] - b_i)
            a = tl.where(o_c[:, None] >= o_c[None, :], _dot(w_r, tl.trans(key), PREC), 0.0)
            out += _dot(a, _load_cols(y_ptr, rows, m_t, i_h, H, D, d0, DB), PREC)
        else:
            o_d = d0 + tl.arange(0, DB)
            for kk in range(0, BC):
                t = r + kk
                y_t = tl.load(y_ptr + (t * H + i_h) * D + o_d, mask=(o_d < D) & (t < eos), other=0.0).to(tl.float32)
                g_t = tl.load(g_ptr + (t * H + i_h) * M + o_m, mask=m_m & (t < eos), other=0.0)
                b_t = tl.load(b_ptr + (t * H + i_h) * M + o_m, mask=m_m & (t < eos), other=0.0)
                decay = tl.exp(tl.minimum(b_i - b_t[None, :], 0.0))
                col = tl.sum(w_i * (1.0 - tl.exp(g_t))[None, :] * decay, 1)  # [BC]
                col = tl.where(o_c >= kk, col, 0.0)
                out += col[:, None] * y_t[None, :]
        o_d = d0 + tl.arange(0, DB)
        tl.store(out_ptr + (rows[:, None] * H + i_h) * D + o_d[None, :], (out * out_scale).to(out_ptr.dtype.element_ty),
                 mask=m_t[:, None] & (o_d < D)[None, :])


@triton.jit
def _slot_softmax(z, M, BM: tl.constexpr):
    """Softmax over the slots of z [BC, BM]; padded slots (>= M) get probability 0."""
    z = tl.where((tl.arange(0, BM) < M)[None, :], z, float("-inf"))
    e = tl.exp(z - tl.max(z, 1)[:, None])
    return e / tl.sum(e, 1)[:, None]


@triton.jit
def _sub_chunk_rows(sub_ptr, i_s):
    """(first row, chunk's first row, chunk index, sequence end) of sub-chunk i_s."""
    return (tl.load(sub_ptr + 4 * i_s), tl.load(sub_ptr + 4 * i_s + 1),
            tl.load(sub_ptr + 4 * i_s + 2), tl.load(sub_ptr + 4 * i_s + 3))


@triton.jit
def _output_fwd_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, sk_ptr, sv_ptr, o_ptr, z_ptr, sub_ptr,
    scale, H, M, DK, DV,
    BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DBK: tl.constexpr, DBV: tl.constexpr, PREC_S: tl.constexpr, PREC_V: tl.constexpr, SPAN: tl.constexpr,
):
    """Output of one sub-chunk: slot logits, softmax, value read. The logits z (scaled,
    fp32) are also stored, for the backward; the probabilities are not. Head dims padded
    to BK / BV go by column blocks of DBK / DBV."""
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    r, c0, i_c, eos = _sub_chunk_rows(sub_ptr, i_s)
    o_m = tl.arange(0, BM)
    rows = r + tl.arange(0, BC)
    m_tm = (rows < eos)[:, None] & (o_m < M)[None, :]
    p_tm = (rows[:, None] * H + i_h) * M + o_m[None, :]
    b_i = tl.load(b_ptr + p_tm, mask=m_tm, other=0.0)
    z = _read_slots(q_ptr, k_ptr, sk_ptr, g_ptr, b_ptr, b_i, r, c0, i_c, eos, i_h, H, M, DK,
                    BT, BC, BM, BK, DBK, PREC_S, SPAN) * scale
    tl.store(z_ptr + p_tm, z, mask=m_tm)
    p = _slot_softmax(z, M, BM)
    _read_values(p, v_ptr, sv_ptr, o_ptr, 1.0, g_ptr, b_ptr, b_i, r, c0, i_c, eos, i_h, H, M, DV,
                 BT, BC, BM, BV, DBV, PREC_V, SPAN)


@triton.jit
def _query_bwd_kernel(
    k_ptr, v_ptr, g_ptr, b_ptr, sk_ptr, sv_ptr, z_ptr, do_ptr, sub_ptr,
    p_ptr, dz_ptr, dq_ptr, dgate_ptr,
    scale, H, M, DK, DV,
    BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DBK: tl.constexpr, DBV: tl.constexpr, PREC_S: tl.constexpr, PREC_V: tl.constexpr, SPAN: tl.constexpr,
):
    """Query side of the backward for one sub-chunk.

    p = softmax(z) from the stored logits; dp_t,m = do_t . V~_t[m]; dz = p (dp - <p, dp>).
    Writes p and dz (fp32, for the key side and the state scan), dq = scale K~_t^T dz_t,
    and the query part z*dz + p*dp of the gradient with respect to the cumulative log-gates.
    """
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    r, c0, i_c, eos = _sub_chunk_rows(sub_ptr, i_s)
    o_m = tl.arange(0, BM)
    m_m = o_m < M
    rows = r + tl.arange(0, BC)
    m_tm = (rows < eos)[:, None] & m_m[None, :]
    p_tm = (rows[:, None] * H + i_h) * M + o_m[None, :]
    b_i = tl.load(b_ptr + p_tm, mask=m_tm, other=0.0)
    z = tl.load(z_ptr + p_tm, mask=m_tm, other=0.0)
    p = _slot_softmax(z, M, BM)
    dp = _read_slots(do_ptr, v_ptr, sv_ptr, g_ptr, b_ptr, b_i, r, c0, i_c, eos, i_h, H, M, DV,
                     BT, BC, BM, BV, DBV, PREC_S, SPAN)
    dz = p * (dp - tl.sum(p * dp, 1)[:, None])
    tl.store(p_ptr + p_tm, p, mask=m_tm)
    tl.store(dz_ptr + p_tm, dz, mask=m_tm)
    tl.store(dgate_ptr + p_tm, tl.where(m_m[None, :], z * dz, 0.0) + p * dp, mask=m_tm)
    _read_values(dz, k_ptr, sk_ptr, dq_ptr, scale, g_ptr, b_ptr, b_i, r, c0, i_c, eos, i_h, H, M, DK,
                 BT, BC, BM, BK, DBK, PREC_V, SPAN)


@triton.jit
def _key_bwd_kernel(
    w_ptr, x_ptr, y_ptr, dn_ptr, g_ptr, b_ptr, sub_ptr, dy_ptr, ds_ptr, sc, H, M, D,
    BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, DB: tl.constexpr,
    PREC_S: tl.constexpr, PREC_V: tl.constexpr, SPAN: tl.constexpr,
):
    """Key side of the backward for one sub-chunk of key rows j, from the later queries of
    the same chunk and from the state gradient at the chunk end (dn); run twice, with
    (w, x, y, dn, sc) = (dz, q, k, dK~, scale) and (p, do, v, dV~, 1): two launches keep
    half the tiles live in each. With G the cumulative gate at the chunk's last row and t
    over the queries of the chunk from row j on:

        ds_j,m = exp(G_m - b_j,m) (y_j . dn_m) + sc sum_t exp(b_t,m - b_j,m) (y_j . x_t) w_t,m
        dy_j = (s_j exp(G - b_j)) dn + sc sum_t (sum_m w_t,m s_j,m exp(b_t,m - b_j,m)) x_t

    stores dy (dk or dv), by column blocks of DB, and this launch's share of ds [BC, M],
    the gradient of the write weights s_j (the two shares are summed by `_gate_grad_kernel`).
    """
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    j0, c0, i_c, eos = _sub_chunk_rows(sub_ptr, i_s)
    o_c = tl.arange(0, BC)
    o_m = tl.arange(0, BM)
    rows = j0 + o_c
    m_t = rows < eos
    m_m = o_m < M
    m_tm = m_t[:, None] & m_m[None, :]
    p_tm = (rows[:, None] * H + i_h) * M + o_m[None, :]
    b_j = tl.load(b_ptr + p_tm, mask=m_tm, other=0.0)
    s_j = 1.0 - tl.exp(tl.load(g_ptr + p_tm, mask=m_tm, other=0.0))
    end = tl.minimum(c0 + BT, eos)
    g_last = tl.load(b_ptr + ((end - 1) * H + i_h) * M + o_m, mask=m_m, other=0.0)
    to_end = tl.exp(tl.minimum(g_last[None, :] - b_j, 0.0))  # [BC, BM]
    r = j0 + BC  # reference row of the later sub-chunks: the next sub-chunk's first
    b_r = tl.load(b_ptr + (r * H + i_h) * M + o_m, mask=m_m & (r < end), other=0.0)
    to_r = tl.exp(tl.minimum(b_r[None, :] - b_j, 0.0))

    key = s_j * to_r
    ds = tl.zeros([BC, BM], dtype=tl.float32)
    for kb in range(0, BD // DB):  # column blocks of y, x, dn, dy; ds sums over them
        d0 = kb * DB
        o_d = d0 + tl.arange(0, DB)
        y_b = _load_cols(y_ptr, rows, m_t, i_h, H, D, d0, DB)
        # through the state at the chunk end
        dn = _load_state(dn_ptr, i_c, i_h, H, M, D, d0, BM, DB)
        dy = _dot(s_j * to_end, dn, PREC_V)
        ds += to_end * _dot(y_b, tl.trans(dn), PREC_S)
        # through the queries of the later sub-chunks
        acc = tl.zeros([BC, BM], dtype=tl.float32)
        for ii in tl.static_range(BT // BC - 1):
            i0 = r + ii * BC
            if i0 < end:
                rows_i = i0 + o_c
                m_i = rows_i < eos
                m_im = m_i[:, None] & m_m[None, :]
                p_im = (rows_i[:, None] * H + i_h) * M + o_m[None, :]
                b_i = tl.load(b_ptr + p_im, mask=m_im, other=0.0)
                w_i = tl.load(w_ptr + p_im, mask=m_im, other=0.0) * tl.exp(tl.minimum(b_i - b_r[None, :], 0.0))
                x_i = _load_cols(x_ptr, rows_i, m_i, i_h, H, D, d0, DB)
                w1 = _dot(w_i, tl.trans(key), PREC_V)  # [BC_t, BC_j]
                dy += sc * _dot(tl.trans(w1), x_i, PREC_V)
                acc += _dot(_dot(y_b, tl.trans(x_i), PREC_S), w_i, PREC_S)  # [BC_j, BC_t] @ [BC_t, BM]
        ds += sc * acc * to_r
        # through the queries of the sub-chunk itself (query row t >= key row j)
        b_0 = tl.load(b_ptr + (j0 * H + i_h) * M + o_m, mask=m_m, other=0.0)  # reference row: the first
        if _diagonal_span(b_j, b_0) > -SPAN:  # rows past the end: x = w = 0
            w_s = tl.load(w_ptr + p_tm, mask=m_tm, other=0.0) * tl.exp(tl.minimum(b_j - b_0[None, :], 0.0))
            x_s = _load_cols(x_ptr, rows, m_t, i_h, H, D, d0, DB)
            w1 = tl.where(o_c[:, None] >= o_c[None, :],
                          _dot(w_s, tl.trans(s_j * tl.exp(b_0[None, :] - b_j)), PREC_V), 0.0)  # [t, j]
            dy += sc * _dot(tl.trans(w1), x_s, PREC_V)
            a = tl.where(o_c[:, None] <= o_c[None, :], _dot(y_b, tl.trans(x_s), PREC_S), 0.0)  # [j, t]
            ds += sc * tl.exp(b_0[None, :] - b_j) * _dot(a, w_s, PREC_S)
        else:  # one query row at a time, exp(b_t - b_j) directly
            for tt in range(0, BC):  # past the end: x = w = 0
                t = j0 + tt
                x_t = tl.load(x_ptr + (t * H + i_h) * D + o_d, mask=(o_d < D) & (t < eos), other=0.0).to(tl.float32)
                b_t = tl.load(b_ptr + (t * H + i_h) * M + o_m, mask=m_m & (t < eos), other=0.0)
                w_t = tl.load(w_ptr + (t * H + i_h) * M + o_m, mask=m_m & (t < eos), other=0.0)
                decay = tl.where((o_c <= tt)[:, None], tl.exp(tl.minimum(b_t[None, :] - b_j, 0.0)), 0.0)
                dy += sc * tl.sum(w_t[None, :] * s_j * decay, 1)[:, None] * x_t[None, :]
                ds += sc * decay * tl.sum(y_b * x_t[None, :], 1)[:, None] * w_t[None, :]
        tl.store(dy_ptr + (rows[:, None] * H + i_h) * D + o_d[None, :], dy.to(dy_ptr.dtype.element_ty),
                 mask=m_t[:, None] & (o_d < D)[None, :])
    tl.store(ds_ptr + p_tm, ds, mask=m_tm)


@triton.jit
def _gate_grad_load(i_c, dgate_ptr, dsk_ptr, dsv_ptr, g_ptr, bos, eos, i_h, H, M, o_m, BT: tl.constexpr):
    """For chunk i_c (nothing if i_c < 0): the gradient of the cumulative log-gates,
    dgate - s ds (query part minus key part), and the direct one -exp(g) ds through
    s = 1 - exp(g); ds = dsk + dsv."""
    rows = bos + i_c * BT + tl.arange(0, BT)
    m_tm = (rows < eos)[:, None] & (o_m < M)[None, :] & (i_c >= 0)
    p_tm = (rows[:, None] * H + i_h) * M + o_m[None, :]
    ds = tl.load(dsk_ptr + p_tm, mask=m_tm, other=0.0) + tl.load(dsv_ptr + p_tm, mask=m_tm, other=0.0)
    alpha = tl.exp(tl.load(g_ptr + p_tm, mask=m_tm, other=0.0))
    return tl.load(dgate_ptr + p_tm, mask=m_tm, other=0.0) - (1.0 - alpha) * ds, -alpha * ds


@triton.jit
def _gate_grad_step(carry, x, dg, i_c, dgate_ptr, dsk_ptr, dsv_ptr, g_ptr, dg_ptr, bos, eos, i_h, H, M, o_m,
                    BT: tl.constexpr):
    """dg = direct part (dg) + reverse cumulative sum of the cumulative-gate gradient (x)
    over chunk i_c, plus what follows it (carry); the previous chunk's tiles are loaded
    one step ahead."""
    x_next, dg_next = _gate_grad_load(i_c - 1, dgate_ptr, dsk_ptr, dsv_ptr, g_ptr, bos, eos, i_h, H, M, o_m, BT)
    rows = bos + i_c * BT + tl.arange(0, BT)
    m_tm = (rows < eos)[:, None] & (o_m < M)[None, :]
    tl.store(dg_ptr + (rows[:, None] * H + i_h) * M + o_m[None, :],
             dg + tl.cumsum(x, 0, reverse=True) + carry[None, :], mask=m_tm)
    return carry + tl.sum(x, 0), x_next, dg_next


@triton.jit
def _gate_grad_kernel(dgate_ptr, dsk_ptr, dsv_ptr, g_ptr, dg_ptr, carry_ptr, cu_ptr, H, M, BT: tl.constexpr,
                      BM: tl.constexpr, WHILE_LOOPS: tl.constexpr):
    """Log-gate gradient dg_t = -exp(g_t) ds_t + carry + sum_{t' >= t in the sequence}
    (dgate_t' - s_t' ds_t'), for slots [i_m*BM, i_m*BM+BM) of one (sequence, head).

    dgate_t' - s_t' ds_t' is the gradient with respect to the cumulative log-gate
    G_t' = sum of g up to t' (every term of the recurrence carries exp(G_t' - G_j)), so it
    reaches every g_t with t <= t' of the same sequence. `carry` [NS, H, M] is the final
    state's share (the final state is a read at the last row).
    """
    i_nh, i_m = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = tl.load(cu_ptr + i_n)
    eos = tl.load(cu_ptr + i_n + 1)
    o_m = i_m * BM + tl.arange(0, BM)
    carry = tl.load(carry_ptr + i_nh * M + o_m, mask=o_m < M, other=0.0)
    n_c = tl.cdiv(eos - bos, BT)
    x, dg = _gate_grad_load(n_c - 1, dgate_ptr, dsk_ptr, dsv_ptr, g_ptr, bos, eos, i_h, H, M, o_m, BT)
    if WHILE_LOOPS:
        i_c = n_c - 1
        while i_c >= 0:
            carry, x, dg = _gate_grad_step(carry, x, dg, i_c, dgate_ptr, dsk_ptr, dsv_ptr, g_ptr, dg_ptr, bos, eos,
                                           i_h, H, M, o_m, BT)
            i_c -= 1
    else:
        for i in range(0, n_c):
            carry, x, dg = _gate_grad_step(carry, x, dg, n_c - 1 - i, dgate_ptr, dsk_ptr, dsv_ptr, g_ptr, dg_ptr,
                                           bos, eos, i_h, H, M, o_m, BT)
