"""LAVO's learned orthonormal basis: `CayleyBasis`, the Cayley map of a free
skew-symmetric parameter per block, and `CayleyBases`, which evaluates the bases of a
stack's blocks together in one solve."""

from contextlib import contextmanager

import torch
from torch import nn

from ..kernels.backend import resolve_backend, run_triton


class CayleyBasis(nn.Module):
    """A learned basis [H, r, d] with orthonormal rows: the first r columns of
    `base @ cayley(A)`, transposed, for A = L - L^T, L the strictly lower triangle whose
    d(d-1)/2 entries per head are the parameter `skew` [H, d(d-1)/2] (zeros at the start,
    so the basis starts as `base`'s: the QR of the initial rows, as for `basis: fixed`).

    cayley(A) = (I - A/2)^-1 (I + A/2) = 2 (I - A/2)^-1 - I is orthogonal for any
    skew-symmetric A, so the rows stay orthonormal whatever the optimiser (weight decay
    included) does to `skew`. This is the Cayley map of
    torch.nn.utils.parametrizations.orthogonal with its trivialization (a fixed orthogonal
    `base` times a map of a free parameter); torch's takes A from the first r columns'
    lower triangle, this one from the whole [d, d] (the same when r = d). The inverse
    (I - A/2)^-1 is one launch of `kernels.lavo.cayley` on CUDA (all heads in one launch,
    no pivoting needed: I - A/2 has the identity as its symmetric part), and
    torch.linalg.inv_ex otherwise (float64, the CPU). Neither synchronises the GPU with
    the host: torch.linalg.solve and inv check for errors on the host at every call, and
    matrix_exp takes ~100 small kernels and 3 syncs a call (docs/benchmarks.md, "End to
    end: LM training throughput against length"). The map runs in fp32 also under
    autocast, so training and decoding (which evaluates it once, at `init_state`) see the
    same basis.
    """

    def __init__(self, initial: torch.Tensor, backend: str = "auto"):
        super().__init__()
        heads, rank, dim = initial.shape
        self.rank, self.backend = rank, backend
        # a square orthogonal matrix per head whose first r columns span initial's rows
        base, _ = torch.linalg.qr(initial.transpose(1, 2), mode="complete")  # [H, d, d]
        self.register_buffer("base", base)
        rows, cols = torch.tril_indices(dim, dim, -1)
        self.register_buffer("lower_index", rows * dim + cols, persistent=False)  # into a flat [d * d]
        self.skew = nn.Parameter(initial.new_zeros(heads, len(rows)))
        self.evaluated: torch.Tensor | None = None  # set by CayleyBases, for one stack's forward

    @property
    def weight(self) -> torch.Tensor:
        """[H, r, d] with orthonormal rows."""
        if self.evaluated is not None:
            return self.evaluated
        return _cayley(self.skew, self.base, self.lower_index, self.rank, self.backend)


def _cayley(skew: torch.Tensor, base: torch.Tensor, lower_index: torch.Tensor, rank: int,
            backend: str) -> torch.Tensor:
    """CayleyBasis's map for N matrices at once: skew [N, d(d-1)/2], base [N, d, d] -> [N, r, d]."""
    with torch.autocast(base.device.type, enabled=False):
        n, dim = base.shape[:2]
        lower = skew.new_zeros(n, dim * dim).index_copy(1, lower_index, skew).view(n, dim, dim)
        half = 0.5 * (lower - lower.transpose(1, 2))  # A / 2, skew-symmetric
        inverse = _unit_skew_inverse(half, backend)  # (I - A/2)^-1 [N, d, d]
        # first r columns of base @ (2 inverse - I), transposed: [N, d, r] -> [N, r, d]
        return (2 * (base @ inverse[:, :, :rank]) - base[:, :, :rank]).transpose(1, 2)


class CayleyBases:
    """Evaluates the learned LAVO bases of a stack's blocks together: one solve for all
    of them instead of one per block (on a GPU the solve's time is the latency of its d
    elimination steps, one after another, whatever the number of matrices).

        with bases(): ...  # every CayleyBasis of the stack returns the weight evaluated on entry

    Bases of one size (d, r), backend, dtype and device are stacked along the heads; the
    math is CayleyBasis's, per matrix, so each basis and its gradient are what the block
    alone would give. The groups are the blocks under `root` when it is built (a block
    added later evaluates its own basis); the skews are read at each entry (the optimiser
    changes them between steps) and dropped on exit. A layer recomputed outside the
    `with` (activation checkpointing) would solve its basis again, alone."""

    def __init__(self, root: nn.Module):
        groups: dict[tuple, list[CayleyBasis]] = {}
        for module in root.modules():
            if isinstance(module, CayleyBasis):
                key = (module.base.shape[-1], module.rank, module.backend)
                groups.setdefault(key, []).append(module)
        self.groups = [maps for maps in groups.values() if len(maps) > 1]

    @contextmanager
    def __call__(self):
        try:
            for maps in self.groups:
                if len({(m.skew.dtype, m.skew.device) for m in maps}) > 1:
                    continue  # blocks moved apart after the stack was built: each solves its own
                first = maps[0]
                weights = _cayley(torch.cat([m.skew for m in maps]), torch.cat([m.base for m in maps]),
                                  first.lower_index, first.rank, first.backend)  # [sum of H, r, d]
                for m, weight in zip(maps, weights.split([m.skew.shape[0] for m in maps])):
                    m.evaluated = weight
            yield
        finally:
            for maps in self.groups:
                for m in maps:
                    m.evaluated = None


def _unit_skew_inverse(half: torch.Tensor, backend: str) -> torch.Tensor:
    """(I - half)^-1 for half [H, d, d] skew-symmetric: the Triton kernel where the
    backend resolves to it, else (and for float64) torch.linalg.inv_ex."""

    def run_torch():
        eye = torch.eye(half.shape[-1], dtype=half.dtype, device=half.device)
        return torch.linalg.inv_ex(eye - half)[0]

    if resolve_backend(backend, half) == "triton":
        def run_kernel():
            from ..kernels.lavo.cayley import unit_skew_inverse

            return unit_skew_inverse(half)

        return run_triton(backend, "lavo basis", run_kernel, run_torch)
    return run_torch()
