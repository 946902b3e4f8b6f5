"""LAVO Triton kernels (kernels/lavo/chunk*.py, recurrent.py) against the float64
token-loop reference.

On a CPU the kernels run under Triton's interpreter (conftest sets TRITON_INTERPRET=1), so
the shapes are tiny. Most cases use chunks of 16 positions so that a few dozen tokens
already span several chunks: the cross-chunk prefix sums (forward), suffix sums
(backward), multi-block windows and the grouping of query chunks in the memory backward are all
exercised. Tolerance (docs/design.md §2.5): fp32 inputs, max abs error <= 1e-4
of the reference tensor's max abs, for the output and every gradient.
"""

import pytest
import torch

from lavo_tasks.kernels import LavoDecodeState, lavo_attn, lavo_decode_step
from lavo_tasks.kernels.lavo import chunk, chunk_scan
from lavo_tasks.kernels.lavo.chunk import DQ_GROUP, chunk_lavo_attn, lavo_chunked
from lavo_tasks.kernels.lavo.recurrent import recurrent_lavo_step
from lavo_tasks.kernels.lavo.reference import reference_lavo_attn

GRAD_NAMES = ("q", "k", "v", "basis", "rel_bias", "mem_bias")


def make_inputs(batch, n, m, heads, dim, rank, window, causal, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n, heads, dim, generator=g)
    k = torch.randn(batch, m, heads, dim, generator=g)
    v = torch.randn(batch, m, heads, dim, generator=g)
    basis = torch.linalg.qr(torch.randn(heads, dim, rank, generator=g, dtype=torch.float64))[0].transpose(1, 2)
    rel_bias = 0.5 * torch.randn(heads, window if causal else window + 1, generator=g)
    mem_bias = 0.5 * torch.randn(heads, generator=g)
    return [q, k, v, basis.float().contiguous(), rel_bias, mem_bias]


def random_mask(batch, m, seed, keep_first):
    g = torch.Generator().manual_seed(seed + 1)
    mask = torch.rand(batch, m, generator=g) > 0.3
    if keep_first:
        mask[:, 0] = True
    return mask


def check_against_reference(run, inputs, compared=GRAD_NAMES, **options):
    """Run `run` (a Triton entry) and the reference on the same inputs (None: an absent
    rel_bias) and one random output gradient; compare the output and the gradients
    named in `compared`."""
    ours = [x.clone().requires_grad_() if x is not None else None for x in inputs]
    ref = [x.clone().double().requires_grad_() if x is not None else None for x in inputs]
    out = run(*ours, **options)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(99))
    out.backward(grad_out)
    ref_out = reference_lavo_attn(*ref, **options)
    ref_out.backward(grad_out.double())
    grads = [(f"d{name}", a.grad, b.grad) for name, a, b in zip(GRAD_NAMES, ours, ref) if name in compared]
    for name, got, want in [("output", out, ref_out)] + grads:
        assert got is not None and torch.isfinite(got).all(), name
        assert want.abs().max() > 0, f"{name}: the reference is all zeros, the case tests nothing"
        err = (got.double() - want).abs().max() / want.abs().max()
        assert err <= 1e-4, f"{name}: relative max error {err:.2e}"


def small_chunks(*args, **options):
    return lavo_chunked(*args, chunk=16, **options)


def options(window, causal=True, cross=False, kv_mask=None, cu_seqlens=None):
    return {"window": window, "causal": causal, "cross": cross, "segments": 1, "scale": None, "kv_mask": kv_mask,
            "cu_seqlens": cu_seqlens}


@pytest.mark.parametrize("n, window", [(40, 6), (37, 20), (33, 1), (50, 33), (45, 17)])
def test_causal_self_several_chunks(n, window):
    inputs = make_inputs(1, n, n, 2, 8, 4, window, True, seed=n)
    check_against_reference(small_chunks, inputs, **options(window))


def test_causal_self_padding_many_groups():
    # 3 sequences of 3 chunks: more query chunks than one memory-backward program takes
    batch, n = 3, 37
    assert batch * 3 > DQ_GROUP
    inputs = make_inputs(batch, n, n, 2, 16, 16, 20, True, seed=5)
    mask = random_mask(batch, n, seed=5, keep_first=False)
    check_against_reference(small_chunks, inputs, **options(20, kv_mask=mask))


@pytest.mark.parametrize("group", [1, 4])
def test_memory_backward_in_smaller_groups(monkeypatch, group):
    """Groups a GPU takes at small grids (_memory_group), against the reference: 9
    query chunks in groups of 1 and of 4 (the last of those partial)."""
    monkeypatch.setattr(chunk, "_memory_group", lambda chunks, per_group, device: group)
    batch, n = 3, 37
    inputs = make_inputs(batch, n, n, 2, 16, 16, 20, True, seed=5)
    mask = random_mask(batch, n, seed=5, keep_first=False)
    check_against_reference(small_chunks, inputs, **options(20, kv_mask=mask))


@pytest.mark.parametrize("chunks, per_group, expected", [
    (1024, 16, 8),  # the protocol shape (65,536 tokens, 16 heads): 2,048 programs of 8 chunks
    (256, 8, 4),  # a 4 x 4,096 source, 8 heads: 256 programs of 8 would fill less than 2 waves
    (64, 8, 1),  # 16 x 256 positions, 8 heads: 512 programs of 1 (64 of 8 before)
    (5, 1, 1),
])
def test_memory_backward_groups_fill_two_waves_of_the_sms(monkeypatch, chunks, per_group, expected):
    monkeypatch.setattr(chunk, "_sm_count", lambda index: 132)  # an H200
    assert chunk._memory_group(chunks, per_group, torch.device("cuda", 0)) == expected
    assert chunk._memory_group(chunks, per_group, torch.device("cpu")) == DQ_GROUP  # the interpreter's tests


@pytest.mark.parametrize("n", [9, 12])
def test_public_entry_odd_sizes(n):
    # the default chunk (one partial chunk), head dim 8, rank 4
    inputs = make_inputs(2, n, n, 2, 8, 4, 5, True, seed=n)
    check_against_reference(chunk_lavo_attn, inputs, **options(5))


def test_lavo_attn_dispatches_to_triton():
    inputs = make_inputs(1, 12, 12, 2, 8, 4, 4, True, seed=3)
    triton_out = lavo_attn(*inputs, window=4, backend="triton")
    torch_out = lavo_attn(*inputs, window=4, backend="torch")
    assert (triton_out - torch_out).abs().max() <= 1e-4 * torch_out.abs().max()


def test_packed_sequences():
    inputs = make_inputs(1, 40, 40, 2, 8, 4, 6, True, seed=7)
    cu_seqlens = torch.tensor([0, 9, 21, 40], dtype=torch.int32)
    check_against_reference(small_chunks, inputs, **options(6, cu_seqlens=cu_seqlens))


def test_packed_sequences_with_padding():
    inputs = make_inputs(1, 30, 30, 1, 8, 4, 4, True, seed=8)
    mask = random_mask(1, 30, seed=8, keep_first=True)
    cu_seqlens = torch.tensor([0, 17, 30], dtype=torch.int64)
    check_against_reference(small_chunks, inputs, **options(4, kv_mask=mask, cu_seqlens=cu_seqlens))


@pytest.mark.parametrize("masked, window", [(False, 8), (True, 8), (False, 32), (True, 34)])
def test_noncausal_self(masked, window):
    # window / 2 = 16 is exactly one chunk, 17 one more than a chunk
    n = 40
    inputs = make_inputs(1, n, n, 2, 8, 4, window, False, seed=11)
    mask = random_mask(1, n, seed=11, keep_first=False) if masked else None
    check_against_reference(small_chunks, inputs, **options(window, causal=False, kv_mask=mask))


@pytest.mark.parametrize(
    "causal, window, bounds, masked",
    [(False, 34, [0, 5, 29, 30, 70], False), (False, 34, [0, 5, 29, 30, 70], True),
     (True, 20, [0, 0, 33, 33, 80], True), (False, 8, [0, 0, 33, 33, 80], False)],
)
def test_packed_sequences_in_self_attention_window_tables(causal, window, bounds, masked):
    # the bias-tile path with sequences that start inside a chunk (NS query chunks before a
    # sequence's start), a one-token sequence and empty ones
    n = bounds[-1]
    inputs = make_inputs(1, n, n, 2, 8, 4, window, causal, seed=n + window)
    mask = random_mask(1, n, seed=window, keep_first=True) if masked else None
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32)
    check_against_reference(
        small_chunks, inputs, **options(window, causal=causal, kv_mask=mask, cu_seqlens=cu_seqlens)
    )


@pytest.mark.parametrize("causal, window, n", [(False, 66, 60), (True, 70, 40)])
def test_windows_past_two_chunks_and_past_the_sequence(causal, window, n):
    # NS with HALF = 33 > 2 chunks (KB0 = 3); CS with a window longer than the sequence
    # (KB0 = 5 key blocks before each of its 3 chunks, all of them before its start)
    inputs = make_inputs(2, n, n, 2, 8, 4, window, causal, seed=window)
    mask = random_mask(2, n, seed=n, keep_first=True)
    check_against_reference(small_chunks, inputs, **options(window, causal=causal, kv_mask=mask))


@pytest.mark.parametrize(
    "batch, n, m, masked, window",
    [(1, 45, 30, False, 6), (1, 20, 45, True, 6), (1, 70, 9, False, 6), (1, 60, 43, False, 17), (2, 45, 30, False, 6),
     (2, 20, 45, True, 6)],
)
def test_causal_cross(batch, n, m, masked, window):
    # target longer than the source: queries past it are anchored at the last position
    # (w = 17: the last window, keys 26..42, is not aligned to the chunks); batch 2:
    # query and key rows of the second sequence start at different offsets
    inputs = make_inputs(batch, n, m, 2, 8, 4, window, True, seed=n + m)
    mask = random_mask(batch, m, seed=n, keep_first=False) if masked else None
    check_against_reference(small_chunks, inputs, **options(window, cross=True, kv_mask=mask))


@pytest.mark.parametrize(
    "n, m, segments, per_segment_bias, masked",
    [(40, 23, 1, False, True), (12, 50, 1, True, False), (30, 37, 3, True, True), (20, 40, 2, False, False),
     (9, 5, 4, True, True)],
)
def test_noncausal_cross(n, m, segments, per_segment_bias, masked):
    # memory only, rel_bias=None (NC has no window); the last case has segments with
    # fewer valid keys than parts, so some memories are empty (h = 0)
    q, k, v, basis, _, mem_bias = make_inputs(2, n, m, 2, 8, 4, 4, False, seed=n + segments)
    mem_bias = torch.randn(2, segments) if per_segment_bias else mem_bias
    mask = random_mask(2, m, seed=m, keep_first=False) if masked else None
    inputs = [q, k, v, basis, None, mem_bias]
    ours = [x.clone().requires_grad_() if x is not None else None for x in inputs]
    ref = [x.clone().double().requires_grad_() if x is not None else None for x in inputs]
    opts = {**options(4, causal=False, cross=True, kv_mask=mask), "segments": segments}
    out = small_chunks(*ours, **opts)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(97))
    out.backward(grad_out)
    ref_out = reference_lavo_attn(*ref, **opts)
    ref_out.backward(grad_out.double())
    compared = ("q", "v", "basis", "mem_bias") if per_segment_bias and segments > 1 else ("q", "v", "basis")
    grads = [(f"d{name}", a.grad, b.grad) for name, a, b in zip(GRAD_NAMES, ours, ref) if name in compared]
    for name, got, want in [("output", out, ref_out)] + grads:
        err = (got.double() - want).abs().max() / want.abs().max()
        assert err <= 1e-4, f"{name}: relative max error {err:.2e}"
    assert ours[1].grad is not None and not ours[1].grad.any()  # the keys take no part in NC
    assert ours[5].grad.shape == mem_bias.shape
    if "mem_bias" not in compared:  # one bias on every slot cancels in the softmax: gradient 0 up to rounding
        assert ours[5].grad.abs().max() <= 1e-4 * ours[0].grad.abs().max()


def test_fp16_inputs_within_half_precision_tolerance():
    # the half-precision path (memory products on fp16 operands, fp32 accumulation);
    # the interpreter has no bf16 arithmetic, so bf16 is checked on the GPU (test_gpu_lavo.py)
    inputs = make_inputs(1, 40, 40, 2, 16, 8, 6, True, seed=21)
    ours = [x.clone().half().requires_grad_() if i < 3 else x.clone().requires_grad_() for i, x in enumerate(inputs)]
    ref = [x.detach().clone().double().requires_grad_() for x in ours]
    out = small_chunks(*ours, **options(6))
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(98)).half()
    out.backward(grad_out)
    ref_out = reference_lavo_attn(*ref, **options(6))
    ref_out.backward(grad_out.double())
    assert out.dtype == torch.float16
    pairs = [("output", out, ref_out)] + [(f"d{name}", a.grad, b.grad) for name, a, b in zip(GRAD_NAMES, ours, ref)]
    for name, got, want in pairs:
        err = (got.double() - want).norm() / want.norm()
        assert err <= 5e-3, f"{name}: relative RMS error {err:.2e}"


def test_head_dim_over_the_kernel_limit_is_refused():
    inputs = make_inputs(1, 8, 8, 1, 272, 4, 4, True, seed=0)
    with pytest.raises(NotImplementedError, match="head dim 272"):
        chunk_lavo_attn(*inputs, window=4)


@pytest.mark.parametrize("pattern", ["CS", "NS", "NC"])
def test_memory_in_several_rank_blocks(monkeypatch, pattern):
    # basis rows in blocks of 4 (64 on a GPU), rank 10 -> 3 blocks, the last one partial:
    # one online softmax across blocks (forward), per-block dB rows and summed dq / dv
    # parts (backward); masked, so that padded keys and queries are in every block
    monkeypatch.setattr(chunk, "RANK_BLOCK", 4)
    causal, cross = pattern == "CS", pattern == "NC"
    n, m = (37, 37) if not cross else (30, 41)
    inputs = make_inputs(2, n, m, 2, 12, 10, 8, causal, seed=len(pattern))
    mask = random_mask(2, m, seed=3, keep_first=True)
    opts = options(8, causal=causal, cross=cross, kv_mask=mask)
    compared = GRAD_NAMES
    if cross:  # memory only (the keys take no part), two segments with their own biases
        inputs[4], inputs[5] = None, torch.randn(2, 2)
        opts["segments"] = 2
        compared = ("q", "v", "basis", "mem_bias")
    check_against_reference(small_chunks, inputs, compared=compared, **opts)


@pytest.mark.parametrize("dim, rank, causal", [(256, 256, True), (160, 130, False)])
def test_wide_head_dims(dim, rank, causal):
    # the public entry: chunks of 32 for head dims over 128, rank blocks of 64
    inputs = make_inputs(1, 40, 40, 1, dim, rank, 12, causal, seed=dim)
    check_against_reference(chunk_lavo_attn, inputs, **options(12, causal=causal))


@pytest.mark.parametrize("causal", [True, False])
def test_head_dims_of_the_128_wide_tile(causal):
    # the public entry at head dims 65-128: dkv takes query tiles of C/4 rows
    # (LAUNCH["dkv_d128"]); CC with a target past the source covers its tail tiles
    assert [chunk.dkv_launch(d) is chunk.LAUNCH["dkv_d128"] for d in (64, 65, 100, 128, 129)] == [
        False, True, True, True, False]
    n, m = (150, 70) if causal else (90, 90)
    inputs = make_inputs(1, n, m, 1, 100, 16, 12, causal, seed=n)
    check_against_reference(chunk_lavo_attn, inputs, **options(12, causal=causal, cross=causal))


@pytest.mark.parametrize("window", [6, 1, 70])
def test_decode_steps_match_the_whole_sequence(window):
    # token by token through the Triton step == the reference on the whole sequence;
    # the state ends as the PyTorch step leaves it; a step leaves the state it was given as it was
    batch, n, heads, dim, rank = 2, 20, 2, 8, 4
    q, k, v, basis, rel_bias, mem_bias = make_inputs(batch, n, n, heads, dim, rank, window, True, seed=window)
    want = reference_lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=window).double()
    states = [LavoDecodeState.empty(batch, heads, dim, rank, window) for _ in range(2)]
    for t in range(n):
        step = [x[:, t] for x in (q, k, v)]
        before = [x.clone() for x in states[0][:3]]
        got, new = recurrent_lavo_step(*step, basis, rel_bias, mem_bias, states[0], window=window)
        assert all(torch.equal(x, y) for x, y in zip(states[0][:3], before)) and states[0].count == t
        states = [new, lavo_decode_step(*step, basis, rel_bias, mem_bias, states[1], window=window, backend="torch")[1]]
        err = (got.double() - want[:, t]).abs().max() / want[:, t].abs().max()
        assert err <= 1e-4, f"position {t}: relative max error {err:.2e}"
    triton_state, torch_state = states
    assert triton_state.count == torch_state.count == n
    torch.testing.assert_close(triton_state.mem_sum, torch_state.mem_sum, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(triton_state.keys, torch_state.keys, rtol=0, atol=0)
    torch.testing.assert_close(triton_state.values, torch_state.values, rtol=0, atol=0)


def test_chunk_range_sums_match_loops(monkeypatch):
    # the cross-chunk scans of chunk_scan.py against sums written out per chunk; tiles of 4
    # chunks, so that the 11-chunk sequence spans three and its carry crosses tiles; a
    # sequence with more query than key chunks, one with more key chunks, one empty
    monkeypatch.setattr(chunk_scan, "SCAN_ROWS", 4)
    spans = [(0, 11, 0, 11), (11, 6, 11, 2), (17, 1, 13, 9), (18, 0, 22, 3)]  # (q first, q chunks, k first, k chunks)
    seqs = torch.tensor(spans, dtype=torch.int32)
    g = torch.Generator().manual_seed(4)
    q_totals, k_totals = torch.randn(18, 2, 3, 5, generator=g), torch.randn(25, 2, 3, 5, generator=g)
    for suffix in (False, True):
        for total in (False, True):
            totals, out_rows = (q_totals, 25) if suffix else (k_totals, 18)
            got = torch.full((out_rows, 2, 3, 5), float("nan"))  # every row is some sequence's
            chunk_scan.chunk_range_sums(totals, seqs, got, 11, suffix=suffix, total=total)
            want = torch.zeros(out_rows, 2, 3, 5, dtype=torch.float64)
            for q_first, nq, k_first, nk in spans:
                in_first, n_in, out_first, n_out = (q_first, nq, k_first, nk) if suffix else (k_first, nk, q_first, nq)
                for c in range(n_out):
                    if total:
                        lo, hi = 0, n_in
                    elif suffix:  # the query chunks after key chunk c
                        lo, hi = min(c + 1, n_in), n_in
                    else:  # the key chunks before query chunk c
                        lo, hi = 0, min(c, n_in)
                    want[out_first + c] = totals[in_first + lo : in_first + hi].double().sum(0)
            err = (got.double() - want).abs().max() / want.abs().max()
            assert err <= 1e-6, f"suffix={suffix} total={total}: relative max error {err:.2e}"


@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("pattern", ["CC target longer", "NS masked", "CS window on a chunk boundary"])
def test_dkv_query_tiles_of_other_sizes(monkeypatch, pattern, split):
    # dkv SPLIT 1 (a gpu_profile variant; default 2) and 4: query tiles of C or C/4 rows,
    # whose bias-gradient diagonals (the pairs of triangles of `_dkv_table`, each tile's
    # own in CC) and tail tiles (queries past the source) differ from C/2
    monkeypatch.setitem(chunk.LAUNCH["dkv"], "SPLIT", split)
    if pattern.startswith("CS"):  # w - 1 = 16 = C: the last query chunk's lower triangle is in the window
        inputs = make_inputs(2, 50, 50, 2, 8, 4, 17, True, seed=split)
        check_against_reference(small_chunks, inputs, **options(17))
        return
    causal = pattern.startswith("CC")
    n, m, window = (45, 30, 6) if causal else (40, 40, 8)
    inputs = make_inputs(1, n, m, 2, 8, 4, window, causal, seed=n + m)
    mask = None if causal else random_mask(1, m, seed=n, keep_first=True)
    check_against_reference(small_chunks, inputs, **options(window, causal=causal, cross=causal, kv_mask=mask))


@pytest.mark.parametrize("masked", [False, True])
def test_cross_decode_step_matches_the_torch_path(masked):
    """One CC target position against a prepared source (cross_step.cross_lavo_step): the
    PyTorch path's output at positions inside the first window, past it, and past the
    source's end (the anchor stays at m - 1); a padded source leaves its padding out. The
    position as a 0-dim tensor gives the int's output bit for bit."""
    from lavo_tasks.kernels.lavo.cross_step import cross_lavo_step
    from lavo_tasks.kernels.lavo.decode import lavo_source
    from lavo_tasks.kernels.lavo.torch_path import torch_lavo_cross_decode

    batch, m, heads, dim, rank, window = 2, 40, 2, 16, 8, 12
    q, k, v, basis, rel_bias, mem_bias = make_inputs(batch, 1, m, heads, dim, rank, window, True, seed=4)
    mask = random_mask(batch, m, seed=4, keep_first=True) if masked else None
    source = lavo_source(k, v, basis, causal=True, kv_mask=mask)
    for position in (0, 5, 11, 12, 30, 39, 45):
        want = torch_lavo_cross_decode(q, source, basis, rel_bias, mem_bias, window=window, start=position, scale=None)
        got = cross_lavo_step(q, source, basis, rel_bias, mem_bias, window=window, start=position)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        on_device = cross_lavo_step(q, source, basis, rel_bias, mem_bias, window=window, start=torch.tensor(position))
        assert torch.equal(on_device, got)


def test_cross_decode_step_reads_a_source_broadcast_over_the_beam():
    """Beam search broadcasts one sequence's source over its hypotheses (stride 0 in the
    batch, generation.reorder): the step reads it in place and gives, row for row, what
    it gives for a dense copy of the same rows."""
    from lavo_tasks.kernels.lavo.cross_step import cross_lavo_step
    from lavo_tasks.kernels.lavo.decode import lavo_source

    beams, m, heads, dim, rank, window = 3, 30, 2, 16, 8, 12
    _, k, v, basis, rel_bias, mem_bias = make_inputs(1, 1, m, heads, dim, rank, window, True, seed=5)
    q = torch.randn(beams, 1, heads, dim, generator=torch.Generator().manual_seed(6))
    source = lavo_source(k, v, basis, causal=True, kv_mask=random_mask(1, m, seed=5, keep_first=True))
    broadcast = type(source)(*(t.expand(beams, *t.shape[1:]) if isinstance(t, torch.Tensor) else t for t in source))
    dense = type(source)(*(t.contiguous() if isinstance(t, torch.Tensor) else t for t in broadcast))
    assert broadcast.keys.stride(0) == 0 and broadcast.means.stride(0) == 0
    for position in (3, 20, 40):
        got = cross_lavo_step(q, broadcast, basis, rel_bias, mem_bias, window=window, start=position)
        want = cross_lavo_step(q, dense, basis, rel_bias, mem_bias, window=window, start=position)
        assert torch.equal(got, want), position
