"""GSA decode on Triton: one token for a batch of constant-size states.

`recurrent_gsa_step` is what `gsa_decode_step(..., backend="triton")` runs. One program
per (batch, head) loads K~ [M, dk] and V~ [M, dv] (fp32), writes the token
(K~ = diag(alpha) K~ + s k^T, V~ likewise, s = 1 - alpha), reads it with the slot
softmax and stores the new state and the output: the state is read once and written once.
Inference only (no autograd).
"""

import torch
import triton
import triton.language as tl

from ..common import KERNEL_DTYPES, tile_width
from .state import GsaState


@triton.jit
def _decode_step_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, sk_ptr, sv_ptr, new_sk_ptr, new_sv_ptr, o_ptr,
    scale, M, DK, DV,
    BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_bh = tl.program_id(0)
    o_m = tl.arange(0, BM)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    m_m, m_k, m_v = o_m < M, o_k < DK, o_v < DV
    q = tl.load(q_ptr + i_bh * DK + o_k, mask=m_k, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + i_bh * DK + o_k, mask=m_k, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + i_bh * DV + o_v, mask=m_v, other=0.0).to(tl.float32)
    alpha = tl.exp(tl.load(g_ptr + i_bh * M + o_m, mask=m_m, other=0.0).to(tl.float32))
    p_mk = i_bh * M * DK + o_m[:, None] * DK + o_k[None, :]
    p_mv = i_bh * M * DV + o_m[:, None] * DV + o_v[None, :]
    m_mk = m_m[:, None] & m_k[None, :]
    m_mv = m_m[:, None] & m_v[None, :]
    sk = tl.load(sk_ptr + p_mk, mask=m_mk, other=0.0)
    sv = tl.load(sv_ptr + p_mv, mask=m_mv, other=0.0)
    sk = alpha[:, None] * sk + (1.0 - alpha)[:, None] * k[None, :]
    sv = alpha[:, None] * sv + (1.0 - alpha)[:, None] * v[None, :]
    z = tl.where(m_m, tl.sum(sk * q[None, :], 1) * scale, float("-inf"))
    e = tl.exp(z - tl.max(z, 0))
    p = e / tl.sum(e, 0)
    o = tl.sum(sv * p[:, None], 0)
    tl.store(new_sk_ptr + p_mk, sk, mask=m_mk)
    tl.store(new_sv_ptr + p_mv, sv, mask=m_mv)
    tl.store(o_ptr + i_bh * DV + o_v, o.to(o_ptr.dtype.element_ty), mask=m_v)


def recurrent_gsa_step(q, k, v, log_alpha, state, *, scale=None):
    """One decode step. q, k [B,H,dk]; v [B,H,dv]; log_alpha [B,H,M]; state a `GsaState`
    (K~ [B,H,M,dk], V~ [B,H,M,dv]) in fp32 (validated by `gsa_decode_step`). Returns (o
    [B,H,dv] in q's dtype, the new GsaState in fp32); the old state tensors are left unchanged."""
    batch, heads, dk = q.shape
    dv, slots = v.shape[-1], log_alpha.shape[-1]
    if q.dtype not in KERNEL_DTYPES:
        raise NotImplementedError(f"recurrent_gsa_step: dtype {q.dtype}; the Triton kernel takes fp16, bf16, fp32")
    scale = dk ** -0.5 if scale is None else float(scale)
    sk, sv = (s.float().contiguous() for s in state)
    new_sk, new_sv = torch.empty_like(sk), torch.empty_like(sv)
    o = torch.empty(batch, heads, dv, dtype=q.dtype, device=q.device)
    bm, bk, bv = (tile_width(n) for n in (slots, dk, dv))
    _decode_step_kernel[(batch * heads,)](
        q.contiguous(), k.contiguous(), v.contiguous(), log_alpha.contiguous(), sk, sv, new_sk, new_sv, o,
        scale, slots, dk, dv, BM=bm, BK=bk, BV=bv, num_warps=4 if bm * max(bk, bv) <= 8192 else 8)
    return o, GsaState(new_sk, new_sv)
