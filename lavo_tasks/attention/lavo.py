"""`lavo`: linear attention via orthogonal memory (docs/design.md §2.2), every pattern.

The block owns the q/k/v/output projections and, per head, the orthonormal basis
[H, r, d], the relative position bias (CS, CC: w entries; NS: w + 1; NC has no window and
no bias) and the memory bias ([H]; NC: [H, cross_segments]). The relative bias starts at
0, the memory bias at `memory_bias` (default 0). A negative start gives the r memory
slots less of the softmax than the window's keys at first (at 0, with the logits near 0
at initialisation, r = 16 slots beside a window of 32 take a third of every query's
weight, a position-free average): summarization's copy rule, which needs sharp local
attention, is learned faster from -3 (README), and training moves mu from there.
It calls `lavo_tasks.kernels.lavo_attn`.

In self-attention (CS, NS) queries and keys get rotary positions (rope.py) before the op,
as in `softmax` and `local`. Without them the window's only position information is the
relative bias, one scalar per head and offset learned from 0, too little to learn from
in a short run (docs/benchmarks.md, "Model choices measured in short runs").
The op's math is unchanged; the memory logits see the rotated query, whose slowly
rotating channels stay nearly position-free. Cross-attention (CC, NC) has no rotation:
source and target positions do not share an axis.

Decode states (`LavoState`, constant size in the target length): CS, a ring buffer of
w-1 keys (rotated) and values and the fp32 memory sum; CC and NC, the source projected
and summarised once at `init_state`; NS is never decoded. A decode call returns a new
state and leaves the one it was given as it was.
"""

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import nn

from ..kernels.lavo import (
    LavoDecodeState,
    LavoSource,
    lavo_attn,
    lavo_cross_decode,
    lavo_decode_step,
    lavo_prefill,
    lavo_source,
)
from .base import AttentionBlock, Namer, argument_name, check_backend, check_count, check_window, is_int
from .cayley import CayleyBasis
from .rope import apply_rope

BASIS_KINDS = ("learned", "fixed")


class LavoState(NamedTuple):
    """Decode state of `lavo`; its size does not grow with the target length.

    `basis` [B, H, r, d] is the basis evaluated once at init_state (the learned basis
    costs a solve per evaluation, and decoding does not change it), broadcast over the
    batch (stride 0: one copy in memory). CS: `memory` is the ring buffer + fp32 memory
    sum (`LavoDecodeState`). CC, NC: `source` is the context projected and summarised
    once (`LavoSource`). `position`: how many target positions came before the next call.
    """

    basis: torch.Tensor
    memory: LavoDecodeState | None
    source: LavoSource | None
    position: int


class LavoAttention(AttentionBlock):
    name = "lavo"
    patterns = frozenset({"CS", "NS", "CC", "NC"})

    @classmethod
    def check_arguments(cls, options: Mapping, d_model: int, n_heads: int, pattern: str, *,
                        name: Namer = argument_name) -> None:
        super().check_arguments(options, d_model, n_heads, pattern, name=name)
        window, rank, segments = options.get("window"), options.get("rank"), options.get("cross_segments")
        head_dim = d_model // n_heads
        check_window(window, pattern, name)
        if not is_int(rank) or not 1 <= rank <= head_dim:
            raise ValueError(
                f"{name('rank')}={rank!r}: must be an integer between 1 and the head dim "
                f"{head_dim} ({name('d_model')}={d_model} / {name('n_heads')}={n_heads})"
            )
        if options.get("basis") not in BASIS_KINDS:
            raise ValueError(f"{name('basis')}={options.get('basis')!r}: allowed {', '.join(BASIS_KINDS)}")
        check_count("cross_segments", segments, name)
        memory_bias = options.get("memory_bias")
        if isinstance(memory_bias, bool) or not isinstance(memory_bias, (int, float)) or memory_bias != memory_bias:
            raise ValueError(f"{name('memory_bias')}={memory_bias!r}: must be a number (the memory bias's start)")
        check_backend(options.get("backend"), name)

    def __init__(self, d_model: int, n_heads: int, *, causal: bool, cross: bool, window: int = 32, rank: int = 16,
                 basis: str = "learned", cross_segments: int = 1, memory_bias: float = 0.0, backend: str = "auto"):
        super().__init__(d_model, n_heads, causal=causal, cross=cross, window=window, rank=rank, basis=basis,
                         cross_segments=cross_segments, memory_bias=memory_bias, backend=backend)
        self.window, self.rank, self.backend = window, rank, backend
        self.segments = cross_segments if self.pattern == "NC" else 1
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

        # The basis starts as the QR of a Gaussian drawn from the global RNG (seeded by the run).
        gaussian = torch.randn(n_heads, self.rank, self.head_dim)
        if basis == "learned":
            self.basis_map = CayleyBasis(gaussian, backend)
        else:
            q, _ = torch.linalg.qr(gaussian.transpose(1, 2))  # [H, d, r], orthonormal columns
            self.register_buffer("fixed_basis", q.transpose(1, 2).contiguous())  # [H, r, d]
        if self.pattern == "NC":
            self.register_parameter("rel_bias", None)  # NC has no window
        else:
            self.rel_bias = nn.Parameter(torch.zeros(n_heads, self.window + (0 if causal else 1)))
        shape = (n_heads, self.segments) if self.pattern == "NC" else (n_heads,)
        self.mem_bias = nn.Parameter(torch.full(shape, float(memory_bias)))

    @property
    def basis(self) -> torch.Tensor:
        """[H, r, d] with orthonormal rows."""
        return self.basis_map.weight if hasattr(self, "basis_map") else self.fixed_basis

    def _queries(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        """x [B, T, D] at positions offset.. -> q [B, T, H, d] (rotated in self-attention)."""
        q = self.split_heads(self.q_proj(x))
        return q if self.cross else apply_rope(q, offset, self.backend)

    def _keys_values(self, source: torch.Tensor, offset: int = 0):
        """source [B, S, D] at positions offset.. -> k, v [B, S, H, d] (k rotated in self-attention)."""
        k, v = self.split_heads(self.k_proj(source)), self.split_heads(self.v_proj(source))
        return (k if self.cross else apply_rope(k, offset, self.backend)), v

    def _whole(self, x, source, key_mask):
        o = lavo_attn(
            self._queries(x, 0), *self._keys_values(source), self.basis, self.rel_bias, self.mem_bias,
            window=self.window, causal=self.causal, cross=self.cross, segments=self.segments, kv_mask=key_mask,
            backend=self.backend,
        )
        return self.out_proj(o.flatten(2))  # [B, T, H, d] -> [B, T, D]

    def _self_state(self, batch_size: int) -> LavoState:
        weight = self.q_proj.weight
        memory = LavoDecodeState.empty(
            batch_size, self.n_heads, self.head_dim, self.rank, self.window, dtype=weight.dtype, device=weight.device
        )
        return LavoState(_over_batch(self.basis, batch_size), memory, None, 0)

    def _cross_state(self, context, context_mask) -> LavoState:
        k, v = self._keys_values(context)
        basis = self.basis
        source = lavo_source(k, v, basis, causal=self.causal, segments=self.segments, kv_mask=context_mask)
        return LavoState(_over_batch(basis, context.shape[0]), None, source, 0)

    def _step(self, x, state: LavoState):
        """x [B, t, D]: the t positions after those `state` has seen -> (y [B, t, D], new state)."""
        q, basis = self._queries(x, state.position), state.basis[0]  # q [B, t, H, d]
        memory = state.memory
        if self.cross:
            o = lavo_cross_decode(
                q, state.source, basis, self.rel_bias, self.mem_bias, window=self.window, start=state.position,
                backend=self.backend,
            )
        else:
            o, memory = self._decode_self(q, x, basis, memory, state.position)
        new_state = LavoState(state.basis, memory, state.source, state.position + x.shape[1])
        return self.out_proj(o.flatten(2)), new_state

    def _decode_self(self, q, x, basis, memory: LavoDecodeState, position: int):
        k, v = self._keys_values(x, position)
        # the count is an int, or a 0-dim tensor on the device (a captured decode): both
        # steps take either
        options = dict(window=self.window, backend=self.backend)
        on_device = isinstance(memory.count, torch.Tensor)
        if not on_device and memory.count == 0 and q.shape[1] > 1:  # a prompt: all at once, then the state after it
            return lavo_prefill(q, k, v, basis, self.rel_bias, self.mem_bias, **options)
        outputs = []
        for i in range(q.shape[1]):
            o, memory = lavo_decode_step(q[:, i], k[:, i], v[:, i], basis, self.rel_bias, self.mem_bias, memory, **options)
            outputs.append(o)
        return torch.stack(outputs, dim=1), memory


def _over_batch(basis: torch.Tensor, batch_size: int) -> torch.Tensor:
    return basis[None].expand(batch_size, -1, -1, -1)  # [H, r, d] -> [B, H, r, d], one copy in memory
