"""The cross-chunk sums of the LAVO kernels as one Triton scan per call.

The forward needs, per query chunk, the sum of the value totals of the key chunks before
it (causal) or of all key chunks (noncausal); the backward needs, per key chunk, the sum
of the memory-gradient totals of the query chunks after it (causal) or of all of them.
Both are scans over a sequence's chunk totals `[chunks, W]` (W = segments x heads x d
columns): one program per (sequence, block of BW columns) walks the sequence's chunks
in tiles of TB rows, an fp32 scan inside a tile plus a float64 carry across tiles (the
carry keeps long sequences from accumulating fp32 rounding). A float64 PyTorch prefix
over all chunks and two gathers gives the same sums more slowly (docs/benchmarks.md,
"Launch settings").

A sequence's row of SEQS is (first query chunk, query chunks, first key chunk, key
chunks), the indices into the chunk tables of chunk.py's `_Layout`.
"""

import math

import triton
import triton.language as tl

from ..common import cdiv, next_pow2

SCAN_ROWS = 64  # chunks per tile (TB)
SCAN_COLS = 64  # columns per program (BW)


@triton.jit
def _load_seq(SEQS, s):
    """Row s of SEQS as 4 scalars (masked sums, as chunk_common.load_chunk: true scalars
    under the interpreter too, usable as loop bounds)."""
    col = tl.arange(0, 4)
    row = tl.load(SEQS + s * 4 + col)
    return (
        tl.sum(tl.where(col == 0, row, 0)), tl.sum(tl.where(col == 1, row, 0)), tl.sum(tl.where(col == 2, row, 0)),
        tl.sum(tl.where(col == 3, row, 0)),
    )


@triton.jit
def _tile_ptrs(PTR, first, i, cols, W, TB: tl.constexpr):
    """Pointers [TB, BW] to rows first + i .. of a [rows, W] tensor, columns `cols`."""
    base = PTR + (first + i).to(tl.int64) * W
    return base + (tl.arange(0, TB) * W)[:, None] + cols[None, :]


@triton.jit
def _load_tile(PTR, first, i, n, cols, col_ok, W, TB: tl.constexpr):
    """Rows i .. i+TB-1 of a sequence's n rows (0 past them) -> [TB, BW] fp32."""
    ok = (i + tl.arange(0, TB) < n)[:, None] & col_ok[None, :]
    return tl.load(_tile_ptrs(PTR, first, i, cols, W, TB), mask=ok, other=0.0)


@triton.jit
def _store_tile(PTR, x, first, i, n, cols, col_ok, W, TB: tl.constexpr):
    ok = (i + tl.arange(0, TB) < n)[:, None] & col_ok[None, :]
    tl.store(_tile_ptrs(PTR, first, i, cols, W, TB), x, mask=ok)


@triton.jit
def chunk_range_sums_kernel(
    TOT, OUT, SEQS, W,
    TILES: tl.constexpr, TB: tl.constexpr, BW: tl.constexpr, SUFFIX: tl.constexpr, TOTAL: tl.constexpr,
):
    """Prefix (SUFFIX False): OUT[query chunk c] = sum of TOT[key chunks 0 .. c-1] of its
    sequence (all of them when c is past the last). Suffix: OUT[key chunk c] = sum of
    TOT[query chunks c+1 ..]. TOTAL: every output row gets the sum of all input rows.
    TILES: tiles of TB chunks that cover the longest sequence, a power of 2 (few compiled
    versions; a run-time loop bound would not run under the interpreter, which hands
    the kernel 1-element arrays); shorter sequences skip the rest."""
    s = tl.program_id(0)
    cols = tl.program_id(1) * BW + tl.arange(0, BW)
    col_ok = cols < W
    qfirst, nq, kfirst, nk = _load_seq(SEQS, s)
    if SUFFIX:
        in_first, n_in, out_first, n_out = qfirst, nq, kfirst, nk
    else:
        in_first, n_in, out_first, n_out = kfirst, nk, qfirst, nq
    carry = tl.zeros([BW], tl.float64)
    if TOTAL:
        for k in range(TILES):
            if k * TB < n_in:
                x = _load_tile(TOT, in_first, k * TB, n_in, cols, col_ok, W, TB)
                carry += tl.sum(x, 0).to(tl.float64)
        for k in range(TILES):
            if k * TB < n_out:
                x = tl.zeros([TB, BW], tl.float32) + carry.to(tl.float32)[None, :]
                _store_tile(OUT, x, out_first, k * TB, n_out, cols, col_ok, W, TB)
    else:
        for k in range(TILES):
            i = (TILES - 1 - k) * TB if SUFFIX else k * TB  # the suffix walks backward
            if (i < n_in) | (i < n_out):
                x = _load_tile(TOT, in_first, i, n_in, cols, col_ok, W, TB)
                excl = tl.cumsum(x, 0, reverse=SUFFIX) - x  # rows before (after) each row in the tile
                _store_tile(OUT, carry.to(tl.float32)[None, :] + excl, out_first, i, n_out, cols, col_ok, W, TB)
                carry += tl.sum(x, 0).to(tl.float64)


def chunk_range_sums(totals, seqs, out, longest, *, suffix, total):
    """The sums described above of totals [chunks, ...] fp32 into out [rows, ...] fp32
    (rows past the output chunks of `seqs` are not written; `seqs`: the int32
    [sequences, 4] table; `longest`: the most chunks of one sequence, queries or keys)."""
    width = math.prod(totals.shape[1:])
    tiles = cdiv(longest, SCAN_ROWS)
    tiles = next_pow2(tiles) if tiles else 0
    chunk_range_sums_kernel[(seqs.shape[0], cdiv(width, SCAN_COLS))](
        totals.contiguous(), out, seqs, width, TILES=tiles, TB=SCAN_ROWS, BW=SCAN_COLS, SUFFIX=suffix, TOTAL=total,
        num_warps=4,
    )
