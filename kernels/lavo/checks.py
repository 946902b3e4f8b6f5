"""Argument checks shared by every LAVO implementation (PyTorch path, reference, Triton),
for whole sequences (`check_lavo_args`) and for one decode step (`check_lavo_step_args`).

`lavo_attn` runs them once before it dispatches, so the implementations behind it may
assume well-formed inputs. Each message names the argument, its value and what is allowed.
"""

import torch


def pattern_name(causal: bool, cross: bool) -> str:
    """CS, NS, CC or NC (the CAB benchmark's names, docs/design.md §2)."""
    return ("C" if causal else "N") + ("C" if cross else "S")


def check_lavo_args(q, k, v, basis, rel_bias, mem_bias, *, window, causal, cross, segments, scale, kv_mask, cu_seqlens):
    """Raise ValueError for any argument `lavo_attn` cannot run with."""
    pattern = pattern_name(causal, cross)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise ValueError(f"{name}: expected a floating tensor [batch, time, heads, dim], got {_describe(x)}")
    batch, n, heads, dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)}: must have the same shape")
    if k.shape[0] != batch or k.shape[2] != heads or k.shape[3] != dim:
        raise ValueError(f"k {tuple(k.shape)}: batch, heads and dim must match q {tuple(q.shape)}")
    if not cross and k.shape[1] != n:
        raise ValueError(f"k {tuple(k.shape)}: self-attention (cross=False) needs as many keys as queries {tuple(q.shape)}")
    m = k.shape[1]
    if cross and m < 1:
        raise ValueError(f"k {tuple(k.shape)}: cross-attention needs a source of at least one position")

    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: must be an integer >= 1")
    if pattern == "NS" and window % 2:
        raise ValueError(f"window={window}: noncausal self-attention needs an even window (|t - j| <= window / 2)")
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"segments={segments!r}: must be an integer >= 1")
    if segments > 1 and pattern != "NC":
        raise ValueError(f"segments={segments}: only noncausal cross-attention (NC) cuts the source into segments; {pattern} needs 1")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise ValueError(f"scale={scale!r}: must be a number or None")

    if not isinstance(basis, torch.Tensor) or basis.dim() != 3 or basis.shape[0] != heads or basis.shape[2] != dim:
        raise ValueError(f"basis: expected [heads={heads}, rank, dim={dim}], got {_describe(basis)}")
    rank = basis.shape[1]
    if not 1 <= rank <= dim:
        raise ValueError(f"basis {tuple(basis.shape)}: rank={rank} must be between 1 and the head dim {dim}")

    bias_len = window if causal else window + 1
    if rel_bias is None:
        if pattern != "NC":
            raise ValueError(f"rel_bias=None: {pattern} has a local window and needs rel_bias [heads={heads}, {bias_len}]")
    elif not isinstance(rel_bias, torch.Tensor) or tuple(rel_bias.shape) != (heads, bias_len):
        rule = "window (causal)" if causal else "window + 1 (noncausal)"
        raise ValueError(f"rel_bias: expected [heads={heads}, {bias_len}] ({rule}), got {_describe(rel_bias)}")
    if not isinstance(mem_bias, torch.Tensor) or tuple(mem_bias.shape) not in ((heads,), (heads, segments)):
        raise ValueError(f"mem_bias: expected [heads={heads}] or [heads={heads}, segments={segments}], got {_describe(mem_bias)}")

    if kv_mask is not None and (
        not isinstance(kv_mask, torch.Tensor) or kv_mask.dtype != torch.bool or tuple(kv_mask.shape) != (batch, m)
    ):
        raise ValueError(f"kv_mask: expected a bool tensor [batch={batch}, keys={m}], got {_describe(kv_mask)}")
    if cu_seqlens is not None:
        _check_cu_seqlens(cu_seqlens, batch, n, cross)

    devices = {x.device for x in (q, k, v, basis, rel_bias, mem_bias, kv_mask) if x is not None}
    if len(devices) > 1:
        raise ValueError(f"q, k, v, basis, rel_bias, mem_bias, kv_mask: all must be on one device, got {sorted(map(str, devices))}")


def _check_cu_seqlens(cu_seqlens, batch: int, n: int, cross: bool) -> None:
    if cross:
        raise ValueError("cu_seqlens: packed sequences are supported for self-attention (cross=False) only")
    if batch != 1:
        raise ValueError(f"cu_seqlens: packed sequences need batch size 1 (all sequences along time), got batch={batch}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens: expected a 1-D int32/int64 tensor of offsets, got {_describe(cu_seqlens)}")
    offsets = cu_seqlens.tolist()
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != n or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"cu_seqlens={offsets}: must start at 0, never decrease and end at the time length {n}")


def check_lavo_step_args(q, k, v, basis, rel_bias, mem_bias, state, window):
    """Raise ValueError for any argument `lavo_decode_step` cannot run with (`state` a
    LavoDecodeState)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape != q.shape:
            raise ValueError(f"{name}: expected [batch, heads, dim] like q {tuple(q.shape)}, got {tuple(getattr(x, 'shape', ()))}")
    batch, heads, dim = q.shape
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: must be an integer >= 1")
    if basis.dim() != 3 or basis.shape[0] != heads or basis.shape[2] != dim:
        raise ValueError(f"basis {tuple(basis.shape)}: expected [heads={heads}, rank, dim={dim}]")
    rank = basis.shape[1]
    if tuple(rel_bias.shape) != (heads, window):
        raise ValueError(f"rel_bias {tuple(rel_bias.shape)}: causal decoding expects [heads={heads}, window={window}]")
    if tuple(mem_bias.shape) not in ((heads,), (heads, 1)):
        raise ValueError(f"mem_bias {tuple(mem_bias.shape)}: expected [heads={heads}]")
    expected = (batch, heads, window - 1, dim)
    if tuple(state.keys.shape) != expected or tuple(state.values.shape) != expected:
        raise ValueError(f"state.keys/values {tuple(state.keys.shape)}: expected {expected} (window - 1 = {window - 1} slots)")
    if tuple(state.mem_sum.shape) != (batch, heads, rank):
        raise ValueError(f"state.mem_sum {tuple(state.mem_sum.shape)}: expected {(batch, heads, rank)}")


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return repr(x)
