"""GSA on the Triton path: `chunk_gsa_attn`, what `gsa_attn(..., backend="triton")` runs.

The causal scan (CS) is one autograd Function. Up to 64 slots and head dims up to 128
(the protocol's sizes) it runs the whole-chunk kernels of `whole_chunk_kernels.py`, one
program per chunk of BT = 64 positions and head:

    forward   _chunk_write_kernel          (per chunk: what it adds to K~ and V~; b = cumsum of g)
              _state_scan_kernel           (K~, V~ at every chunk start: scan over chunks)
              _whole_output_kernel         (logits, slot softmax, value read)
    backward  _whole_query_bwd_kernel      (p from the saved logits, dz, dq, the query part of
                                            the gate grad, the chunk's reads' gradient of its start state)
              _state_scan_kernel           (state gradients at every chunk end: reverse scan)
              _whole_key_bwd_kernel        (dk, dv, ds, the chunk's part of d log_alpha and its total)
              _add_chunk_suffix_kernel     (what the later chunks and the final state add to
                                            d log_alpha)

Wider sizes run the per-sub-chunk kernels of `chunk_kernels.py` (16 positions a program,
tiles narrow enough for 256 slots or head dims of 256) in place of the three whole-chunk
ones: `_output_fwd_kernel`, `_query_bwd_kernel` with `_chunk_read_grad_kernel`,
`_key_bwd_kernel` (dk, then dv, each with its share of ds) and the sequential
`_gate_grad_kernel` (the reverse cumulative sum of the gate grad).

The other patterns reuse it: NS runs it on the sequences reversed too (as a second scan,
or for small sizes in the same scan, beside the forward sequences), CC runs it with
the target queries over the source, the shorter padded to the longer (source positions
past its end write nothing, so the queries there read the final source state). NC, where
every query reads the final source state, runs eagerly as one scan over the source
followed by the target (whose positions write nothing). Under torch.compile, or above
CROSS_ONE_SCAN_ROWS, a longer CC target's queries past the source and all of NC's read
the final source state in PyTorch instead (the read of one fixed state, a softmax over M
slots, is two small batched matrix products); NC's scan then has no queries (q None):
the forward writes the states only, without the output kernel, and the backward skips
the query side (dq and the reads' gradients).

Sequences are packed token-major ([B, T, H, D] viewed as [B*T, H, D]); `cu_seqlens`
gives the same layout with unequal lengths. Inputs are validated by `gsa_attn`.
"""

import torch

from ..common import KERNEL_DTYPES, WHILE_LOOPS, cdiv, next_pow2, shape_cache, tile_width
from . import chunk_kernels as K
from . import whole_chunk_kernels as W
from .state import GsaState
from .torch_path import read_state

BT = 64  # positions per chunk (a state is kept at every chunk start)
BC = 16  # positions per sub-chunk (one program of the per-position kernels)
# state columns per block of the chunk write (both states in one program) and per program
# of the read-gradient kernel (32 is slower at d=M=64: docs/benchmarks.md, "Launch
# settings"); half that with more than 128 slots
BD_STATE = 64
SCAN_ROWS, SCAN_COLS = 8, 64  # state tile per program of the scans over chunks
GATE_SLOTS = 16  # slots per program of the log-gate gradient's reverse cumulative sum
# Inside a block of rows (a sub-chunk; a whole chunk in the whole-chunk kernels), pairs
# (t, j) go through one matrix product with a reference row r, exp(b_t - b_j) =
# exp(b_t - b_r) exp(b_r - b_j) with factors between exp(-SPAN) and exp(SPAN), unless some
# slot's gates decay by more than exp(-SPAN) across the block; then the kernels take
# exp(b_t - b_j) one row at a time (exact, slower). Each product term keeps its relative
# precision whatever the factors; SPAN only keeps them inside fp32's range, with room
# for 64-term sums of |q.k| up to ~1e10 (exp(60) ~ 1e26).
SPAN = 60.0
MAX_DIM = 256  # head dims and slot counts the kernels take
# head-dim columns per block of the per-sub-chunk kernels' products; half that with more
# than 128 slots
COL_BLOCK = 64


@shape_cache(maxsize=64)
def _layout(lengths: tuple, device: torch.device):
    """Index tables of the packed sequences (int64, on `device`).

    cu [NS+1]: first token of each sequence; coff [NS+1]: first chunk of each sequence;
    chunks [NC, 2]: per chunk (first row, sequence end); chunk_seq [NC]: its sequence;
    sub [NSUB, 4]: per sub-chunk (first row, its chunk's first row, chunk index, sequence end).
    Returns (cu, coff, chunks, chunk_seq, sub, number of chunks, number of sub-chunks).
    """
    lens = torch.tensor(lengths, dtype=torch.int64)
    zero = torch.zeros(1, dtype=torch.int64)
    cu = torch.cat([zero, lens.cumsum(0)])
    n_chunks = (lens + BT - 1) // BT
    coff = torch.cat([zero, n_chunks.cumsum(0)])
    chunk_seq = torch.repeat_interleave(torch.arange(len(lengths)), n_chunks)
    chunk_local = torch.arange(int(n_chunks.sum())) - torch.repeat_interleave(coff[:-1], n_chunks)
    chunks = torch.stack([cu[chunk_seq] + chunk_local * BT, cu[chunk_seq + 1]], 1)
    n_sub = (lens + BC - 1) // BC
    seq = torch.repeat_interleave(torch.arange(len(lengths)), n_sub)
    local = torch.arange(int(n_sub.sum())) - torch.repeat_interleave(n_sub.cumsum(0) - n_sub, n_sub)
    chunk_local = local * BC // BT
    sub = torch.stack([cu[seq] + local * BC, cu[seq] + chunk_local * BT, coff[seq] + chunk_local, cu[seq + 1]], 1)
    to = dict(dtype=torch.int64, device=device)  # int64 offsets: no overflow at any length
    return (cu.to(**to), coff.to(**to), chunks.contiguous().to(**to), chunk_seq.to(**to), sub.contiguous().to(**to),
            int(coff[-1]), int(sub.shape[0]))


# Dot precision for bf16 / fp16 inputs, one per family (fp32 inputs run "ieee" in both):
# PREC_SLOTS for the dots whose results reach the log-gate gradient (state writes and their
# gradients, slot-side reads, ds): that gradient is a difference of large sums, and plain
# tf32 there left it at 6.7e-3 relative RMS at 8K (limit 5e-3); bf16x3 keeps about 16 bits:
# 2.3e-3 there, as tf32x3 does, and is faster than tf32x3.
# PREC_VALUES for the dots that only reach o, dq, dk, dv: bf16 operands stay within
# 2.4-3.1e-3 there and are the fastest (tf32 operands make the key side spill).
# Values: "tf32x3", "bf16x3", "tf32", "bf16" (see chunk_kernels). Timings: docs/benchmarks.md.
PREC_SLOTS = "bf16x3"
PREC_VALUES = "bf16"
# warps of the per-sub-chunk kernels for 64-wide tiles (output, query side, key side);
# tiles wider than 64 take 8 (at d=M=64, 8 warps are 1.6x slower).
WARPS = {"output": 4, "query": 4, "key": 4}
# Slot counts up to WHOLE_MAX_SLOTS and head dims up to WHOLE_MAX_DIM run the kernels of
# `whole_chunk_kernels.py` (one program per chunk, BT-row products) in place of the
# per-sub-chunk ones; WHOLE_BC rows per block of their intra-chunk split (a divisor of BT).
# Blocks of 64 rows at 4 warps are the fastest timed (about 2x the per-sub-chunk kernels).
WHOLE_MAX_SLOTS, WHOLE_MAX_DIM = 64, 128
WHOLE_BC = 64
# The whole-chunk kernels' slot and head-dim tiles are at least this wide. Triton 3.6
# miscompiles them on the H200 when the slot tile is narrower than a head-dim tile (or the
# reverse) below 64: wrong outputs (relative error ~0.5 at 32 slots and d = 64) or an
# out-of-range shared-memory access (fp16 noncausal self-attention faulted). Equal widths
# of 32 passed, and every combination padded to 64 matched the float64 reference (masked
# columns cost work, not accuracy); tests/kernels/test_gpu_kernel_matrix.py covers each pairing.
WHOLE_MIN_TILE = 64
# Warps of the whole-chunk kernels: 4 where the head-dim tiles are 64 wide (8 slow the
# output kernel there), 8 where they are 128 (faster in all three kernels). Timings:
# docs/benchmarks.md, "Launch settings".
WHOLE_WARPS = {"output": 4, "query": 4, "key": 4}
WHOLE_WARPS_WIDE = {"output": 8, "query": 8, "key": 8}
# NS runs its two causal scans as one (each input beside its time-reversed copy) when one
# direction's scan has fewer programs (chunks x heads) than this: up to the task shapes'
# 768 (pcc's queries) one scan took less GPU time as well as fewer launches, while at
# the protocol's 16,384 it is slower and holds twice the inputs. Timings:
# docs/benchmarks.md, "Launch settings".
NS_ONE_SCAN_PROGRAMS = 1024
# CC with a target longer than its source, and NC, run eagerly as one scan over padded
# positions (`_cross_as_one_scan`) up to this many rows x heads in that scan: the one
# scan's extra GPU work grows with its rows, the host time it saves does not, and here
# the two are about even. Timings: docs/benchmarks.md, "Wall and GPU time of one step".
CROSS_ONE_SCAN_ROWS = 65536


class _Config:
    """Block sizes, warps and dot precisions for one call."""

    def __init__(self, dk, dv, slots, dtype):
        self.BK, self.BV, self.BM = tile_width(dk), tile_width(dv), tile_width(slots)
        self.whole = self.BM <= WHOLE_MAX_SLOTS and max(self.BK, self.BV) <= WHOLE_MAX_DIM
        if self.whole:
            self.BK, self.BV, self.BM = (max(b, WHOLE_MIN_TILE) for b in (self.BK, self.BV, self.BM))
        narrow = self.BM > 128  # tiles [slots, columns] stay within registers / shared memory
        state_cols = BD_STATE // 2 if narrow else BD_STATE
        self.BDK, self.BDV = min(self.BK, state_cols), min(self.BV, state_cols)
        self.BD_WRITE = min(max(self.BK, self.BV), state_cols)
        cols = COL_BLOCK // 2 if narrow else COL_BLOCK
        self.DBK, self.DBV = min(self.BK, cols), min(self.BV, cols)
        self.blocks = dict(BK=self.BK, BV=self.BV, DBK=self.DBK, DBV=self.DBV)
        wide = self.BM * max(self.BK, self.BV) > 64 * 64
        if self.whole:
            self.warps = dict(WHOLE_WARPS_WIDE if max(self.BK, self.BV) > 64 else WHOLE_WARPS)
        else:
            self.warps = {name: 8 if wide else w for name, w in WARPS.items()}
        exact = dtype == torch.float32
        self.prec = dict(PREC_S="ieee" if exact else PREC_SLOTS, PREC_V="ieee" if exact else PREC_VALUES)


def causal_forward(q, k, v, g, h0k, h0v, scale, lengths, output_final_state):
    """CS over packed sequences. q, k [N,H,dk] (q None: the states only); v [N,H,dv];
    g [N,H,M] fp32 (log alpha); h0k [NS,H,M,dk], h0v [NS,H,M,dv] fp32 or None; lengths:
    the NS sequences' lengths. Returns (o [N,H,dv], K~_T, V~_T (empty [0] without
    output_final_state), and what the backward reads: b, z [N,H,M], gsum [chunks,H,M],
    sk, sv [chunks,H,M,d], all fp32); o and z are empty [0] without q."""
    n_tok, heads, dk = k.shape
    dv, slots = v.shape[-1], g.shape[-1]
    cu, coff, chunks, chunk_seq, sub, n_chunks, n_sub = _layout(tuple(lengths), k.device)
    n_seq = len(lengths)
    cfg = _Config(dk, dv, slots, k.dtype)
    f32 = dict(dtype=torch.float32, device=k.device)
    b = torch.empty_like(g)
    sk = torch.empty(n_chunks, heads, slots, dk, **f32)
    sv = torch.empty(n_chunks, heads, slots, dv, **f32)
    hk = torch.empty(n_seq, heads, slots, dk, **f32) if output_final_state else k.new_empty(0, dtype=torch.float32)
    hv = torch.empty(n_seq, heads, slots, dv, **f32) if output_final_state else k.new_empty(0, dtype=torch.float32)
    has_h0 = h0k is not None
    gsum = torch.empty(n_chunks, heads, slots, **f32)
    K._chunk_write_kernel[(n_chunks, heads)](
        k, v, g, b, gsum, sk, sv, chunks, heads, slots, dk, dv,
        BT=BT, BM=cfg.BM, BK=cfg.BK, BV=cfg.BV, BD=cfg.BD_WRITE, PREC=cfg.prec["PREC_S"], num_warps=4)
    _scan((sk, sv), gsum, (h0k, h0v) if has_h0 else None, (hk, hv) if output_final_state else None, coff,
          (dk, dv), n_seq, heads, slots, reverse=False)
    if q is None:
        return k.new_empty(0), hk, hv, b, k.new_empty(0, dtype=torch.float32), gsum, sk, sv
    o = torch.empty(n_tok, heads, dv, dtype=q.dtype, device=q.device)
    z = torch.empty_like(g)  # slot logits, kept for the backward
    if cfg.whole:
        W._whole_output_kernel[(n_chunks, heads)](
            q, k, v, g, b, sk, sv, o, z, chunks, scale, heads, slots, dk, dv,
            BT=BT, BC=WHOLE_BC, BM=cfg.BM, BK=cfg.BK, BV=cfg.BV, SPAN=SPAN, **cfg.prec,
            num_warps=cfg.warps["output"])
    else:
        K._output_fwd_kernel[(n_sub, heads)](
            q, k, v, g, b, sk, sv, o, z, sub, scale, heads, slots, dk, dv,
            BT=BT, BC=BC, BM=cfg.BM, SPAN=SPAN, **cfg.blocks, **cfg.prec,
            num_warps=cfg.warps["output"])
    return o, hk, hv, b, z, gsum, sk, sv


def causal_backward(do, dhk, dhv, q, k, v, g, b, z, gsum, sk, sv, hk, hv, scale, lengths, has_h0):
    """The gradients (dq, dk, dv, dg, dh0k, dh0v; dh0 None without h0, dq None without q)
    of `causal_forward` from the output's gradient `do` and the final state's (dhk, dhv,
    None when it was not returned or not used), given the forward's inputs and outputs.
    Without q (the states only) nothing is read from the states: the query side is
    skipped, and the key side reads zeros for its share of the reads' gradients."""
    cfg = _Config(k.shape[-1], v.shape[-1], g.shape[-1], k.dtype)
    n_tok, heads, dk = k.shape
    dv, slots = v.shape[-1], g.shape[-1]
    cu, coff, chunks, chunk_seq, sub, n_chunks, n_sub = _layout(tuple(lengths), k.device)
    n_seq = len(lengths)
    f32 = dict(dtype=torch.float32, device=k.device)
    if q is None:  # nothing read the states: zeros for the reads' share of the key side
        dq, q, do = None, torch.zeros_like(k), torch.zeros_like(v)
        p = dz = dgate = torch.zeros_like(g)  # the key side only reads these
        dnk, dnv = torch.zeros_like(sk), torch.zeros_like(sv)  # (the reverse scan writes these)
    else:
        do = do.contiguous()
        dq, p, dz, dgate, dnk, dnv = _query_side(do, q, k, v, g, b, z, sk, sv, scale, chunks, sub, cfg)

    has_dht = dhk is not None or dhv is not None
    if has_dht:
        dhk = torch.zeros_like(hk) if dhk is None else dhk.float().contiguous()
        dhv = torch.zeros_like(hv) if dhv is None else dhv.float().contiguous()
    dh0k = torch.empty(n_seq, heads, slots, dk, **f32)
    dh0v = torch.empty(n_seq, heads, slots, dv, **f32)
    _scan((dnk, dnv), gsum, (dhk, dhv) if has_dht else None, (dh0k, dh0v), coff, (dk, dv), n_seq, heads, slots,
          reverse=True)

    dk_, dv_, dg = torch.empty_like(k), torch.empty_like(v), torch.empty_like(g)
    # the final state is a read at each sequence's last row: its share of the gate grad
    carry = (dhk * hk).sum(-1) + (dhv * hv).sum(-1) if has_dht else None  # [NS, H, M]
    if cfg.whole:
        _whole_key_side(q, k, v, do, p, dz, dnk, dnv, g, b, dgate, chunks, chunk_seq, carry, dk_, dv_, dg, scale,
                        cfg)
    else:
        if carry is None:
            carry = torch.zeros(n_seq, heads, slots, **f32)
        ds = torch.empty(2, *g.shape, **f32)  # the K~ and V~ shares of the write weights' gradient
        for w, x, y, dn, dy, share, d, bd, db, sc in ((dz, q, k, dnk, dk_, ds[0], dk, cfg.BK, cfg.DBK, scale),
                                                      (p, do, v, dnv, dv_, ds[1], dv, cfg.BV, cfg.DBV, 1.0)):
            K._key_bwd_kernel[(n_sub, heads)](
                w, x, y, dn, g, b, sub, dy, share, sc, heads, slots, d,
                BT=BT, BC=BC, BM=cfg.BM, BD=bd, DB=db, SPAN=SPAN, **cfg.prec, num_warps=cfg.warps["key"])
        K._gate_grad_kernel[(n_seq * heads, cdiv(slots, GATE_SLOTS))](
            dgate, ds[0], ds[1], g, dg, carry, cu, heads, slots, BT=BT, BM=GATE_SLOTS, WHILE_LOOPS=WHILE_LOOPS,
            num_warps=4)
    if not has_h0:
        dh0k = dh0v = None
    return dq, dk_, dv_, dg, dh0k, dh0v


def _query_side(do, q, k, v, g, b, z, sk, sv, scale, chunks, sub, cfg):
    """The backward's query side: (dq, p, dz, dgate, dnk, dnv): the query gradient, the
    slot probabilities and the logits' gradient of every row, the query part of the gate
    gradient, and the gradients of the chunk-start states from each chunk's reads."""
    heads, dk = q.shape[1:]
    dv, slots = v.shape[-1], g.shape[-1]
    p, dz, dgate = torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)
    dq = torch.empty_like(q)
    dnk, dnv = torch.empty_like(sk), torch.empty_like(sv)
    if cfg.whole:  # one kernel writes the states' gradients from each chunk's reads too
        W._whole_query_bwd_kernel[(len(chunks), heads)](
            q, k, v, g, b, sk, sv, z, do, chunks, p, dz, dq, dgate, dnk, dnv, scale, heads, slots, dk, dv,
            BT=BT, BC=WHOLE_BC, BM=cfg.BM, BK=cfg.BK, BV=cfg.BV, SPAN=SPAN, **cfg.prec,
            num_warps=cfg.warps["query"])
        return dq, p, dz, dgate, dnk, dnv
    K._query_bwd_kernel[(len(sub), heads)](
        k, v, g, b, sk, sv, z, do, sub, p, dz, dq, dgate, scale, heads, slots, dk, dv,
        BT=BT, BC=BC, BM=cfg.BM, SPAN=SPAN, **cfg.blocks, **cfg.prec,
        num_warps=cfg.warps["query"])
    for w, x, dnext, d, bd, sc in ((dz, q, dnk, dk, cfg.BDK, scale), (p, do, dnv, dv, cfg.BDV, 1.0)):
        K._chunk_read_grad_kernel[(len(chunks), heads, cdiv(d, bd))](
            w, x, b, dnext, chunks, sc, heads, slots, d, BT=BT, BM=cfg.BM, BD=bd, PREC=cfg.prec["PREC_S"],
            num_warps=4)
    return dq, p, dz, dgate, dnk, dnv


def _whole_key_side(q, k, v, do, p, dz, dnk, dnv, g, b, dgate, chunks, chunk_seq, carry, dk, dv, dg, scale, cfg):
    """The key side of the backward on the whole-chunk kernels, and the log-gate gradient:
    one launch (dk, dv, each chunk's part of dg and its total), then one that adds to dg
    what the later chunks and the final state (carry [NS, H, M], or None) contribute."""
    n_chunks, heads, slots = len(chunks), g.shape[1], g.shape[2]
    totals = torch.empty(n_chunks, heads, slots, dtype=torch.float32, device=g.device)
    W._whole_key_bwd_kernel[(n_chunks, heads)](
        dz, q, k, dnk, p, do, v, dnv, g, b, dgate, chunks, dk, dv, dg, totals, scale, heads, slots, k.shape[-1],
        v.shape[-1], BT=BT, BC=WHOLE_BC, BM=cfg.BM, BK=cfg.BK, BV=cfg.BV, SPAN=SPAN, **cfg.prec,
        num_warps=cfg.warps["key"])
    # float64 prefix sums along the innermost axis (PyTorch's scan along the outer one is
    # slower); the kernel takes the difference at each chunk's sequence end
    before = totals.double().movedim(0, -1).cumsum(-1)  # [H, M, NC]: chunks up to c
    W._add_chunk_suffix_kernel[(n_chunks, heads)](dg, before, carry if carry is not None else before, chunks,
                                                  chunk_seq, heads, slots, *before.stride(),
                                                  HAS_CARRY=carry is not None, BT=BT, BM=cfg.BM, num_warps=4)


def _scan(bufs, gsum, inits, lasts, coff, dims, n_seq, heads, slots, *, reverse):
    """Run `_state_scan_kernel` on the K~ and V~ buffers together, [SCAN_ROWS, SCAN_COLS]
    tiles of each [M, d] state; inits / lasts are pairs or None."""
    cols = min(SCAN_COLS, next_pow2(max(dims)))
    tiles = [cdiv(slots, SCAN_ROWS) * cdiv(d, cols) for d in dims]
    K._state_scan_kernel[(n_seq * heads, sum(tiles))](
        *bufs, gsum, *(inits or bufs), *(lasts or bufs), coff, heads, slots, *dims, tiles[0],
        HAS_INIT=inits is not None, STORE_LAST=lasts is not None, REVERSE=int(reverse),
        BR=SCAN_ROWS, BD=cols, WHILE_LOOPS=WHILE_LOOPS, num_warps=4)


def _causal(q, k, v, g, initial_state, output_final_state, lengths, scale):
    """CS on [B, T, H, *] tensors whose B*T tokens hold sequences of `lengths`; q None:
    the final state only (o None)."""
    batch, length, heads, _ = k.shape
    h0k, h0v = (None, None) if initial_state is None else (s.float().contiguous() for s in initial_state)
    from .op import gsa_causal_op  # (op.py registers the custom operators around this module's passes)

    o, hk, hv = gsa_causal_op(
        *(None if x is None else x.contiguous().reshape(batch * length, heads, x.shape[-1]) for x in (q, k, v, g)),
        h0k, h0v, scale, list(lengths), output_final_state)
    o = None if q is None else o.reshape(batch, length, heads, -1)
    return o, (GsaState(hk, hv) if output_final_state else None)


def _reverse(x, lengths):
    """Each sequence reversed in time: x [B, T, ...] with B sequences of length T, or
    B = 1 holding the packed `lengths`."""
    if len(lengths) == x.shape[0]:
        return x.flip(1)
    idx = torch.cat([torch.arange(start + n - 1, start - 1, -1)
                     for start, n in zip(torch.tensor([0, *lengths]).cumsum(0).tolist(), lengths)])
    return x.index_select(1, idx.to(x.device))


def chunk_count(lengths) -> int:
    """The chunks of BT positions over packed sequences of these lengths."""
    return sum(cdiv(length, BT) for length in lengths)


def _both_directions(q, k, v, g, initial_state, output_final_state, lengths, scale):
    """NS's two causal scans, the right-to-left one from zeros: the left-to-right output, the
    right-to-left one (back in time order) and the left-to-right scan's final state (or
    None). Below NS_ONE_SCAN_PROGRAMS they run as one scan: each input beside its
    sequences reversed in time, one after the other (along the batch, or along the tokens
    when B = 1 packs several), so every kernel launch covers both directions."""
    if chunk_count(lengths) * q.shape[2] >= NS_ONE_SCAN_PROGRAMS:  # one direction's programs: chunks x heads
        forward, final = _causal(q, k, v, g, initial_state, output_final_state, lengths, scale)
        backward, _ = _causal(*(_reverse(x, lengths) for x in (q, k, v, g)), None, False, lengths, scale)
        return forward, _reverse(backward, lengths), final
    packed = len(lengths) != q.shape[0]
    dim = 1 if packed else 0
    both = [torch.cat([x, _reverse(x, lengths)], dim) for x in (q, k, v, g)]  # [2B, T, ...] or [1, 2N, ...]
    h0 = None if initial_state is None else tuple(torch.cat([s, torch.zeros_like(s)]) for s in initial_state)
    o, final = _causal(*both, h0, output_final_state, lengths + lengths, scale)
    forward, backward = o.chunk(2, dim)  # its backward is one op (a cat)
    backward = _reverse(backward, lengths)
    if final is not None:  # the states of the left-to-right sequences come first
        final = GsaState(*(s[:len(lengths)] for s in final))
    return forward, backward, final


def _pad_time(x, length):
    """x [B, T, ...] zero-padded to `length` positions (x itself when T = length)."""
    if x.shape[1] == length:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], length - x.shape[1], *x.shape[2:])], 1)


def _read_final(q, state, scale):
    """Every query reads one fixed state: q [B,n,H,dk] -> o [B,n,H,dv] in q's dtype."""
    o = read_state(q.float().transpose(1, 2), state[0], state[1], scale)
    return o.transpose(1, 2).to(q.dtype)


def _cross_as_one_scan(rows: int) -> bool:
    """The form of CC with a target longer than its source and of NC, whose scan would
    have `rows` rows x heads: one causal scan over padded positions, or a scan over the
    source (NC: writing the states only, no output kernel, no query side) and a read of
    the final state in PyTorch. The one scan issues fewer kernels and operators, and
    its extra GPU work (more positions scanned, NC's source positions read too) is
    hidden in an eager step of these sizes, which its host bounds. A compiled model takes
    the smaller GPU work, as larger scans do: the read form launches no more Triton
    kernels, Inductor fuses its PyTorch ops, and CUDA graphs (reduce-overhead) remove
    the host's cost per kernel altogether."""
    return not torch.compiler.is_compiling() and rows <= CROSS_ONE_SCAN_ROWS


def chunk_gsa_attn(q, k, v, log_alpha, *, causal=True, cross=False, scale=None, initial_state=None,
                   output_final_state=False, kv_mask=None, cu_seqlens=None):
    """`gsa_attn` on the Triton kernels (same arguments minus `backend`, validated there).

    Raises NotImplementedError for what these kernels do not cover: float64 inputs,
    head dims or slot counts above 256 (the dispatcher then falls back to PyTorch).
    """
    if q.dtype not in KERNEL_DTYPES:
        raise NotImplementedError(f"chunk_gsa_attn: dtype {q.dtype}; the Triton kernels take fp16, bf16, fp32")
    dk, dv, slots = q.shape[-1], v.shape[-1], log_alpha.shape[-1]
    if max(dk, dv, slots) > MAX_DIM:
        raise NotImplementedError(f"chunk_gsa_attn: dk={dk}, dv={dv}, slots={slots}; the Triton kernels "
                                  f"take each up to {MAX_DIM}")
    scale = dk ** -0.5 if scale is None else float(scale)
    g = log_alpha.float()
    if kv_mask is not None:  # a padded step: alpha = 1, s = 0
        g = g.masked_fill(~kv_mask[:, :, None, None], 0.0)
    batch, n, m = q.shape[0], q.shape[1], k.shape[1]
    lengths = cu_seqlens.diff().tolist() if cu_seqlens is not None else [m] * batch

    if not cross:
        if causal:
            o, final = _causal(q, k, v, g, initial_state, output_final_state, lengths, scale)
        else:  # NS: the mean of the two directions' outputs
            o, o_back, final = _both_directions(q, k, v, g, initial_state, output_final_state, lengths, scale)
            if o.dtype == torch.float16:  # a sum over 65,504 would overflow: the mean in fp32
                o = ((o.float() + o_back.float()) / 2).to(o.dtype)
            else:  # rounding the sum once and halving it exactly: the fp32 mean's bits, in
                o = (o + o_back) * 0.5  # 2 elementwise kernels forward and 1 backward
        if kv_mask is not None:
            o = o * kv_mask[:, :, None, None].to(o.dtype)
        return o, final

    heads = q.shape[2]
    if causal and (n <= m or _cross_as_one_scan(batch * n * heads)):
        # CC: query t reads the state after source position t, one scan over max(n, m)
        # positions: zero queries past the target's end (outputs dropped); past the source's
        # end, positions that write nothing (log alpha 0: alpha 1, write weight 0, as a
        # masked position), so the queries there read the final source state
        length = max(n, m)
        q, k, v, g = (_pad_time(x, length) for x in (q, k, v, g))
        o, final = _causal(q, k, v, g, initial_state, output_final_state, [length] * batch, scale)
        return o[:, :n], final
    if causal:  # CC with a longer target: queries past the source read its final state
        o, final = _causal(q[:, :m], k, v, g, initial_state, True, lengths, scale)
        o = torch.cat([o, _read_final(q[:, m:], final, scale)], 1)
        return o, (final if output_final_state else None)
    # NC: every query reads the final source state
    if _cross_as_one_scan(batch * (m + n) * heads):
        # the source, then the target: zero queries at the source's positions (outputs
        # dropped), and target positions that write nothing (log alpha 0, as masked
        # positions), so each query reads the final source state
        q = torch.cat([q.new_zeros(batch, m, *q.shape[2:]), q], 1)
        k, v, g = (_pad_time(x, m + n) for x in (k, v, g))
        o, final = _causal(q, k, v, g, initial_state, output_final_state, [m + n] * batch, scale)
        return o[:, m:], final
    # (the scan writes the states only; the queries read the final one in PyTorch)
    _, final = _causal(None, k, v, g, initial_state, True, lengths, scale)
    return _read_final(q, final, scale), (final if output_final_state else None)
