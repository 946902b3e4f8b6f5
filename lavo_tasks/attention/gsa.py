"""`gsa`: gated slot attention (docs/design.md §2.3), every pattern, constant-size decode.

The layer around the op follows the paper's released layer: q and k through swish,
v through SiLU (the same function), per-head slot gates log alpha = logsigmoid(W_f x) / tau
kept in fp32; the op's output goes SiLU -> RMSNorm (per head) -> output projection. In
cross-attention the gates, keys and values come from the context, the queries from x.
"""

from collections.abc import Mapping
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import GsaState, gsa_attn, gsa_decode_step
from ..kernels.backend import resolve_backend
from ..kernels.gsa.output_norm import silu_rms_norm
from .base import AttentionBlock, Namer, argument_name, check_backend, check_count


class GsaDecodeState(NamedTuple):
    """Decode state of `gsa`, constant size in the number of target positions.

    CS: `memory` holds the slots after the positions seen so far. CC: `source` holds the
    context projected once (k, v, the gates' projection f, mask: f in the projection's
    dtype, half log alpha's fp32 under autocast; a step takes the gates of the one source
    position it reads) and `memory` the source scan advanced
    to source position min(position - 1, m - 1). NC: `memory` is the final source state,
    computed once; every query reads it.
    """

    memory: GsaState  # (K~ [B, H, M, d], V~ [B, H, M, d]) in fp32
    source: tuple | None  # CC: (k [B,S,H,d], v [B,S,H,d], f [B,S,H*M], mask [B,S] or None)
    position: int  # target positions before the next call


class GatedSlotAttention(AttentionBlock):
    name = "gsa"
    patterns = frozenset({"CS", "NS", "CC", "NC"})

    @classmethod
    def check_arguments(cls, options: Mapping, d_model: int, n_heads: int, pattern: str, *,
                        name: Namer = argument_name) -> None:
        super().check_arguments(options, d_model, n_heads, pattern, name=name)
        slots, tau, backend = options.get("slots"), options.get("tau"), options.get("backend")
        check_count("slots", slots, name)
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0:
            raise ValueError(f"{name('tau')}={tau!r}: must be a number > 0")
        check_backend(backend, name)

    def __init__(self, d_model: int, n_heads: int, *, causal: bool, cross: bool, slots: int = 64, tau: float = 8.0,
                 backend: str = "auto"):
        super().__init__(d_model, n_heads, causal=causal, cross=cross, slots=slots, tau=tau, backend=backend)
        self.slots, self.tau, self.backend = slots, float(tau), backend
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.f_proj = nn.Linear(d_model, n_heads * self.slots, bias=False)
        # eps of fp32 whatever the dtype it runs in (RMSNorm's default is the input dtype's)
        self.norm = nn.RMSNorm(self.head_dim, eps=torch.finfo(torch.float32).eps)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _queries(self, x):
        return self.split_heads(F.silu(self.q_proj(x)))  # [B, T, H, d]

    def _source(self, source):
        """k, v [B, S, H, d] and log alpha [B, S, H, M] (fp32) of the positions written."""
        k, v, f = self._projected(source)
        return k, v, self._gates(f)

    def _projected(self, source):
        """k, v [B, S, H, d] and the gates' projection f [B, S, H * M], in the projections' dtype."""
        k, v = self.split_heads(F.silu(self.k_proj(source))), self.split_heads(F.silu(self.v_proj(source)))
        return k, v, self.f_proj(source)

    def _gates(self, f):
        """f [B, S, H * M] -> log alpha [B, S, H, M] in fp32."""
        return F.logsigmoid(f.float()).view(*f.shape[:2], self.n_heads, self.slots) / self.tau

    def _whole(self, x, source, key_mask):
        o, _ = gsa_attn(self._queries(x), *self._source(source), causal=self.causal, cross=self.cross,
                        kv_mask=key_mask, backend=self.backend)
        return self._output(o)

    def _output(self, o):
        """o [B, T, H, d] from the op -> y [B, T, D]."""
        # SiLU -> RMSNorm in o's dtype, autocast or not (under autocast bf16: fp32 inside, and
        # the output projection takes bf16 anyway), fused on the Triton path: PyTorch's norm
        # kernel takes one 64-wide row per thread block (its cost: docs/benchmarks.md,
        # "Launch settings and precisions")
        use_triton = resolve_backend(self.backend, o) == "triton"
        with torch.autocast(o.device.type, enabled=False):
            o = silu_rms_norm(o, self.norm.weight, self.norm.eps, use_triton=use_triton)
        return self.out_proj(o.flatten(2))  # [B, T, H, d] -> [B, T, D]

    def _empty_memory(self, batch_size: int) -> GsaState:
        return GsaState.empty(batch_size, self.n_heads, self.slots, self.head_dim, self.head_dim,
                              device=self.q_proj.weight.device)

    def _self_state(self, batch_size: int) -> GsaDecodeState:
        return GsaDecodeState(self._empty_memory(batch_size), None, 0)

    def _cross_state(self, context, context_mask) -> GsaDecodeState:
        memory = self._empty_memory(context.shape[0])
        if self.causal:
            return GsaDecodeState(memory, (*self._projected(context), context_mask), 0)
        k, v, log_alpha = self._source(context)
        # NC: the final source state, once; a zero query stands in (its output is unused).
        _, memory = gsa_attn(k.new_zeros(k.shape[0], 1, *k.shape[2:]), k, v, log_alpha, causal=False, cross=True,
                             kv_mask=context_mask, output_final_state=True, backend=self.backend)
        return GsaDecodeState(memory, None, 0)

    def _step(self, x, state: GsaDecodeState):
        """Outputs y [B, t, D] of the t = x.shape[1] positions after state.position, and the new state."""
        q, t = self._queries(x), x.shape[1]
        if not self.cross:
            k, v, log_alpha = self._source(x)
            if t == 1:  # the one-token step of generation
                o, memory = gsa_decode_step(q[:, 0], k[:, 0], v[:, 0], log_alpha[:, 0], state.memory,
                                            backend=self.backend)
                return self._output(o[:, None]), GsaDecodeState(memory, None, state.position + 1)
            o, memory = gsa_attn(q, k, v, log_alpha, initial_state=state.memory, output_final_state=True,
                                 backend=self.backend)
            return self._output(o), GsaDecodeState(memory, None, state.position + t)
        if self.causal:
            # CC: these queries read source positions up to min(position + t, m) - 1, so the
            # source scan advances by that segment (empty once the source is used up).
            k, v, f, source_mask = state.source
            if isinstance(state.position, torch.Tensor):
                return self._device_position_cc_step(q, state)
            segment = slice(state.position, min(state.position + t, k.shape[1]))
            seg_mask = None if source_mask is None else source_mask[:, segment]
            o, memory = gsa_attn(q, k[:, segment], v[:, segment], self._gates(f[:, segment]), causal=True, cross=True,
                                 initial_state=state.memory, output_final_state=True, kv_mask=seg_mask,
                                 backend=self.backend)
            return self._output(o), GsaDecodeState(memory, state.source, state.position + t)
        # NC: every query reads the final source state (an empty source writes nothing).
        empty = q.new_zeros(q.shape[0], 0, *q.shape[2:])
        o, _ = gsa_attn(q, empty, empty, empty.new_zeros(*empty.shape[:3], self.slots, dtype=torch.float32),
                        causal=False, cross=True, initial_state=state.memory, backend=self.backend)
        return self._output(o), GsaDecodeState(state.memory, None, state.position + t)

    def _device_position_cc_step(self, q, state: GsaDecodeState):
        """CC, one target position whose index is a 0-dim tensor (a captured decode): the
        source scan advances by source position p = position when p < m and it is real;
        otherwise the write has log alpha = 0 (alpha 1, write weight 0), which leaves the
        slots exactly as they are, so the shapes never depend on the position."""
        if q.shape[1] != 1:
            raise ValueError(f"attention 'gsa' (CC): a position on the device takes one target position, "
                             f"got {q.shape[1]}")
        k, v, f, source_mask = state.source
        m = k.shape[1]
        p = state.position.clamp(max=m - 1).reshape(1)
        writes = (state.position < m).expand(k.shape[0])  # [B]
        if source_mask is not None:
            writes = writes & source_mask.index_select(1, p)[:, 0]
        k_p, v_p = (part.index_select(1, p)[:, 0] for part in (k, v))  # [B, H, d]
        log_alpha_p = self._gates(f.index_select(1, p))[:, 0]  # [B, H, M]
        log_alpha_p = torch.where(writes[:, None, None], log_alpha_p, 0.0)
        o, memory = gsa_decode_step(q[:, 0], k_p, v_p, log_alpha_p, state.memory, backend=self.backend)
        return self._output(o[:, None]), GsaDecodeState(memory, state.source, state.position + 1)
