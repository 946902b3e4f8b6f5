"""Triton kernels of the chunked GSA that take one whole chunk (BT = 64 positions) per program.

They do the work of the per-sub-chunk kernels of `chunk_kernels.py` (`_output_fwd_kernel`,
`_query_bwd_kernel` with `_chunk_read_grad_kernel`, `_key_bwd_kernel`) for slot counts
up to 64 and head dims up to 128, where a [BT, slots] and a [BT, head dim] tile fit in
registers: every product then has BT = 64 rows (Hopper's warpgroup MMA) and each chunk's
q, k, v, gates and state are loaded once instead of once per sub-chunk.

Intra-chunk pairs (t, j <= t) carry exp(b_t - b_j) per slot (b: chunk-local cumulative
log-gates, non-increasing in t). The chunk is cut into blocks of BC rows; for query row t
in block i with first row r_i the factor splits as exp(b_t - b_r) * exp(b_r - b_j): the
first factor is <= 1 ("Q", one tile for all blocks), the second is <= 1 for j before
block i and at most exp(SPAN) inside it ("K_i", one tile per block). So each block costs
one BT-row product whose rows outside the block are masked away. If some block's gates
decay by more than exp(-SPAN) across it, the chunk's diagonal blocks are instead summed
exactly, one row offset at a time (`_exact_*`), and the products keep only the pairs
before each query's block.

Layout and dot precisions as in `chunk_kernels.py` (PREC_S for what reaches the log-gate
gradient, PREC_V for what only reaches o, dq, dk, dv); q.k-type products of the inputs
themselves run on the inputs' dtype (exact products, fp32 accumulation).
"""

import triton
import triton.language as tl

from .chunk_kernels import _INTERPRETED, _dot, _load_state, _slot_softmax, _store_state


@triton.jit
def _dot_inputs(a, b):
    """a @ b for tiles in the inputs' dtype: bf16 / fp16 products are exact in fp32, fp32
    inputs take the exact fp32 path (as do all under the interpreter, whose bf16 dots
    are wrong: see `chunk_kernels._INTERPRETED`)."""
    if a.dtype == tl.float32 or _INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _dot_in(a, b, PREC: tl.constexpr):
    """a @ b at precision PREC where one operand is a tile of the inputs (their dtype) and
    the other fp32: for bf16 inputs "bf16x3" then needs only the fp32 operand's split,
    two products instead of three (the input's low part is 0)."""
    if PREC == "bf16x3" and not _INTERPRETED and a.dtype == tl.bfloat16:
        b_hi = b.to(tl.bfloat16)
        out = tl.dot(a, b_hi) + tl.dot(a, (b - b_hi.to(tl.float32)).to(tl.bfloat16))
    elif PREC == "bf16x3" and not _INTERPRETED and b.dtype == tl.bfloat16:
        a_hi = a.to(tl.bfloat16)
        out = tl.dot(a_hi, b) + tl.dot((a - a_hi.to(tl.float32)).to(tl.bfloat16), b)
    else:
        out = _dot(a.to(tl.float32), b.to(tl.float32), PREC)
    return out


# Addressing: tiles are read through a scalar int64 pointer to the chunk's first row
# (head i_h) plus int32 offsets inside the chunk (int64 offsets per element cost
# registers). `rows` are local row indices (0..BT-1), `stride` the distance between
# rows (H * width), `ok` the rows to touch.

@triton.jit
def _base(ptr, t0, i_h, H, width):
    """Pointer to row t0, head i_h of a [N, H, width] tensor."""
    return ptr + (t0 * H + i_h) * width


@triton.jit
def _tile(base, rows, ok, stride, width, BW: tl.constexpr):
    """[len(rows), BW] tile in the tensor's dtype (0 where not ok or past width)."""
    o = tl.arange(0, BW)
    return tl.load(base + rows[:, None] * stride + o[None, :], mask=ok[:, None] & (o < width)[None, :], other=0.0)


@triton.jit
def _store_tile(base, x, rows, ok, stride, width, BW: tl.constexpr):
    o = tl.arange(0, BW)
    tl.store(base + rows[:, None] * stride + o[None, :], x.to(base.dtype.element_ty),
             mask=ok[:, None] & (o < width)[None, :])


@triton.jit
def _gate_row(bb, row, n, HM, M, BM: tl.constexpr):
    """Local row `row` of a chunk's [BT, M] gate tile at bb ([BM]; 0 past its n valid rows)."""
    o_m = tl.arange(0, BM)
    return tl.load(bb + row * HM + o_m, mask=(o_m < M) & (row < n), other=0.0)


@triton.jit
def _block_ref(bb, i, n, HM, M, BM: tl.constexpr, BC: tl.constexpr):
    """b at the first row of block i (0 for a block past the sequence end)."""
    return _gate_row(bb, i * BC, n, HM, M, BM)


@triton.jit
def _chunk_gates(bb, gb, n, HM, M, BT: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr, SPAN: tl.constexpr):
    """The chunk's gate tiles [BT, BM]: b, s = 1 - exp(g), Q = exp(b_t - b_r(t)) (r(t): the
    first row of t's block), and whether the products may cover the diagonal blocks
    (every block decays by less than exp(-SPAN)). Rows past the end: b = s = 0, Q <= 1."""
    o_t = tl.arange(0, BT)
    b = _tile(bb, o_t, o_t < n, HM, M, BM)
    s = 1.0 - tl.exp(_tile(gb, o_t, o_t < n, HM, M, BM))
    blk = o_t // BC
    bref = tl.zeros_like(b)
    for i in tl.static_range(BT // BC):
        bref = tl.where((blk == i)[:, None], _block_ref(bb, i, n, HM, M, BM, BC)[None, :], bref)
    decay = tl.minimum(b - bref, 0.0)
    diag_ok = tl.min(tl.min(decay, 1), 0) > -SPAN  # rows past the end: b = 0, decay 0
    return b, s, tl.exp(decay), diag_ok


@triton.jit
def _key_factor(bb, b, i, n, HM, M, diag_ok, BT: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr):
    """K_i [BT, BM]: exp(b_r - b_j) for the key rows j a query of block i reaches through
    the products (before block i, and block i itself when diag_ok), else 0."""
    end = i * BC + BC * diag_ok.to(tl.int32)
    b_r = _block_ref(bb, i, n, HM, M, BM, BC)
    return tl.where((tl.arange(0, BT) < end)[:, None], tl.exp(b_r[None, :] - b), 0.0)


@triton.jit
def _pair_mask(diag_ok, BT: tl.constexpr, BC: tl.constexpr):
    """[BT, BT] (query t, key j): the pairs the products cover, j <= t, or with diag_ok
    false only j before t's block."""
    o = tl.arange(0, BT)
    limit = tl.where(diag_ok, o, (o // BC) * BC - 1)
    return o[None, :] <= limit[:, None]


@triton.jit
def _slot_read(x, yb, s0, b, s, qf, diag_ok, gb, bb, n, HD, HM, D, M,
               BT: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """[BT, BM] with entry (t, m) = exp(b_t) (s0 x_t)_m + sum_{j <= t} s_j,m exp(b_t,m - b_j,m) (x_t . y_j);
    x [BT, BD] in the inputs' dtype, y the chunk's rows at yb, s0 [BM, BD] fp32 (the
    chunk's start state)."""
    o_t = tl.arange(0, BT)
    a = tl.where(_pair_mask(diag_ok, BT, BC), _dot_inputs(x, tl.trans(_tile(yb, o_t, o_t < n, HD, D, BD))), 0.0)
    blk = o_t // BC
    acc = tl.zeros_like(b)
    for i in tl.static_range(BT // BC):
        if i * BC < n:  # (a block past the end has no reference row)
            k_i = s * _key_factor(bb, b, i, n, HM, M, diag_ok, BT, BM, BC)
            acc += _dot(tl.where((blk == i)[:, None], a, 0.0), k_i, PREC)
    out = tl.exp(b) * _dot_in(x, tl.trans(s0), PREC) + qf * acc
    if not diag_ok:
        out += _exact_slot_diagonal(x, yb, gb, bb, b, n, HD, HM, D, M, BT, BM, BD, BC)
    return out


@triton.jit
def _value_weights(w, b, s, qf, diag_ok, bb, n, HM, M,
                   BT: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """[BT, BT] (query t, key j): sum_m w_t,m s_j,m exp(b_t,m - b_j,m) for the pairs of
    `_pair_mask`, 0 elsewhere; w [BT, BM]."""
    blk = tl.arange(0, BT) // BC
    wq = w * qf
    acc = tl.zeros([BT, BT], dtype=tl.float32)
    for i in tl.static_range(BT // BC):
        if i * BC < n:
            k_i = s * _key_factor(bb, b, i, n, HM, M, diag_ok, BT, BM, BC)
            acc += _dot(tl.where((blk == i)[:, None], wq, 0.0), tl.trans(k_i), PREC)
    return tl.where(_pair_mask(diag_ok, BT, BC), acc, 0.0)


@triton.jit
def _partner_rows(kk, n, KEY_SIDE: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """Offset kk of the exact diagonal sums: for each row of the chunk, the row of its block
    at offset kk and whether the pair counts (a key row j <= the query row, both valid).
    KEY_SIDE: the chunk's rows are keys and the partners queries, else the reverse."""
    o = tl.arange(0, BT)
    other = (o // BC) * BC + kk
    if KEY_SIDE:
        return other, (other >= o) & (other < n)
    return other, (other <= o) & (other < n)


@triton.jit
def _exact_slot_diagonal(x, yb, gb, bb, b, n, HD, HM, D, M,
                         BT: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr):
    """The diagonal blocks of `_slot_read`, each pair's exp(b_t - b_j) taken directly."""
    out = tl.zeros_like(b)
    x = x.to(tl.float32)
    for jj in range(0, BC):
        j, ok = _partner_rows(jj, n, False, BT, BC)
        y_j = _tile(yb, j, ok, HD, D, BD).to(tl.float32)
        s_j = 1.0 - tl.exp(_tile(gb, j, ok, HM, M, BM))
        b_j = _tile(bb, j, ok, HM, M, BM)
        out += tl.sum(x * y_j, 1)[:, None] * s_j * tl.exp(tl.minimum(b - b_j, 0.0))
    return out


@triton.jit
def _exact_value_diagonal(w, gb, bb, b, n, HM, M, BT: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr):
    """The diagonal blocks of `_value_weights`, each pair's exp(b_t - b_j) taken directly."""
    out = tl.zeros([BT, BT], dtype=tl.float32)
    cols = tl.arange(0, BT)
    for jj in range(0, BC):
        j, ok = _partner_rows(jj, n, False, BT, BC)
        s_j = 1.0 - tl.exp(_tile(gb, j, ok, HM, M, BM))
        b_j = _tile(bb, j, ok, HM, M, BM)
        weight = tl.sum(w * s_j * tl.exp(tl.minimum(b - b_j, 0.0)), 1)  # [BT]
        out = tl.where(cols[None, :] == j[:, None], weight[:, None], out)
    return out


@triton.jit
def _exact_key_diagonal(wb, xb, y, bb, b, n, HD, HM, D, M,
                        BT: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr):
    """The diagonal blocks of the key side's ds sum (before the factor sc), each pair's
    exp(b_t - b_j) taken directly: key row j gets
    sum_{t >= j in its block} exp(b_t - b_j) (y_j . x_t) w_t."""
    out = tl.zeros_like(b)
    y = y.to(tl.float32)
    for tt in range(0, BC):
        t, ok = _partner_rows(tt, n, True, BT, BC)
        x_t = _tile(xb, t, ok, HD, D, BD).to(tl.float32)
        w_t = _tile(wb, t, ok, HM, M, BM)
        b_t = _tile(bb, t, ok, HM, M, BM)
        out += tl.sum(y * x_t, 1)[:, None] * w_t * tl.exp(tl.minimum(b_t - b, 0.0))
    return out


@triton.jit
def _value_read(w, y, s0, b, s, qf, diag_ok, gb, bb, n, HM, M,
                BT: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """[BT, BD]: row t = (w_t * exp(b_t)) s0 + sum_{j <= t} (sum_m w_t,m s_j,m exp(b_t,m - b_j,m)) y_j;
    w [BT, BM], y [BT, BD] in the inputs' dtype, s0 [BM, BD] fp32."""
    a = _value_weights(w, b, s, qf, diag_ok, bb, n, HM, M, BT, BM, BC, PREC)
    if not diag_ok:
        a += _exact_value_diagonal(w, gb, bb, b, n, HM, M, BT, BM, BC)
    return _dot(w * tl.exp(b), s0, PREC) + _dot(a, y.to(tl.float32), PREC)


@triton.jit
def _chunk_rows(chunk_ptr, i_c, BT: tl.constexpr):
    """Chunk i_c's first row t0 (int64), its number of valid rows n, local rows and mask."""
    t0 = tl.load(chunk_ptr + 2 * i_c)
    n = tl.minimum(tl.load(chunk_ptr + 2 * i_c + 1) - t0, BT).to(tl.int32)
    o_t = tl.arange(0, BT)
    return t0, n, o_t, o_t < n


@triton.jit
def _whole_output_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, sk_ptr, sv_ptr, o_ptr, z_ptr, chunk_ptr, scale, H, M, DK, DV,
    BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PREC_S: tl.constexpr, PREC_V: tl.constexpr, SPAN: tl.constexpr,
):
    """Output of one chunk, one head: slot logits z (scaled, fp32, stored for the
    backward), slot softmax, value read."""
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0, n, o_t, m_t = _chunk_rows(chunk_ptr, i_c, BT)
    HM = H * M
    bb, gb = _base(b_ptr, t0, i_h, H, M), _base(g_ptr, t0, i_h, H, M)
    b, s, qf, diag_ok = _chunk_gates(bb, gb, n, HM, M, BT, BM, BC, SPAN)
    q = _tile(_base(q_ptr, t0, i_h, H, DK), o_t, m_t, H * DK, DK, BK)
    z = _slot_read(q, _base(k_ptr, t0, i_h, H, DK), _load_state(sk_ptr, i_c, i_h, H, M, DK, 0, BM, BK),
                   b, s, qf, diag_ok, gb, bb, n, H * DK, HM, DK, M, BT, BM, BK, BC, PREC_S) * scale
    _store_tile(_base(z_ptr, t0, i_h, H, M), z, o_t, m_t, HM, M, BM)
    p = _slot_softmax(z, M, BM)
    o = _value_read(p, _tile(_base(v_ptr, t0, i_h, H, DV), o_t, m_t, H * DV, DV, BV),
                    _load_state(sv_ptr, i_c, i_h, H, M, DV, 0, BM, BV), b, s, qf, diag_ok, gb, bb, n, HM, M,
                    BT, BM, BC, PREC_V)
    _store_tile(_base(o_ptr, t0, i_h, H, DV), o, o_t, m_t, H * DV, DV, BV)


@triton.jit
def _whole_query_bwd_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, sk_ptr, sv_ptr, z_ptr, do_ptr, chunk_ptr,
    p_ptr, dz_ptr, dq_ptr, dgate_ptr, dnk_ptr, dnv_ptr,
    scale, H, M, DK, DV,
    BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PREC_S: tl.constexpr, PREC_V: tl.constexpr, SPAN: tl.constexpr,
):
    """Query side of the backward for one chunk, one head.

    p = softmax(z) from the stored logits; dp_t,m = do_t . V~_t[m]; dz = p (dp - <p, dp>).
    Writes p and dz (fp32, for the key side), dq = scale K~_t^T dz_t, the query part
    z*dz + p*dp of the gradient with respect to the cumulative log-gates, and the gradient
    of the chunk's start states from its reads (before the reverse scan):
    dnk = scale (dz * exp(b))^T q [M, dk], dnv = (p * exp(b))^T do [M, dv].
    """
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0, n, o_t, m_t = _chunk_rows(chunk_ptr, i_c, BT)
    HM = H * M
    bb, gb = _base(b_ptr, t0, i_h, H, M), _base(g_ptr, t0, i_h, H, M)
    b, s, qf, diag_ok = _chunk_gates(bb, gb, n, HM, M, BT, BM, BC, SPAN)
    z = _tile(_base(z_ptr, t0, i_h, H, M), o_t, m_t, HM, M, BM)
    p = _slot_softmax(z, M, BM)
    do = _tile(_base(do_ptr, t0, i_h, H, DV), o_t, m_t, H * DV, DV, BV)
    dp = _slot_read(do, _base(v_ptr, t0, i_h, H, DV), _load_state(sv_ptr, i_c, i_h, H, M, DV, 0, BM, BV),
                    b, s, qf, diag_ok, gb, bb, n, H * DV, HM, DV, M, BT, BM, BV, BC, PREC_S)
    dz = p * (dp - tl.sum(p * dp, 1)[:, None])
    _store_tile(_base(p_ptr, t0, i_h, H, M), p, o_t, m_t, HM, M, BM)
    _store_tile(_base(dz_ptr, t0, i_h, H, M), dz, o_t, m_t, HM, M, BM)
    dgate = tl.where((tl.arange(0, BM) < M)[None, :], z * dz, 0.0) + p * dp
    _store_tile(_base(dgate_ptr, t0, i_h, H, M), dgate, o_t, m_t, HM, M, BM)
    dq = _value_read(dz, _tile(_base(k_ptr, t0, i_h, H, DK), o_t, m_t, H * DK, DK, BK),
                     _load_state(sk_ptr, i_c, i_h, H, M, DK, 0, BM, BK), b, s, qf, diag_ok, gb, bb, n, HM, M,
                     BT, BM, BC, PREC_V)
    _store_tile(_base(dq_ptr, t0, i_h, H, DK), dq * scale, o_t, m_t, H * DK, DK, BK)
    # the start states' gradients (rows past the end: dz = 0 and do = 0, they add nothing)
    eb = tl.exp(b)
    _store_state(dnv_ptr, _dot_in(tl.trans(p * eb), do, PREC_S), i_c, i_h, H, M, DV, 0, BM, BV)
    q = _tile(_base(q_ptr, t0, i_h, H, DK), o_t, m_t, H * DK, DK, BK)
    _store_state(dnk_ptr, scale * _dot_in(tl.trans(dz * eb), q, PREC_S), i_c, i_h, H, M, DK, 0, BM, BK)


@triton.jit
def _key_side(w_ptr, x_ptr, y_ptr, dn_ptr, dy_ptr, sc, b, s, qf, to_end, diag_ok, bb, gb, t0, n, i_c, i_h, H, M, D,
              BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
              PREC_S: tl.constexpr, PREC_V: tl.constexpr):
    """One state's share of the key side (see `_whole_key_bwd_kernel`): stores dy, returns
    its part of ds [BT, BM]."""
    HM, HD = H * M, H * D
    o_t = tl.arange(0, BT)
    m_t = o_t < n
    wb, xb = _base(w_ptr, t0, i_h, H, M), _base(x_ptr, t0, i_h, H, D)
    w = _tile(wb, o_t, m_t, HM, M, BM)
    x = _tile(xb, o_t, m_t, HD, D, BD)
    y = _tile(_base(y_ptr, t0, i_h, H, D), o_t, m_t, HD, D, BD)
    dn = _load_state(dn_ptr, i_c, i_h, H, M, D, 0, BM, BD)
    dy = _dot(s * to_end, dn, PREC_V)
    ds = to_end * _dot_in(y, tl.trans(dn), PREC_S)
    # the queries of the chunk: ds through (y_j . x_t), dy through the pair weights
    a = tl.trans(tl.where(_pair_mask(diag_ok, BT, BC), _dot_inputs(x, tl.trans(y)), 0.0))  # [j, t]
    wq = w * qf
    blk = o_t // BC
    for i in tl.static_range(BT // BC):
        if i * BC < n:
            key = _key_factor(bb, b, i, n, HM, M, diag_ok, BT, BM, BC)
            ds += sc * key * _dot(tl.where((blk == i)[None, :], a, 0.0), wq, PREC_S)
    weights = _value_weights(w, b, s, qf, diag_ok, bb, n, HM, M, BT, BM, BC, PREC_V)  # [t, j]
    if not diag_ok:
        weights += _exact_value_diagonal(w, gb, bb, b, n, HM, M, BT, BM, BC)
        ds += sc * _exact_key_diagonal(wb, xb, y, bb, b, n, HD, HM, D, M, BT, BM, BD, BC)
    dy += sc * _dot(tl.trans(weights), x.to(tl.float32), PREC_V)
    _store_tile(_base(dy_ptr, t0, i_h, H, D), dy, o_t, m_t, HD, D, BD)
    return ds


@triton.jit
def _whole_key_bwd_kernel(
    dz_ptr, q_ptr, k_ptr, dnk_ptr, p_ptr, do_ptr, v_ptr, dnv_ptr, g_ptr, b_ptr, dgate_ptr, chunk_ptr,
    dk_ptr, dv_ptr, dg_ptr, total_ptr, scale, H, M, DK, DV,
    BT: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PREC_S: tl.constexpr, PREC_V: tl.constexpr, SPAN: tl.constexpr,
):
    """Key side of the backward for the key rows j of one chunk, one head, from the queries
    t >= j of the chunk and from the state gradients at the chunk end (dn), for both
    states in turn: (w, x, y, dn, sc) = (dz, q, k, dK~, scale) gives dk, then
    (p, do, v, dV~, 1) gives dv. With G the cumulative gate at the chunk's last row:

        ds_j,m = sum over both of exp(G_m - b_j,m) (y_j . dn_m) + sc sum_t exp(b_t,m - b_j,m) (y_j . x_t) w_t,m
        dy_j = (s_j exp(G - b_j)) dn + sc sum_t (sum_m w_t,m s_j,m exp(b_t,m - b_j,m)) x_t

    ds, the gradient of the write weights s, then gives the chunk's part of the log-gate
    gradient: with x = dgate - s ds (the gradient with respect to the cumulative log-gate,
    which reaches every g of the sequence up to its row) it stores
    dg = -exp(g) ds + sum_{t' >= t in the chunk} x_t' and the chunk's total sum_t x_t
    ([NC, H, M]); what later chunks add comes after (`_add_chunk_suffix_kernel`).
    The pairs split as in the forward: query block i's reference row r_i, exp(b_t - b_r)
    on the query side, exp(b_r - b_j) on the key side.
    """
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0, n, o_t, m_t = _chunk_rows(chunk_ptr, i_c, BT)
    HM = H * M
    bb, gb = _base(b_ptr, t0, i_h, H, M), _base(g_ptr, t0, i_h, H, M)
    b, s, qf, diag_ok = _chunk_gates(bb, gb, n, HM, M, BT, BM, BC, SPAN)
    g_last = _gate_row(bb, n - 1, n, HM, M, BM)  # b at the chunk's last row
    to_end = tl.exp(tl.minimum(g_last[None, :] - b, 0.0))  # [BT, BM]
    ds = _key_side(dz_ptr, q_ptr, k_ptr, dnk_ptr, dk_ptr, scale, b, s, qf, to_end, diag_ok, bb, gb, t0, n, i_c, i_h,
                   H, M, DK, BT, BC, BM, BK, PREC_S, PREC_V)
    ds += _key_side(p_ptr, do_ptr, v_ptr, dnv_ptr, dv_ptr, 1.0, b, s, qf, to_end, diag_ok, bb, gb, t0, n, i_c, i_h,
                    H, M, DV, BT, BC, BM, BV, PREC_S, PREC_V)
    # rows past the end: ds = dgate = 0
    x = _tile(_base(dgate_ptr, t0, i_h, H, M), o_t, m_t, HM, M, BM) - s * ds
    dg = (s - 1.0) * ds + tl.cumsum(x, 0, reverse=True)
    _store_tile(_base(dg_ptr, t0, i_h, H, M), dg, o_t, m_t, HM, M, BM)
    o_m = tl.arange(0, BM)
    tl.store(total_ptr + (i_c.to(tl.int64) * H + i_h) * M + o_m, tl.sum(x, 0), mask=o_m < M)


@triton.jit
def _add_chunk_suffix_kernel(dg_ptr, before_ptr, carry_ptr, chunk_ptr, seq_ptr, H, M, s_h, s_m, s_c,
                             HAS_CARRY: tl.constexpr, BT: tl.constexpr, BM: tl.constexpr):
    """dg += suffix on every row of chunk c (one head): what the later chunks of the
    sequence add to the log-gate gradient, the difference of two float64 prefix sums of
    the chunk totals (`before` [H, M, chunks], strides s_h, s_m, s_c: chunks up to c), plus
    the final state's share, carry [NS, H, M] (contiguous) at the chunk's sequence (seq_ptr)."""
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    t0, n, o_t, m_t = _chunk_rows(chunk_ptr, i_c, BT)
    last = i_c + (tl.load(chunk_ptr + 2 * i_c + 1) - t0 + BT - 1) // BT - 1  # the sequence's last chunk
    o_m = tl.arange(0, BM)
    row = before_ptr + i_h.to(tl.int64) * s_h + o_m.to(tl.int64) * s_m
    m_m = o_m < M
    add = tl.load(row + last * s_c, mask=m_m, other=0.0) - tl.load(row + i_c.to(tl.int64) * s_c, mask=m_m, other=0.0)
    add = add.to(tl.float32)
    if HAS_CARRY:
        seq = tl.load(seq_ptr + i_c)
        add += tl.load(carry_ptr + (seq * H + i_h) * M + o_m, mask=m_m, other=0.0)
    base = _base(dg_ptr, t0, i_h, H, M)
    _store_tile(base, _tile(base, o_t, m_t, H * M, M, BM) + add[None, :], o_t, m_t, H * M, M, BM)
