"""LAVO decoding, checked and dispatched: `lavo_decode_step` (one causal-self token,
"triton": `recurrent.recurrent_lavo_step`, imported on first use; "torch":
`torch_path.torch_lavo_step`; the same fallback rule as `lavo_attn`), `lavo_prefill`
(the first positions at once), and the cross-attention decoding of a prepared source
(`lavo_source`, PyTorch ops; `lavo_cross_decode`, one CC position a call on Triton:
`cross_step.cross_lavo_step`). The states are in `state.py`.
"""

from ..backend import resolve_backend, run_triton
from .attn import lavo_attn
from .checks import check_lavo_step_args
from .state import LavoSource
from .torch_path import torch_lavo_cross_decode, torch_lavo_prefill_state, torch_lavo_source, torch_lavo_step


def lavo_decode_step(q, k, v, basis, rel_bias, mem_bias, state, *, window, scale=None, backend="auto"):
    """One CS token: q, k, v [B, H, d] -> (o [B, H, d], state), the output of
    `lavo_attn(..., causal=True, cross=False)` at position `state.count`.

    basis [H, r, d], rel_bias [H, window], mem_bias [H] (or [H, 1]). `state` (a
    `state.LavoDecodeState`) is left as it was; the state after the token is returned. Cost
    O((w + r) d) per head.
    """
    check_lavo_step_args(q, k, v, basis, rel_bias, mem_bias, state, window)
    run_torch = lambda: torch_lavo_step(q, k, v, basis, rel_bias, mem_bias, state, window=window, scale=scale)  # noqa: E731
    if resolve_backend(backend, q) == "triton":
        def run_kernel():  # checks what it covers before it touches the state
            from .recurrent import recurrent_lavo_step

            return recurrent_lavo_step(q, k, v, basis, rel_bias, mem_bias, state, window=window, scale=scale)

        return run_triton(backend, "lavo_decode_step", run_kernel, run_torch)
    return run_torch()


def lavo_prefill(q, k, v, basis, rel_bias, mem_bias, *, window, scale=None, backend="auto"):
    """The first T positions at once: q, k, v [B, T, H, d] -> (o [B, T, H, d], state), o
    from `lavo_attn` (CS) and `state` the LavoDecodeState after those T positions, as T
    calls of `lavo_decode_step` from an empty state would leave it."""
    o = lavo_attn(q, k, v, basis, rel_bias, mem_bias, window=window, scale=scale, backend=backend)
    return o, torch_lavo_prefill_state(k, v, basis, window=window)


def lavo_source(k, v, basis, *, causal, segments=1, kv_mask=None) -> LavoSource:
    """Prepare the source k, v [B, m, H, d] (kv_mask [B, m]) once: O(m r) memory sums."""
    return torch_lavo_source(k, v, basis, causal=causal, segments=segments, kv_mask=kv_mask)


def lavo_cross_decode(q, source: LavoSource, basis, rel_bias, mem_bias, *, window, start, scale=None,
                      backend="auto"):
    """Outputs of target positions start .. start+t-1 (q [B, t, H, d]) against a
    prepared source: what `lavo_attn(..., cross=True)` gives at those positions.

    CC: query p uses the window ending at p' = min(p, m-1) and the memory of j <= p'
    (cost O(t (w + r) d)); NC: the segment memories only (O(t S r d)). One CC position
    (t = 1, a decode step) runs on Triton (`cross_step.cross_lavo_step`, the same fallback
    rule as `lavo_attn`); the rest on PyTorch ops.
    """
    run_torch = lambda: torch_lavo_cross_decode(q, source, basis, rel_bias, mem_bias, window=window,  # noqa: E731
                                                start=start, scale=scale)
    if source.causal and q.shape[1] == 1 and resolve_backend(backend, q) == "triton":
        def run_kernel():
            from .cross_step import cross_lavo_step

            return cross_lavo_step(q, source, basis, rel_bias, mem_bias, window=window, start=start, scale=scale)

        return run_triton(backend, "lavo_cross_decode", run_kernel, run_torch)
    return run_torch()

