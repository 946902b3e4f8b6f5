"""The GSA state: `GsaState`, the slots (K~, V~) that a scan carries and a decode step
updates. Its layout and update rule are the contract of the PyTorch path
(`torch_path`), the Triton kernels (`chunk`, `recurrent`) and the reference alike.
States are values: a step returns a new state and leaves the one it was given as it was.

The type sits in a module of its own so that imports run one way, as in the LAVO
folder: the dispatchers (`attn.py`, `decode.py`) import the implementations, and they
import this module, never a dispatcher.
"""

from typing import NamedTuple

import torch


class GsaState(NamedTuple):
    """The M slots of each batch row (or packed sequence) and head.

    - `keys` K~ [B, H, M, dk], `values` V~ [B, H, M, dv]: float32, float64 for float64
      inputs on the PyTorch path.

    Writing position t with gates alpha_t = exp(log_alpha_t) [M] and write weights
    s_t = 1 - alpha_t: K~ = diag(alpha_t) K~ + s_t k_t^T and V~ = diag(alpha_t) V~ + s_t v_t^T;
    a query reads it as o = V~^T softmax(scale K~ q) (docs/design.md §2.3). A pair
    (K~, V~) of plain tensors is accepted wherever a state is taken.
    """

    keys: torch.Tensor
    values: torch.Tensor

    @classmethod
    def empty(cls, batch: int, heads: int, slots: int, key_dim: int, value_dim: int, *, device=None):
        """The state before the first position: zeros in fp32."""
        zeros = lambda dim: torch.zeros(batch, heads, slots, dim, dtype=torch.float32, device=device)  # noqa: E731
        return cls(zeros(key_dim), zeros(value_dim))
