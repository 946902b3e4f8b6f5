"""The host-side tables of the LAVO Triton path (kernels/lavo/chunk.py) against Python
loops over the keys. No kernel runs here."""

import pytest
import torch

from lavo_tasks.kernels.lavo import chunk


def loop_segment_tables(mask, segments, chunks_per_seq):
    """The rule of reference.py, key by key: the k-th valid key (from 0) of a row with N
    valid keys is in segment k * S // N. -> (per row, {key index: segment} of the valid
    keys; per query chunk, the valid keys of each segment)."""
    segment_of, counts = [], []
    for row in mask.tolist():
        n_valid = sum(row)
        found, per_segment, k = {}, [0] * segments, 0
        for j, valid in enumerate(row):
            if valid:
                found[j] = k * segments // n_valid
                per_segment[found[j]] += 1
                k += 1
        segment_of.append(found)
        counts += [per_segment] * chunks_per_seq
    return segment_of, counts


def masks():
    g = torch.Generator().manual_seed(0)
    random = torch.rand(5, 23, generator=g) > 0.4
    random[1] = False  # no valid key
    random[2] = True  # all valid
    random[3] = False
    random[3, [4, 17]] = True  # fewer valid keys than segments: some segments empty
    return random


@pytest.mark.parametrize("segments", [2, 3, 4, 7])
def test_masked_segment_tables_match_a_loop(segments):
    mask = masks()
    batch, m = mask.shape
    segid, counts = chunk._masked_segment_tables(mask, segments, chunks_per_seq=3)
    want_segments, want_counts = loop_segment_tables(mask, segments, 3)
    assert segid.dtype == torch.int32 and segid.shape == (batch * m,)
    got = segid.view(batch, m)
    for b in range(batch):  # a key that is padding has no segment the kernels read
        assert {j: int(got[b, j]) for j in want_segments[b]} == want_segments[b], b
    assert counts.dtype == torch.float32 and counts.is_contiguous()  # the kernels index it flat
    assert counts.tolist() == want_counts


@pytest.mark.parametrize("rows", [1, 5])
def test_masked_segment_tables_one_segment(rows):
    mask = masks()[:rows]
    segid, counts = chunk._masked_segment_tables(mask, 1, chunks_per_seq=2)
    assert segid is None  # every valid key in segment 0, which the kernels never read
    assert counts.is_contiguous()  # (one row: not the stride-0 view an expand would give)
    assert counts.tolist() == loop_segment_tables(mask, 1, 2)[1]


def test_masked_segment_tables_one_row_several_segments():
    mask = masks()[2:3]
    segid, counts = chunk._masked_segment_tables(mask, 3, chunks_per_seq=4)
    assert counts.is_contiguous()
    assert counts.tolist() == loop_segment_tables(mask, 3, 4)[1]


@pytest.mark.parametrize("segments", [1, 3])
def test_masked_segment_tables_equal_the_general_ones(segments):
    """The same tensors as `_segment_tables`, the general rule (packed sequences too),
    every entry (padding keys' segments included)."""
    mask = masks()
    batch, m = mask.shape
    layout = chunk._Layout(batch, 40, m, None, 16, True, mask.device)  # 3 query chunks a row
    want_segid, want_counts = chunk._segment_tables(mask, None, layout, segments)
    segid, counts = chunk._masked_segment_tables(mask, segments, chunks_per_seq=3)
    assert torch.equal(counts, want_counts)
    if segments > 1:
        assert torch.equal(segid, want_segid)
