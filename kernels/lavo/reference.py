"""LAVO written the slow, obvious way: one query at a time, in float64. For the tests only.

Every query's window and memory sets are listed position by position as the design's
docs/design.md §2.2 defines them, the memory slots are built as vectors
`h_i * b_i` and serve as both keys and values, and one softmax runs over the window
logits and the slot logits. Nothing here is shared with the fast paths, so they can be
checked against it.

Conventions every implementation follows (the design leaves them open):
- A memory set with no valid position has `h = 0`; its slots still take part in the
  softmax (logit `mu`) and add nothing to the output.
- NC with `segments = S`: the valid source positions of a sequence, in order, are cut
  into S contiguous parts; the k-th valid position (0-based) of n goes to part
  `floor(k * S / n)` (equal parts when S divides n). Part s has the bias `mem_bias[:, s]`
  ([H] mem_bias: the same bias for every part).
- In self-attention a padded query (kv_mask False) outputs 0; cross-attention has no
  query mask.
"""

import torch

from .checks import check_lavo_args


def reference_lavo_attn(
    q, k, v, basis, rel_bias, mem_bias, *, window, causal=True, cross=False, segments=1, scale=None, kv_mask=None, cu_seqlens=None
):
    """Same arguments and result as `lavo_attn` (without `backend`); computes in float64
    and returns q's dtype. Differentiable by autograd (the loops use tensor ops)."""
    check_lavo_args(
        q, k, v, basis, rel_bias, mem_bias, window=window, causal=causal, cross=cross, segments=segments,
        scale=scale, kv_mask=kv_mask, cu_seqlens=cu_seqlens,
    )
    if cu_seqlens is not None:
        bounds = cu_seqlens.tolist()
        parts = [
            reference_lavo_attn(
                q[:, s:e], k[:, s:e], v[:, s:e], basis, rel_bias, mem_bias, window=window, causal=causal,
                cross=cross, segments=segments, scale=scale, kv_mask=None if kv_mask is None else kv_mask[:, s:e],
            )
            for s, e in zip(bounds, bounds[1:])
        ]
        return torch.cat(parts, dim=1)

    if q.shape[1] == 0:
        return torch.zeros_like(q)
    out_dtype = q.dtype
    q, k, v, basis, mem_bias = (x.double() for x in (q, k, v, basis, mem_bias))
    rel_bias = None if rel_bias is None else rel_bias.double()
    batch, n, heads, dim = q.shape
    m = k.shape[1]
    rank = basis.shape[1]
    scale = dim**-0.5 if scale is None else scale
    valid = torch.ones(batch, m, dtype=torch.bool) if kv_mask is None else kv_mask.cpu()
    mu = mem_bias.reshape(heads, -1).expand(heads, segments)  # [H, S]

    rows = []
    for b in range(batch):
        times = []
        for t in range(n):
            if not cross and not valid[b, t]:
                times.append(torch.zeros(heads, dim, dtype=q.dtype, device=q.device))
                continue
            window_js, bias_idx, groups = _sets(t, m, valid[b].tolist(), window, causal, cross, segments)
            heads_out = []
            for h in range(heads):
                logits, values = [], []
                for j, idx in zip(window_js, bias_idx):
                    logits.append(scale * torch.dot(q[b, t, h], k[b, j, h]) + rel_bias[h, idx])
                    values.append(v[b, j, h])
                for s, group in enumerate(groups):
                    coeffs = torch.zeros(rank, dtype=q.dtype, device=q.device)
                    for j in group:
                        coeffs = coeffs + basis[h] @ v[b, j, h]
                    coeffs = coeffs / max(len(group), 1)
                    for i in range(rank):
                        slot = coeffs[i] * basis[h, i]  # the i-th memory slot: key and value at once
                        logits.append(scale * torch.dot(q[b, t, h], slot) + mu[h, s])
                        values.append(slot)
                weights = torch.softmax(torch.stack(logits), dim=0)
                heads_out.append((weights[:, None] * torch.stack(values)).sum(0))
            times.append(torch.stack(heads_out))
        rows.append(torch.stack(times))
    return torch.stack(rows).to(out_dtype)


def _sets(t, m, valid, window, causal, cross, segments):
    """For query t: the window's key positions, their rel_bias indices, and the memory
    sets (a list of lists of positions; one list except NC with segments)."""
    if causal:  # CS, and CC with t clamped to the last source position
        anchor = min(t, m - 1)
        window_js = [j for j in range(anchor - window + 1, anchor + 1) if j >= 0 and valid[j]]
        return window_js, [anchor - j for j in window_js], [[j for j in range(anchor + 1) if valid[j]]]
    if not cross:  # NS
        half = window // 2
        window_js = [j for j in range(t - half, t + half + 1) if 0 <= j < m and valid[j]]
        return window_js, [t - j + half for j in window_js], [[j for j in range(m) if valid[j]]]
    real = [j for j in range(m) if valid[j]]  # NC: no window
    groups = [[j for rank_j, j in enumerate(real) if rank_j * segments // len(real) == s] for s in range(segments)]
    return [], [], groups
