"""GSA on the PyTorch path: chunked and vectorised, autograd does the backward.

The recurrence (docs/design.md §2.3) is two passes of gated linear attention joined
by the slot softmax; both passes decay a write at j by D[t, j, i] = exp(A_t[i] - A_j[i])
at the read t >= j, A the cumulative sum of log alpha (in fp32 at least). Every
exponentiated number is a difference of cumulative sums that is <= 0, so nothing
overflows however small the gates: see `_causal_scan` for how the pairs (t, j) are split.
Between chunks the states (K~, V~) are carried by a short loop over chunks.

Inputs are validated by `gsa_attn` / `gsa_decode_step`; these functions assume it.
Computation is in the promoted dtype of the inputs and at least float32 (float64 stays
float64); outputs come back in q's dtype, states in the computation dtype.
"""

import torch
import torch.nn.functional as F

from ..common import cdiv, compute_dtype
from .state import GsaState

CHUNK = 16  # positions per chunk (a power of 2); the states are carried from chunk to chunk


def read_state(q, state_k, state_v, scale):
    """o_t = V~^T softmax(scale K~ q_t) for every query against one fixed state.

    q [B,H,T,dk]; state_k [B,H,M,dk]; state_v [B,H,M,dv] -> [B,H,T,dv].
    """
    p = torch.softmax(scale * torch.einsum("bhtd,bhmd->bhtm", q, state_k), dim=-1)
    return torch.einsum("bhtm,bhmv->bhtv", p, state_v)


def advance_state(state_k, state_v, k, v, log_alpha):
    """The state after writing a whole sequence, without reading it.

    k [B,H,L,dk], v [B,H,L,dv], log_alpha [B,H,L,M]. The decay from position j to the
    end, exp(sum_{l>j} log alpha_l), comes from a reverse cumulative sum, so it is
    accurate where it is not negligible.
    """
    if log_alpha.shape[-2] == 0:
        return state_k, state_v
    # after[j] = sum_{l > j} log_alpha[l]: [B,H,L,M]
    after = log_alpha.flip(-2).cumsum(-2).flip(-2)
    total = after[..., 0, :]
    after = torch.cat([after[..., 1:, :], torch.zeros_like(after[..., :1, :])], dim=-2)
    weight = torch.exp(after) * -torch.expm1(log_alpha)  # s_j decayed to the end
    new_k = torch.exp(total)[..., None] * state_k + torch.einsum("bhlm,bhld->bhmd", weight, k)
    new_v = torch.exp(total)[..., None] * state_v + torch.einsum("bhlm,bhlv->bhmv", weight, v)
    return new_k, new_v


def _carry(state, chunk_decay, chunk_add):
    """The state entering each chunk [B,H,n,M,d] and the state after the last one.

    chunk_decay [B,H,n,M,1], chunk_add [B,H,n,M,d]. The chunks are unbound once, so the
    backward does not scatter into a full-size gradient at every step.
    """
    entering = []
    for decay, add in zip(chunk_decay.unbind(2), chunk_add.unbind(2)):
        entering.append(state)
        state = decay * state + add
    return torch.stack(entering, dim=2), state


def _halves(x, half):
    """[..., C, X] -> the lower and upper halves of its blocks of 2*half positions,
    [..., C/(2 half), half, X] each."""
    return x.reshape(*x.shape[:-2], x.shape[-2] // (2 * half), 2, half, x.shape[-1]).unbind(-3)


def _to_upper(x):
    """Contributions to the upper halves [..., C/(2 half), half, X] -> [..., C, X], zeros in the lower halves."""
    return torch.stack([torch.zeros_like(x), x], dim=-3).flatten(-4, -2)


def _causal_scan(q, k, v, log_alpha, state_k, state_v, scale):
    """CS over aligned positions: query t reads the state after position t.

    q, k [B,H,L,dk]; v [B,H,L,dv]; log_alpha [B,H,L,M] (padding already folded in:
    log_alpha = 0 and k = v = 0 at padded positions). Returns (o [B,H,L,dv], (K~, V~)).

    A write at j reaches the read at t >= j decayed by D = exp(A_t - A_j), A the
    cumulative log alpha. Inside a chunk, a pair j < t is split between the halves of
    exactly one block of 2h positions (h = CHUNK/2, CHUNK/4, ..., 1); with r the last
    position of that block's lower half, D = exp(A_t - A_r) exp(A_r - A_j), both exponents
    <= 0, and the pairs of a block become two small matrix products. j = t has D = 1.
    Between chunks the same split goes through the carried state.
    """
    batch, heads, length, _ = q.shape
    if length == 0:
        return v.new_zeros(batch, heads, 0, v.shape[-1]), (state_k, state_v)
    n_chunks = cdiv(length, CHUNK)
    pad = n_chunks * CHUNK - length
    if pad:  # padded tail: alpha = 1, s = 0, so the state passes through unchanged
        q, k, v, log_alpha = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, log_alpha))

    # [B,H,L,.] -> [B,H,n,C,.]
    q, k, v, log_alpha = (x.reshape(batch, heads, n_chunks, CHUNK, x.shape[-1]) for x in (q, k, v, log_alpha))
    cum = log_alpha.cumsum(dim=-2)  # A_t, inclusive, from the chunk start: [B,H,n,C,M]
    write = -torch.expm1(log_alpha)  # s = 1 - alpha
    blocks = []  # (h, exp(A_t - A_r) on the upper halves, exp(A_r - A_j) s_j on the lower halves)
    half = CHUNK // 2
    while half >= 1:
        (cum_low, cum_up), (write_low, _) = _halves(cum, half), _halves(write, half)
        ref = cum_low[..., -1:, :]
        blocks.append((half, torch.exp(cum_up - ref), torch.exp(ref - cum_low) * write_low))
        half //= 2

    # Chunk summaries: what each chunk adds to the state, and how it decays the state.
    to_end = torch.exp(cum[..., -1:, :] - cum) * write  # [B,H,n,C,M]
    chunk_k = torch.einsum("bhncm,bhncd->bhnmd", to_end, k)
    chunk_v = torch.einsum("bhncm,bhncv->bhnmv", to_end, v)
    chunk_decay = torch.exp(cum[..., -1, :])[..., None]  # [B,H,n,M,1]

    # Pass 1: slot logits = scale * K~_t q_t.
    before_k, state_k = _carry(state_k, chunk_decay, chunk_k)
    logits = (q * k).sum(-1, keepdim=True) * write  # j = t
    for half, up_decay, low_write in blocks:
        (_, q_up), (k_low, _) = _halves(q, half), _halves(k, half)
        logits = logits + _to_upper(up_decay * ((q_up @ k_low.transpose(-1, -2)) @ low_write))
    logits = logits + torch.exp(cum) * torch.einsum("bhnmd,bhntd->bhntm", before_k, q)
    p = torch.softmax(scale * logits, dim=-1)

    # Pass 2: o_t = V~_t^T p_t.
    before_v, state_v = _carry(state_v, chunk_decay, chunk_v)
    o = (p * write).sum(-1, keepdim=True) * v  # j = t
    for half, up_decay, low_write in blocks:
        (_, p_up), (v_low, _) = _halves(p, half), _halves(v, half)
        o = o + _to_upper(((p_up * up_decay) @ low_write.transpose(-1, -2)) @ v_low)
    o = o + torch.einsum("bhntm,bhnmv->bhntv", p * torch.exp(cum), before_v)
    o = o.reshape(batch, heads, n_chunks * CHUNK, -1)[:, :, :length]
    return o, (state_k, state_v)


def _attend(q, k, v, log_alpha, valid, state_k, state_v, *, causal, cross, scale):
    """One padded batch in [B,H,T,d] layout; valid [B,S] bool or None. Returns (o, state)."""
    n, m = q.shape[2], k.shape[2]
    if valid is not None:  # a padded source step: alpha = 1, s = 0
        keep = valid[:, None, :, None]
        k, v, log_alpha = (torch.where(keep, x, 0.0) for x in (k, v, log_alpha))
    if not cross:
        o, final = _causal_scan(q, k, v, log_alpha, state_k, state_v, scale)
        if not causal:  # NS: the right-to-left scan starts from zeros; its state is dropped
            o_rl, _ = _causal_scan(
                *(x.flip(2) for x in (q, k, v, log_alpha)),
                torch.zeros_like(state_k), torch.zeros_like(state_v), scale,
            )
            o = (o + o_rl.flip(2)) / 2
        if valid is not None:
            o = torch.where(valid[:, None, :, None], o, 0.0)
        return o, final
    if not causal:  # NC
        final = advance_state(state_k, state_v, k, v, log_alpha)
        return read_state(q, *final, scale), final
    # CC: query t < m reads the state after source position t; t >= m the final one.
    head = min(n, m)
    o, state = _causal_scan(q[:, :, :head], k[:, :, :head], v[:, :, :head], log_alpha[:, :, :head],
                            state_k, state_v, scale)
    final = advance_state(*state, k[:, :, head:], v[:, :, head:], log_alpha[:, :, head:])
    if n > m:
        o = torch.cat([o, read_state(q[:, :, m:], *final, scale)], dim=2)
    return o, final


def _unpack(x, cu_seqlens, longest):
    """Packed [1, total, ...] -> padded [N, longest, ...] and its validity mask [N, longest]."""
    starts, lengths = cu_seqlens[:-1], cu_seqlens[1:] - cu_seqlens[:-1]
    offsets = torch.arange(longest, device=x.device)
    valid = offsets[None, :] < lengths[:, None]  # [N, longest]
    index = (starts[:, None] + offsets[None, :]).clamp(max=x.shape[1] - 1)
    return x[0][index], valid


def torch_gsa_attn(q, k, v, log_alpha, *, causal, cross, scale, initial_state,
                   output_final_state, kv_mask, cu_seqlens):
    """`gsa_attn` with backend "torch" (arguments already validated, scale resolved)."""
    dtype = compute_dtype(q.dtype)
    out_dtype = q.dtype
    q, k, v, log_alpha = (x.to(dtype) for x in (q, k, v, log_alpha))
    if cu_seqlens is not None:  # self-attention only: run the sequences as a padded batch
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.long)
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        (q, in_sequence), (k, _), (v, _), (log_alpha, _) = (_unpack(x, cu_seqlens, longest)
                                                             for x in (q, k, v, log_alpha))
        valid = in_sequence
        if kv_mask is not None:
            valid = valid & _unpack(kv_mask[..., None], cu_seqlens, longest)[0][..., 0]
    else:
        valid = kv_mask
    batch, heads, slots = q.shape[0], q.shape[2], log_alpha.shape[-1]
    if initial_state is None:
        state_k = q.new_zeros(batch, heads, slots, k.shape[-1])
        state_v = q.new_zeros(batch, heads, slots, v.shape[-1])
    else:
        state_k, state_v = (s.to(dtype) for s in initial_state)

    # [B,T,H,d] -> [B,H,T,d]
    o, final = _attend(*(x.transpose(1, 2) for x in (q, k, v, log_alpha)), valid, state_k, state_v,
                       causal=causal, cross=cross, scale=scale)
    o = o.transpose(1, 2)
    if cu_seqlens is not None:  # padded [N, longest] -> packed [1, total]
        o = o[in_sequence][None]
    return o.to(out_dtype), (GsaState(*final) if output_final_state else None)


def torch_gsa_step(q, k, v, log_alpha, state, *, scale):
    """`gsa_decode_step` with backend "torch": one write, then one read.

    q, k [B,H,dk]; v [B,H,dv]; log_alpha [B,H,M]; state a `GsaState` (or a pair).
    """
    dtype = compute_dtype(q.dtype)
    q_, k_, v_, log_alpha = (x.to(dtype) for x in (q, k, v, log_alpha))
    alpha, write = torch.exp(log_alpha)[..., None], -torch.expm1(log_alpha)[..., None]
    state_k = alpha * state[0].to(dtype) + write * k_[:, :, None, :]
    state_v = alpha * state[1].to(dtype) + write * v_[:, :, None, :]
    o = read_state(q_[:, :, None, :], state_k, state_v, scale)[:, :, 0]
    return o.to(q.dtype), GsaState(state_k, state_v)
