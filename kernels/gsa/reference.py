"""The slow, obviously correct GSA: the recurrence of docs/design.md §2.3, one token
at a time. For tests only (the fast paths are compared against it); never on a training
path.

It computes in the promoted dtype of the inputs and at least float32, so float64 inputs
give a float64 reference; autograd works through it (small shapes only). The returned
output has q's dtype; the returned state has the computation dtype.
"""

import torch


def _step(state_k, state_v, k_j, v_j, log_alpha_j):
    """One write: K~ = diag(alpha) K~ + s k^T, V~ = diag(alpha) V~ + s v^T, s = 1 - alpha.

    state_k [M, dk], state_v [M, dv], k_j [dk], v_j [dv], log_alpha_j [M].
    """
    alpha = torch.exp(log_alpha_j)
    s = 1.0 - alpha
    state_k = alpha[:, None] * state_k + s[:, None] * k_j[None, :]
    state_v = alpha[:, None] * state_v + s[:, None] * v_j[None, :]
    return state_k, state_v


def _read(state_k, state_v, q_t, scale):
    """o = V~^T softmax(scale K~ q) for one query q_t [dk]; returns [dv]."""
    p = torch.softmax(scale * (state_k @ q_t), dim=0)
    return state_v.t() @ p


def _scan(k, v, log_alpha, valid, state_k, state_v):
    """States after each source position, left to right.

    k [S, dk], v [S, dv], log_alpha [S, M], valid: list of S bools. A padded position
    leaves the state unchanged (alpha = 1, s = 0). Returns a list of S (K~, V~) pairs.
    """
    states = []
    for j in range(k.shape[0]):
        if valid[j]:
            state_k, state_v = _step(state_k, state_v, k[j], v[j], log_alpha[j])
        states.append((state_k, state_v))
    return states


def _one_sequence(q, k, v, log_alpha, valid, causal, cross, scale, state_k, state_v):
    """One sequence, one head. q [T, dk]; k [S, dk]; v [S, dv]; log_alpha [S, M];
    valid: list of S bools. Returns (o [T, dv], final (K~, V~))."""
    n, m = q.shape[0], k.shape[0]
    forward_states = _scan(k, v, log_alpha, valid, state_k, state_v)
    final = forward_states[-1] if m else (state_k, state_v)
    if not causal and not cross:  # NS: the right-to-left scan starts from zeros
        backward_states = _scan(
            k.flip(0), v.flip(0), log_alpha.flip(0), valid[::-1],
            torch.zeros_like(state_k), torch.zeros_like(state_v),
        )[::-1]
    outputs = []
    for t in range(n):
        if not cross and not valid[t]:
            outputs.append(torch.zeros(v.shape[1], dtype=v.dtype, device=v.device))
        elif not causal and not cross:  # NS: mean of the left-to-right and right-to-left scans
            o_lr = _read(*forward_states[t], q[t], scale)
            o_rl = _read(*backward_states[t], q[t], scale)
            outputs.append((o_lr + o_rl) / 2)
        elif causal:  # CS reads the state after t; CC after min(t, m - 1)
            j = min(t, m - 1)
            outputs.append(_read(*(forward_states[j] if j >= 0 else (state_k, state_v)), q[t], scale))
        else:  # NC: the final source state for every query
            outputs.append(_read(*final, q[t], scale))
    o = torch.stack(outputs) if outputs else q.new_zeros(0, v.shape[1])
    return o, final


def reference_gsa_attn(
    q, k, v, log_alpha, *, causal=True, cross=False, scale=None,
    initial_state=None, output_final_state=False, kv_mask=None, cu_seqlens=None,
):
    """Token-loop GSA with the signature of `gsa_attn` (minus `backend`).

    q [B,T,H,dk]; k [B,S,H,dk]; v [B,S,H,dv]; log_alpha [B,S,H,M]; kv_mask [B,S] bool
    (True = real position); cu_seqlens [N+1] with B = 1 (self-attention only): each packed
    sequence runs alone and the state's batch is N. initial_state (K~ [B,H,M,dk],
    V~ [B,H,M,dv]) seeds the (left-to-right) scan. Returns (o [B,T,H,dv], state or None).
    """
    dtype = torch.promote_types(q.dtype, torch.float32)
    q_, k_, v_, la_ = (x.to(dtype) for x in (q, k, v, log_alpha))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    mask = torch.ones(k.shape[:2], dtype=torch.bool) if kv_mask is None else kv_mask.cpu()
    heads, slots = q.shape[2], log_alpha.shape[-1]

    if cu_seqlens is None:
        spans = [(b, 0, q.shape[1], 0, k.shape[1]) for b in range(q.shape[0])]
    else:  # packed: batch 1, sequence i is [cu[i], cu[i+1]) in both q and k/v
        cu = [int(c) for c in cu_seqlens]
        spans = [(0, cu[i], cu[i + 1], cu[i], cu[i + 1]) for i in range(len(cu) - 1)]

    o = torch.zeros(*q.shape[:3], v.shape[-1], dtype=dtype, device=q.device)
    finals_k, finals_v = [], []
    for n_seq, (b, t0, t1, s0, s1) in enumerate(spans):
        per_head_k, per_head_v = [], []
        for h in range(heads):
            if initial_state is None:
                state_k = torch.zeros(slots, k.shape[-1], dtype=dtype, device=q.device)
                state_v = torch.zeros(slots, v.shape[-1], dtype=dtype, device=q.device)
            else:
                state_k = initial_state[0][n_seq, h].to(dtype)
                state_v = initial_state[1][n_seq, h].to(dtype)
            o_seq, (fk, fv) = _one_sequence(
                q_[b, t0:t1, h], k_[b, s0:s1, h], v_[b, s0:s1, h], la_[b, s0:s1, h],
                mask[b, s0:s1].tolist(), causal, cross, scale, state_k, state_v,
            )
            o[b, t0:t1, h] = o_seq
            per_head_k.append(fk)
            per_head_v.append(fv)
        finals_k.append(torch.stack(per_head_k))
        finals_v.append(torch.stack(per_head_v))
    final = (torch.stack(finals_k), torch.stack(finals_v)) if output_final_state else None
    return o.to(q.dtype), final
