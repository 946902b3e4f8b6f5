"""The LAVO decode states: `LavoDecodeState` for causal self-attention, `LavoSource` for
cross-attention. Their layout and update rule are the contract that the PyTorch step
(`torch_path.torch_lavo_step`) and the Triton step (`recurrent.recurrent_lavo_step`)
both implement. States are values: a step returns a new state and leaves the one it was
given as it was.

The types sit in a module of their own so that imports run one way: the dispatcher
(`decode.py`) imports the implementations, and they import this module, never the
dispatcher.
"""

from typing import NamedTuple

import torch

from ..common import compute_dtype


class LavoDecodeState(NamedTuple):
    """What causal self-attention (CS) keeps between tokens, per batch row and head.

    - `keys`, `values` [B, H, w-1, d], in the dtype of k and v: a ring buffer of the
      last w-1 positions. Position p lives in slot `p % (w-1)`; before step t (t =
      `count`) the slots hold positions t-w+1 .. t-1, and a slot whose position would
      be negative (t < w-1) is empty and never read. w = 1 gives an empty buffer.
    - `mem_sum` [B, H, r], float32 (float64 for float64 inputs): the sum of
      c_j = B v_j over all positions seen.
    - `count` (int): how many positions have been seen, the same for every row.

    A step at position t = count: mem_sum += B v_t; h = mem_sum / (t + 1); logits over
    the filled buffer slots (bias rel_bias[t - p]), the current token (bias rel_bias[0])
    and the r memory slots; then k_t, v_t are written to slot t % (w-1) and count becomes
    t + 1. The step writes the new buffer and sum into new tensors.
    """

    keys: torch.Tensor
    values: torch.Tensor
    mem_sum: torch.Tensor
    count: int = 0

    @classmethod
    def empty(cls, batch: int, heads: int, head_dim: int, rank: int, window: int, *, dtype=torch.float32, device=None):
        """The state before the first token."""
        ring = torch.zeros(batch, heads, window - 1, head_dim, dtype=dtype, device=device)
        sums = torch.zeros(batch, heads, rank, dtype=compute_dtype(dtype), device=device)
        return cls(ring, ring.clone(), sums, 0)


class LavoSource(NamedTuple):
    """A cross-attention source prepared once for decoding (CC, NC).

    keys, values [B, H, m, d] in the dtype of the source's k and v (bf16 under autocast:
    a step casts the few rows of its window to the compute dtype, exactly); None for NC,
    whose queries read the means only. valid [B, m] (1 = real position) and `means` in the
    compute dtype (the sums behind them need it): CC, the prefix means h_t [B, H, m, r];
    NC, the segment means [B, H, S, r].
    """

    keys: torch.Tensor | None
    values: torch.Tensor | None
    valid: torch.Tensor
    means: torch.Tensor
    causal: bool
