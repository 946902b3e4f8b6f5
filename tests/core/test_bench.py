"""The kernel benchmark's softmax_default row: SDPA as a user calls it, no backend forced."""

import math

import torch

from lavo_tasks import bench


def test_softmax_default_is_causal_attention_by_hand():
    torch.manual_seed(0)
    fwd, (q, k, v) = bench.softmax_default_op(1, 5, torch.device("cpu"))
    out = fwd().float()
    qf, kf, vf = q.float(), k.float(), v.float()
    scores = qf @ kf.transpose(-1, -2) / math.sqrt(bench.HEAD_DIM)  # [B, H, T, T]
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    expected = scores.softmax(-1) @ vf
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)  # bf16 inputs and output
    assert "softmax_default" in bench.ALL_OPS and bench.OPS["softmax_default"] is bench.softmax_default_op
