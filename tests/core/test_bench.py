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


def test_softmax_cc_is_top_left_causal_cross_attention_by_hand():
    """CC: target query t sees source positions <= t (the cross patterns' rule)."""
    torch.manual_seed(0)
    fwd, (q, k, v) = bench.softmax_default_op(1, 7, torch.device("cpu"), "CC")
    assert q.shape[2] == bench.CROSS_TARGET and k.shape[2] == 7
    scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(bench.HEAD_DIM)  # [B, H, 512, 7]
    seen = torch.arange(7)[None, :] <= torch.arange(bench.CROSS_TARGET)[:, None]
    expected = scores.masked_fill(~seen, float("-inf")).softmax(-1) @ v.float()
    torch.testing.assert_close(fwd().float(), expected, atol=2e-2, rtol=2e-2)


def test_every_pattern_builds_its_shapes():
    for pattern in bench.PATTERNS:
        for name in ("softmax", "lavo", "gsa"):
            fwd, leaves = bench.OPS[name](1, 16, torch.device("cpu"), pattern)
            out = fwd()
            queries = bench.CROSS_TARGET if pattern[1] == "C" else 16
            assert queries in out.shape and out.shape.numel() == queries * bench.HEADS * bench.HEAD_DIM, (name, pattern)
            out.float().sum().backward()
            missing = [i for i, t in enumerate(leaves) if t.grad is None]
            assert missing == ([1] if (name, pattern) == ("lavo", "NC") else []), (name, pattern)  # NC reads no keys
    assert bench.parse_args(["--patterns", "NS,NC"]).patterns == ["NS", "NC"]


def test_the_table_shows_the_graphed_time_where_it_was_measured():
    row = dict(kind="kernel", B=8, T=1024, fwd_ms=0.31, fwd_bwd_ms=1.06, peak_mib=40.0)
    rows = [dict(row, op="lavo", pattern="CC", graph_fwd_bwd_ms=0.42),
            dict(row, op="softmax", pattern="CC", graph_error="RuntimeError: capture failed")]
    lines = bench.markdown_table(rows).splitlines()
    assert lines[0] == "| pattern, B x T | lavo fwd / fwd+bwd [graphed] ms (peak MiB) | softmax fwd / fwd+bwd [graphed] ms (peak MiB) |"
    assert lines[2] == "| CC, 8 x 512 over 1024 | 0.31 / 1.06 [0.42] (40.00) | 0.31 / 1.06 [error] (40.00) |"
    without = bench.markdown_table([dict(row, op="lavo", pattern="CC")]).splitlines()[2]
    assert without == "| CC, 8 x 512 over 1024 | 0.31 / 1.06 (40.00) |"


def test_a_failed_capture_is_recorded_and_the_generators_are_put_back(monkeypatch):
    """The GPU calls replaced: do_bench returns fixed times, the capture raises. The row
    keeps the eager figures and names the error, and the random generators' states
    taken before the capture are put back (a failed capture leaves them unusable)."""
    import triton.testing

    from lavo_tasks import generation

    events = []

    class Saved:
        def __init__(self, generator):
            events.append("saved")

        def restore(self):
            events.append("restored")

    def capture(fn, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(generation, "RngStates", Saved)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kwargs: 2.5)
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", capture)
    for name in ("empty_cache", "synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 2**20)
    row = bench.measure(bench.softmax_op, 1, 16, torch.device("cpu"))
    assert row == {"fwd_ms": 2.5, "fwd_bwd_ms": 2.5, "peak_mib": 1.0,
                   "graph_error": "RuntimeError: operation not permitted when stream is capturing"}
    assert events == ["saved", "restored"]
