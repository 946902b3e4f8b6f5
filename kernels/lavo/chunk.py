"""LAVO on Triton: `chunk_lavo_attn`, the fused window-plus-memory attention with its backward.

The sequence is cut into chunks of C positions. Per chunk and head, the forward runs one
online softmax over the r memory logits and the window logits and saves the output and
the log-sum-exp (chunk_fwd.py); the backward recomputes the scores (chunk_bwd.py). What
crosses chunks is small and fp32: the sum of the values before each chunk (the memory's
cumulative sum, a value-space vector of d numbers: h = B vbar, so summing v is summing
c = B v) and, backward, the per-chunk totals of the memory gradient. Those prefix and
suffix sums over the chunk totals are one Triton scan per call (chunk_scan.py, with a
float64 carry). No n x n, n x w or n x r x d tensor is ever written.

Patterns: CS, CC, NS and NC. NC is the noncausal memory without a window (the window
loops run zero times), with `segments` memories: the valid source positions of a
sequence cut into S contiguous parts (reference.py's rule), S*r slots under one softmax.
"""

import functools
import math
from typing import NamedTuple

import torch

from ..common import KERNEL_DTYPES, MIN_DOT, cdiv, next_pow2, shape_cache, tile_width
from .chunk_bwd import lavo_delta_kernel, lavo_dkv_kernel, lavo_mem_bwd_kernel, lavo_mem_sums_kernel
from .chunk_fwd import chunk_value_sums_kernel, lavo_fwd_kernel
from .chunk_scan import chunk_range_sums

CHUNK = 64  # positions per chunk: query block = key block = memory chunk
WIDE_CHUNK = 32  # the chunk for head dims over 128, so that [chunk, dim] tiles fit in registers
DQ_GROUP = 8  # query chunks per program of the memory backward at most (one dB partial sum each)
WAVES = 2  # the memory backward takes fewer chunks a program while its grid fills fewer SM waves
DELTA_TILE = 4096  # elements of o per program of the Delta kernel
RANK_BLOCK = 64  # basis rows per step of the memory loops
MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634  # the kernels' logits are in log2 units
# Launch settings per kernel, the fastest correct variant timed by
# `benchmarks/lavo_gpu_profile.py --variants` at the protocol shape (docs/design.md §4): 4 warps
# (8 is 1.5-1.7x slower at d=64), ptxas's own register count, dkv query tiles of C/2 rows
# with their loads pipelined over 2 stages. Head dims 65-128 (a [64, 128] key chunk) take dkv
# query tiles of C/4 rows ("dkv_d128"): fewer live registers than C/2 (at this width the
# 4-warp dkv kernels use all 255 and spill), and the faster of the two in every pattern timed.
# The timings: docs/benchmarks.md, "Launch settings".
LAUNCH = {
    "fwd": dict(num_warps=4, num_stages=2),
    "mem_bwd": dict(num_warps=4, num_stages=2),
    "dkv": dict(num_warps=4, num_stages=2, SPLIT=2),
    "dkv_d128": dict(num_warps=4, num_stages=2, SPLIT=4),
    "mem_sums": dict(num_warps=8, num_stages=2),  # [C, d] fp32 sums of up to d=256 on chip; timed only in totals
}


def dkv_launch(head_dim: int) -> dict:
    """`lavo_dkv_kernel`'s launch settings for a head dim (LAUNCH's "dkv_d128" for 65-128)."""
    return LAUNCH["dkv_d128"] if 64 < head_dim <= 128 else LAUNCH["dkv"]


def chunk_lavo_attn(
    q, k, v, basis, rel_bias, mem_bias, *, window, causal=True, cross=False, segments=1, scale=None, kv_mask=None,
    cu_seqlens=None,
):
    """`lavo_attn` on the Triton kernels (same arguments, without `backend`; inputs are
    assumed checked by `checks.check_lavo_args`). Differentiable in q, k, v, basis,
    rel_bias and mem_bias."""
    return lavo_chunked(
        q, k, v, basis, rel_bias, mem_bias, window=window, causal=causal, cross=cross, segments=segments,
        scale=scale, kv_mask=kv_mask, cu_seqlens=cu_seqlens, chunk=CHUNK if q.shape[-1] <= 128 else WIDE_CHUNK,
    )


def lavo_chunked(
    q, k, v, basis, rel_bias, mem_bias, *, window, causal, cross, segments, scale, kv_mask, cu_seqlens, chunk
):
    """`chunk_lavo_attn` with the chunk size as an argument (the tests use small chunks
    so that short sequences still span several)."""
    if q.dtype not in KERNEL_DTYPES:
        raise NotImplementedError(f"q dtype {q.dtype}: the Triton kernels take float32, bfloat16 or float16")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise NotImplementedError(
            f"head dim {q.shape[-1]}: the LAVO Triton kernels take head dims up to {MAX_HEAD_DIM}; use backend='torch'"
        )
    rows = chunk // dkv_launch(q.shape[-1])["SPLIT"]
    if q.is_cuda and rows < MIN_DOT:  # Triton's compiled products
        raise ValueError(f"chunk {chunk} in dkv query tiles of {rows} rows: at least {MIN_DOT} on a GPU")
    if q.shape[0] * q.shape[1] == 0:
        return torch.zeros_like(q)
    # the kernels read q, k, v as one dtype; the ops take contiguous tensors (a strided
    # view such as the learned basis, a transposed slice, would otherwise reach the
    # backward op in whatever layout the compiler chose for it), except a basis in
    # another dtype than q's: the forward casts it into a contiguous copy, which the
    # backward reuses (a copy here would be a second one)
    k, v = (x if x.dtype == q.dtype else x.to(q.dtype) for x in (k, v))
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    basis = basis.contiguous() if basis.dtype == q.dtype else basis
    mem_bias = mem_bias.contiguous()
    rel_bias = rel_bias.contiguous() if rel_bias is not None else None
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    from .op import lavo_chunk_op  # (op.py registers the custom operators around this module's passes)

    return lavo_chunk_op(q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal, cross, segments,
                         scale, chunk)


class _Layout:
    """Chunk tables of the query and key chunks and the per-sequence table of the
    cross-chunk sums.

    Rows of a chunk table: (q_row0, n, kv_row0, m, c) int32; `qargs` / `kargs`: the
    arguments that name the query / key chunks to the kernels. `qseq`: each query chunk's
    sequence (an index into all sequences, empty ones too). `seqs`: per sequence, (first
    query chunk, query chunks, first key chunk, key chunks) int32, the table of
    chunk_scan.py; `longest`: the most chunks of one sequence, queries or keys."""

    def __init__(self, batch, n, m, cu_seqlens, chunk, noncausal, device):
        if cu_seqlens is None:
            seqs = [(b, b * n, n, b * m, m) for b in range(batch)]
        else:
            bounds = cu_seqlens.tolist()
            seqs = [(i, s, e - s, s, e - s) for i, (s, e) in enumerate(zip(bounds, bounds[1:])) if e > s]
        qrows, krows, qseq, spans = [], [], [], []
        for i, q0, ns, k0, ms in seqs:
            nqc, nkc = math.ceil(ns / chunk), math.ceil(ms / chunk)
            spans.append((len(qrows), nqc, len(krows), nkc))
            qrows += [(q0, ns, k0, ms, c) for c in range(nqc)]
            qseq += [i] * nqc
            krows += [(q0, ns, k0, ms, c) for c in range(nkc)]
        as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=device).reshape(len(x), -1)
        self.qchunks, self.kchunks, self.seqs = as_tensor(qrows), as_tensor(krows), as_tensor(spans)
        self.nq, self.nk = len(qrows), len(krows)  # the chunk counts as ints (len of a tensor goes through Python)
        self.noncausal = noncausal
        self.longest = max((max(nqc, nkc) for _, nqc, _, nkc in spans), default=0)
        self.qseq = torch.tensor(qseq, dtype=torch.long, device=device)
        # what the kernels take to name a chunk (chunk_common.load_chunk): the table and,
        # for equal-length sequences (`batched`), the chunks per sequence and the lengths
        self.batched = cu_seqlens is None
        lengths = (n, m) if self.batched else (0, 0)
        self.qargs = (self.qchunks, math.ceil(n / chunk) if self.batched else 0, *lengths)
        self.kargs = (self.kchunks, math.ceil(m / chunk) if self.batched else 0, *lengths)


@shape_cache(maxsize=64)
def _batched_layout(batch, n, m, chunk, noncausal, device):
    """The layout of equal-length sequences, built once per shape (host work off the hot path)."""
    return _Layout(batch, n, m, None, chunk, noncausal, device)


def _valid_counts(valid, cu_seqlens):
    """Per key row of valid [B, m] (bool): how many valid keys its sequence has up to and
    including it (int64, flat)."""
    if cu_seqlens is None:
        return valid.to(torch.int64).cumsum(1).reshape(-1)
    running = valid.reshape(-1).to(torch.int64).cumsum(0)  # over all packed sequences
    bounds = cu_seqlens.to(device=valid.device, dtype=torch.int64)
    before = torch.cat([running.new_zeros(1), running])[bounds[:-1]]  # valid keys before each sequence
    # output_size: the result's length known on the host, so no sync to read the repeats' sum
    return running - before.repeat_interleave(bounds.diff(), output_size=running.numel())


def _segment_tables(valid, cu_seqlens, layout, segments):
    """Noncausal memories: each key row's segment (the k-th valid key of a sequence with
    n valid keys is in segment floor(k * S / n)) and each query chunk's per-segment
    valid counts [query chunks, S] (fp32)."""
    batch, m = valid.shape
    if cu_seqlens is None:
        lengths = torch.full((batch,), m, device=valid.device)
    else:
        lengths = cu_seqlens.to(device=valid.device, dtype=torch.int64).diff()
    # each key row's sequence; output_size (all rows) spares the sync on the repeats' sum
    seq_of_row = torch.arange(len(lengths), device=valid.device).repeat_interleave(lengths, output_size=valid.numel())
    flat = valid.reshape(-1).to(torch.int64)
    n_valid = torch.zeros(len(lengths), dtype=torch.int64, device=valid.device).index_add_(0, seq_of_row, flat)
    rank = (_valid_counts(valid, cu_seqlens) - 1).clamp(min=0)
    segment = rank * segments // n_valid[seq_of_row].clamp(min=1)
    counts = torch.zeros(len(lengths) * segments, device=valid.device)
    counts.index_add_(0, seq_of_row * segments + segment, flat.float())
    return segment.to(torch.int32), counts.view(-1, segments)[layout.qseq].contiguous()


def _masked_segment_tables(kv_mask, segments, chunks_per_seq):
    """`_segment_tables` of equal-length sequences with a kv_mask [B, m] (bool), from the
    valid counts alone: the k-th valid key (from 0) of a row with N valid keys is in
    segment floor(k S / N), so segment s holds ceil((s + 1) N / S) - ceil(s N / S) of
    them. -> (each key row's segment [B * m] int32, or None with one segment (every key
    in it); each query chunk's per-segment counts [B * chunks_per_seq, S] fp32). No
    value is read back on the host."""
    batch = kv_mask.shape[0]
    if segments == 1:
        counts = kv_mask.sum(1, keepdim=True, dtype=torch.float32)  # [B, 1]
        return None, counts.expand(batch, chunks_per_seq).reshape(-1, 1).contiguous()  # (a view with stride 0 at B = 1)
    so_far = kv_mask.cumsum(1)  # [B, m] int64: valid keys up to and including each
    n_valid = so_far[:, -1:]  # [B, 1]
    segid = ((so_far - 1).clamp_(min=0) * segments).div_(n_valid.clamp(min=1), rounding_mode="floor")
    edges = torch.arange(segments + 1, device=kv_mask.device) * n_valid  # [B, S + 1]: s N
    edges = (edges + (segments - 1)).div_(segments, rounding_mode="floor")  # ceil(s N / S)
    counts = (edges[:, 1:] - edges[:, :-1]).float()  # [B, S]
    counts = counts[:, None, :].expand(batch, chunks_per_seq, segments).reshape(-1, segments).contiguous()
    return segid.to(torch.int32).view(-1), counts


@shape_cache(maxsize=64)
def _unmasked_segment_tables(batch, n, m, chunk, segments, device):
    """`_segment_tables` of equal-length sequences without a mask, built once per shape:
    they depend on the shape alone, and the ~20 small ops that build them would otherwise
    run in every forward and backward (NC's host time). The kernels only read them."""
    layout = _batched_layout(batch, n, m, chunk, True, device)
    return _segment_tables(torch.ones(batch, m, dtype=torch.bool, device=device), None, layout, segments)


def _window_blocks(window, chunk, noncausal, cross):
    """(KB0, NKB, NQB, QB0, HALF) of the window loops (`_compile_args`)."""
    half = window // 2 if noncausal else 0
    # key blocks a query chunk's windows touch (NKB) and query blocks a key chunk's keys
    # are seen by (NQB), the same count; CC chunks past the source see the last w keys,
    # which touch at most as many blocks as an aligned causal window. Self-attention: KB0
    # of a query chunk's key blocks come before it, the key chunk's queries start QB0
    # chunks before it (0 causal)
    if noncausal:
        kb0 = cdiv(half, chunk)
        nkb = nqb = 0 if cross else 2 * kb0 + 1
        qb0 = kb0
    else:
        kb0 = cdiv(window - 1, chunk)
        nkb = kb0 + 1
        nqb = (window + chunk - 2) // chunk + 1
        qb0 = 0
    assert nqb == nkb, (nqb, nkb)  # dkv's query chunk b uses the forward's bias tile NKB - 1 - b
    return kb0, nkb, nqb, qb0, half


@functools.lru_cache(maxsize=256)
def _compile_args(dtype, d, rank, chunk, noncausal, window, has_mask, cross):
    """The kernels' compile-time arguments (a dict the callers only read)."""
    rank_block = min(tile_width(rank), RANK_BLOCK)
    kb0, nkb, nqb, qb0, half = _window_blocks(window, chunk, noncausal, cross)
    # the lower triangle of a key chunk's last query chunk lies in the window (LAST)
    # exactly when (w - 1) % C == 0 (causal) or HALF % C == 0 (noncausal) (chunk_bwd._dkv_table)
    bias_entries = window + 1 if noncausal else window
    return dict(
        D=d, BD=tile_width(d), RB=rank_block, NRB=cdiv(rank, rank_block), C=chunk, WINDOW=window,
        NS=noncausal, HALF=half, NKB=nkb, NQB=nqb, KB0=kb0, QB0=qb0, LAST=(nqb - 1 - qb0) * chunk + half < bias_entries,
        TABLE=not cross, HAS_MASK=has_mask, QMASK=has_mask and not cross,
        PREC="ieee" if dtype == torch.float32 else "tf32",
    )


@shape_cache(maxsize=16)
def _bias_index(chunk, nkb, kb0, half, entries, device):
    """Per window tile b, query row i and key jj of a self-attention query chunk (key
    block c - KB0 + b): the index into rel_bias, (KB0 - b) * C + i - jj (+ HALF
    noncausal), clamped, and whether it lies in the window -> two [NKB, C, C] tensors."""
    b, i, jj = (torch.arange(size, device=device) for size in (nkb, chunk, chunk))
    idx = (kb0 - b)[:, None, None] * chunk + i[None, :, None] - jj[None, None, :] + half
    inside = (idx >= 0) & (idx < entries)
    return idx.clamp(0, entries - 1), inside


def _window_bias_tiles(rho, meta):
    """The bias tiles of a self-attention query chunk's window (chunk_common.table_logits):
    rel_bias [H, entries] fp32 -> [H * NKB, C, C] fp32 in log2 units, -inf outside the window."""
    idx, inside = _bias_index(meta["C"], meta["NKB"], meta["KB0"], meta["HALF"], rho.shape[1], rho.device)
    tiles = torch.where(inside, rho[:, idx] * LOG2E, float("-inf"))  # [H, NKB, C, C]
    return tiles.reshape(-1, meta["C"], meta["C"])


class _Prepared(NamedTuple):
    """What the forward and the backward kernels read besides q, k, v and o: the chunk
    layout, the compile-time arguments, the parameters in the kernels' layouts and the
    tables. The forward builds it; the backward takes the forward's tables (`Saved`)
    and rebuilds only what costs no launch."""

    layout: _Layout
    meta: dict
    bas: torch.Tensor  # [H, r, d] in q's dtype
    rho: torch.Tensor  # [H, entries] fp32 (a placeholder for NC without rel_bias)
    mu: torch.Tensor  # [H, S] (or [H] with S = 1) fp32
    kvm: torch.Tensor  # kv_mask's bytes [B, m] uint8, or a placeholder
    cnt: torch.Tensor  # valid counts: per key row (causal, masked), per query chunk and segment (noncausal)
    segid: torch.Tensor  # each key row's segment (noncausal, read with S > 1 only)
    tables: torch.Tensor  # the window's bias tiles (self-attention) or a placeholder


class Saved(NamedTuple):
    """The forward's tables that its op returns besides o and lse, for the backward to
    read instead of building them again: `pre`, the value sums before each query chunk
    [query chunk rows, S, H, d] fp32 (two launches), the tables made from the data
    (`cnt`, `segid` of a kv_mask; `tiles` of rel_bias) and `bas`, the basis cast to the
    inputs' dtype. One that the backward finds without work (a per-shape cache, a
    placeholder, the basis in its dtype already) or that depends on cu_seqlens's values
    is an empty [0] tensor here. Their shapes: `saved_shapes`."""

    pre: torch.Tensor
    cnt: torch.Tensor
    segid: torch.Tensor
    tiles: torch.Tensor
    bas: torch.Tensor


def saved_shapes(q, k, basis, kv_mask, cu_seqlens, window, causal, cross, segments, chunk):
    """The (shape, dtype) of each of `Saved`'s tensors, from the arguments' shapes and
    dtypes alone (fake tensors and symbolic sizes too: the op's fake implementation)."""
    batch, n, heads, d = q.shape
    m = k.shape[1]
    query_chunks = cdiv(n, chunk)
    packed = cu_seqlens is not None
    # packed sequences: at most one partial chunk per sequence past the whole ones
    pre_rows = query_chunks + cu_seqlens.shape[0] - 1 if packed else batch * query_chunks
    keeps_cnt, keeps_segid = _saved_tables(causal, kv_mask is not None, packed, segments)
    cnt = ((batch * m,) if causal else (batch * query_chunks, segments)) if keeps_cnt else (0,)
    tiles = (heads * _window_blocks(window, chunk, not causal, cross)[1], chunk, chunk) if not cross else (0,)
    f32 = torch.float32
    return Saved(
        ((pre_rows, segments, heads, d), f32), (cnt, f32), ((batch * m,) if keeps_segid else (0,), torch.int32),
        (tiles, f32), (tuple(basis.shape) if basis.dtype != q.dtype else (0,), q.dtype),
    )


def _saved_tables(causal, has_mask, packed, segments):
    """Whether the forward hands its counts and its segment ids to the backward: those
    made from a kv_mask, except for packed noncausal sequences, whose per-chunk counts
    have as many rows as cu_seqlens's values make chunks (the backward builds them
    again, as it builds their layout)."""
    cnt = has_mask and (causal or not packed)
    return cnt, cnt and not causal and segments > 1


def _prepare(q, k, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal, cross, segments, chunk,
             saved=None):
    """The `_Prepared` of one call. With `saved` (the backward), the tables the forward
    handed over are taken from it."""
    batch, n, heads, d = q.shape
    m = k.shape[1]
    noncausal = not causal
    packed = cu_seqlens is not None
    if packed:
        layout = _Layout(batch, n, m, cu_seqlens, chunk, noncausal, q.device)
    else:
        layout = _batched_layout(batch, n, m, chunk, noncausal, q.device)
    # the memory products take the basis in the inputs' dtype (fp32 accumulation)
    if basis.dtype == q.dtype:
        bas = basis.contiguous()
    else:
        bas = saved.bas if saved is not None else basis.to(q.dtype, memory_format=torch.contiguous_format)
    # NC has no window and may come without rel_bias: a placeholder the kernels never read
    if rel_bias is None:
        rho = torch.empty(heads, 1, dtype=torch.float32, device=q.device)
    else:
        rho = (rel_bias if rel_bias.dtype == torch.float32 else rel_bias.float()).contiguous()
    mu = (mem_bias if mem_bias.dtype == torch.float32 else mem_bias.float()).contiguous()  # [H, S] or [H]
    if mu.dim() == 1 and segments > 1:  # one bias shared by the segments
        mu = mu[:, None].expand(heads, segments).contiguous()
    kvm = kv_mask.contiguous().view(torch.uint8) if kv_mask is not None else q
    meta = _compile_args(q.dtype, d, basis.shape[1], chunk, noncausal, window, kv_mask is not None, cross)

    keeps_cnt, keeps_segid = _saved_tables(causal, kv_mask is not None, packed, segments)
    cnt = segid = rho  # placeholders: causal counts are t' + 1; segments read with S > 1 only
    if saved is not None and keeps_cnt:
        cnt = saved.cnt
        segid = saved.segid if keeps_segid else rho
    elif noncausal and kv_mask is None and not packed:  # the same for every call of the shape
        segid, cnt = _unmasked_segment_tables(batch, n, m, chunk, segments, q.device)
    elif noncausal and not packed:
        segid, cnt = _masked_segment_tables(kv_mask, segments, cdiv(n, chunk))
        segid = rho if segid is None else segid
    elif noncausal:  # packed: counts per query chunk of each sequence
        valid = kv_mask if kv_mask is not None else torch.ones(batch, m, dtype=torch.bool, device=q.device)
        segid, cnt = _segment_tables(valid, cu_seqlens, layout, segments)
    elif kv_mask is not None:  # counts per key row
        cnt = kv_mask.cumsum(1, dtype=torch.float32).view(-1) if not packed else _valid_counts(kv_mask, cu_seqlens).float()
    if not meta["TABLE"]:
        tables = rho  # placeholder: CC and NC take no bias tiles
    elif saved is not None:
        tables = saved.tiles
    else:
        tables = _window_bias_tiles(rho, meta)
    return _Prepared(layout, meta, bas, rho, mu, kvm, cnt, segid, tables)


def lavo_chunk_forward(q, k, v, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal, cross, segments,
                       scale, chunk):
    """The forward kernels: q [B, T, H, d], k, v [B, S, H, d] in q's dtype, contiguous ->
    (o [B, T, H, d], lse [B*T, H] fp32, the log-sum-exp the backward reads, and the
    tables of `Saved`)."""
    batch, n, heads, d = q.shape
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # (no copy: the caller's are)
    p = _prepare(q, k, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal, cross, segments, chunk)
    layout = p.layout
    shapes = saved_shapes(q, k, basis, kv_mask, cu_seqlens, window, causal, cross, segments, chunk)
    f32 = dict(dtype=torch.float32, device=q.device)
    sums = torch.empty(layout.nk, segments, heads, d, **f32)
    chunk_value_sums_kernel[(layout.nk, heads)](
        v, p.kvm, p.segid, sums, *layout.kargs, heads, D=d, BD=p.meta["BD"], C=chunk, SEG=segments,
        HAS_MASK=p.meta["HAS_MASK"], BATCHED=layout.batched,
    )
    pre = torch.empty(shapes.pre[0], **f32)  # rows past the query chunks (packed sequences) stay unread
    chunk_range_sums(sums, layout.seqs, pre, layout.longest, suffix=False, total=layout.noncausal)
    o = torch.empty_like(q)
    lse = torch.empty(batch * n, heads, **f32)
    lavo_fwd_kernel[(layout.nq, heads)](
        q, k, v, p.bas, p.rho, p.tables, p.mu, pre, p.cnt, p.kvm, o, lse, *layout.qargs,
        heads, p.rho.shape[1], scale, R=basis.shape[1], SEG=segments, BATCHED=layout.batched,
        **_pick(p.meta, _FWD_META), **LAUNCH["fwd"],
    )
    kept = [x if shape != (0,) else torch.empty(0, dtype=dtype, device=q.device)
            for x, (shape, dtype) in zip((p.cnt, p.segid, p.tables, p.bas), shapes[1:])]
    return o, lse, Saved(pre, *kept)


def lavo_chunk_backward(do, q, k, v, o, lse, saved, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal,
                        cross, segments, scale, chunk):
    """The backward kernels: the gradients (dq, dk, dv, dbasis, drel_bias or None, dmem_bias)
    of the forward's inputs, each in its input's dtype (dk, dv in q's); `saved` is the
    forward's `Saved`."""
    q, k, v, o, do = q.contiguous(), k.contiguous(), v.contiguous(), o.contiguous(), do.contiguous()
    p = _prepare(q, k, basis, rel_bias, mem_bias, kv_mask, cu_seqlens, window, causal, cross, segments, chunk,
                 saved=saved)
    layout, meta = p.layout, p.meta
    n, heads, d = q.shape[1:]
    m, rank = k.shape[1], basis.shape[1]
    nq = layout.nq
    f32 = dict(dtype=torch.float32, device=q.device)
    nrb = meta["NRB"]
    group = _memory_group(nq, heads * nrb, q.device)
    groups = cdiv(nq, group)
    dq_mem = torch.empty(q.shape, **f32)
    delta = torch.empty_like(lse)  # [rows, H]
    block = DELTA_TILE // meta["BD"]  # (row, head) pairs per program
    lavo_delta_kernel[(cdiv(delta.numel(), block),)](o, do, delta, delta.numel(), D=d, BD=meta["BD"], BLOCK=block)
    db_part = torch.empty(groups, heads, rank, d, **f32)
    dmu_part = torch.empty(groups, nrb, heads, segments, **f32)
    # the memory's in-chunk value gradients (causal only): rows past the queries' chunks
    # are never written, and dkv reads rows j < n only
    dvl = torch.empty(k.shape, **f32) if causal else dq_mem
    wsum = torch.empty(nq, segments, heads, d, **f32)
    common = dict(_pick(meta, ("D", "BD", "RB", "NRB", "C", "NS", "HAS_MASK", "QMASK", "PREC")), BATCHED=layout.batched)
    lavo_mem_bwd_kernel[(groups, heads, nrb)](
        q, v, do, lse, delta, p.bas, p.mu, saved.pre, p.cnt, p.kvm, *layout.qargs, dq_mem, db_part, dmu_part, dvl,
        wsum, heads, nq, scale, R=rank, GROUP=group, SEG=segments, BS=max(2, next_pow2(segments)),
        **common, **LAUNCH["mem_bwd"],
    )
    if nrb > 1:  # the sums over the rank blocks: memory dq, value-gradient parts
        lavo_mem_sums_kernel[(groups, heads)](
            q, v, do, lse, delta, p.bas, p.mu, saved.pre, p.cnt, p.kvm, *layout.qargs, dq_mem, dvl, wsum,
            heads, nq, scale, R=rank, GROUP=group, SEG=segments, **common, **LAUNCH["mem_sums"],
        )
    # the window's bias gradient, added by atomics (NC has no window: nothing to add)
    drho = torch.zeros_like(p.rho) if rel_bias is not None else p.rho
    suf = torch.empty(layout.nk, segments, heads, d, **f32)
    chunk_range_sums(wsum, layout.seqs, suf, layout.longest, suffix=True, total=layout.noncausal)
    # CC, target longer than the source: query blocks past the source (a power of 2,
    # so that few lengths compile their own kernel)
    tail = next_pow2(cdiv(n - m, meta["C"]) + 1) if n > m and meta["NKB"] else 0
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    lavo_dkv_kernel[(layout.nk, heads)](
        q, k, v, do, lse, delta, p.rho, p.tables, p.kvm, p.segid, *layout.kargs, dvl, suf, dq_mem, drho, dk, dv,
        heads, p.rho.shape[1], scale, TAIL=tail, SEG=segments, BATCHED=layout.batched, **_pick(meta, _DKV_META),
        **dkv_launch(d),
    )
    dq = _cast(dq_mem, q.dtype)  # the memory's dq (mem_bwd) plus the window's (dkv)
    dmu = dmu_part.sum((0, 1) if mem_bias.dim() == 2 else (0, 1, 3))  # [H, S], or [H]: one bias for all segments
    drel = _cast(drho, rel_bias.dtype) if rel_bias is not None else None
    return dq, dk, dv, _cast(db_part.sum(0), basis.dtype), drel, _cast(dmu, mem_bias.dtype)


def _memory_group(chunks: int, per_group: int, device: torch.device) -> int:
    """Query chunks per program of the memory backward, whose grid has `per_group`
    programs (heads x rank blocks) per group of chunks: DQ_GROUP, halved while the grid
    would hold fewer than WAVES programs per SM. Each program runs its chunks one after
    another, so at a few thousand tokens (16 sequences of 256 positions, 8 heads: 64
    programs of 8 chunks on 132 SMs) the whole grid waited on them. Powers of 2, so at
    most 4 variants compile. On the CPU (Triton's interpreter) DQ_GROUP, which keeps the
    tests on groups that end past the last chunk (the smaller groups are tested by
    patching this function)."""
    if device.type != "cuda":
        return DQ_GROUP
    slots = WAVES * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    group = DQ_GROUP
    while group > 1 and cdiv(chunks, group) * per_group < slots:
        group //= 2
    return group


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _cast(x, dtype):
    """x in dtype, with no op when it already is."""
    return x if x.dtype == dtype else x.to(dtype)


# compile-time arguments of the forward and dkv kernels
_FWD_META = ("D", "BD", "RB", "NRB", "C", "WINDOW", "NKB", "KB0", "NS", "HALF", "TABLE", "HAS_MASK", "QMASK", "PREC")
_DKV_META = ("D", "BD", "C", "WINDOW", "NQB", "QB0", "LAST", "NS", "HALF", "TABLE", "HAS_MASK", "QMASK", "PREC")


def _pick(meta, keys):
    return {key: meta[key] for key in keys}
