"""The decoder->encoder attention weights of a `softmax` cross-attention, and the guided-
attention loss on them (Tachibana et al., 2018).

Only `softmax` forms the weights; LAVO and GSA never do (they sum over the source
without a weight per pair), so neither the plot nor the loss exists for them.

Guided attention: with N real decoder steps and L real text positions, the weight of
step n on position l costs 1 - exp(-(l / L - n / N)^2 / (2 g^2)), g = 0.2: nothing on
the diagonal, almost 1 far from it. The loss is that cost times the weight, averaged
over the real (step, position) pairs, the heads and the layers.
"""

from contextlib import contextmanager

import torch

from ...attention.softmax import SoftmaxAttention

GUIDE_WIDTH = 0.2


def softmax_cross_weights(block: SoftmaxAttention, x: torch.Tensor, context: torch.Tensor,
                          context_mask: torch.Tensor | None) -> torch.Tensor:
    """The weights [B, H, N, L] that `block` (a cross-attention) gives queries x [B, N, D]
    over context [B, L, D]: scaled dot products, CC's j <= n where the block is causal,
    padded keys (context_mask False) excluded; a query with no key at all gets zeros.

    The queries and keys are the block's own projections, as its forward makes them for
    cross-attention (no rotary positions there); the values are not needed."""
    if not block.cross:
        raise ValueError("softmax_cross_weights: the block is a self-attention, not a cross-attention")
    keys, _ = block.kv_proj(context).chunk(2, dim=-1)
    q = block.split_heads(block.q_proj(x)).transpose(1, 2)  # [B, N, D] -> [B, H, N, d]
    k = block.split_heads(keys).transpose(1, 2)  # [B, L, D] -> [B, H, L, d]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # [B, H, N, L]
    n, length = scores.shape[-2:]
    allowed = torch.ones(n, length, dtype=torch.bool, device=scores.device)
    if block.causal:
        allowed = torch.arange(length, device=scores.device) <= torch.arange(n, device=scores.device)[:, None]
    allowed = allowed[None, None]  # [1, 1, N, L]
    if context_mask is not None:
        allowed = allowed & context_mask[:, None, None, :]
    weights = scores.float().masked_fill(~allowed, float("-inf")).softmax(-1)
    return weights.nan_to_num(0.0)  # a row with no allowed key: softmax of all -inf is NaN


@contextmanager
def recorded_cross_weights(decoder):
    """Within the block, every forward of the decoder's softmax cross-attention blocks
    appends its weights [B, H, N, L] (with gradients) to the yielded list, layer by layer."""
    weights: list[torch.Tensor] = []

    def record(block, args, kwargs, out):
        weights.append(softmax_cross_weights(block, args[0], kwargs["context"], kwargs.get("context_mask")))

    hooks = [layer.cross_attn.register_forward_hook(record, with_kwargs=True)
             for layer in decoder.layers if isinstance(layer.cross_attn, SoftmaxAttention)]
    try:
        yield weights
    finally:
        for hook in hooks:
            hook.remove()


def guide(step_lengths: torch.Tensor, token_lengths: torch.Tensor, n_steps: int, n_tokens: int) -> torch.Tensor:
    """The cost [B, N, L] of each (step, position) pair (see the module docstring); 0 on
    padded steps and positions."""
    n = torch.arange(n_steps, device=step_lengths.device)[None, :, None] / step_lengths[:, None, None]
    l = torch.arange(n_tokens, device=step_lengths.device)[None, None, :] / token_lengths[:, None, None]
    cost = 1 - torch.exp(-((l - n) ** 2) / (2 * GUIDE_WIDTH ** 2))
    real = (n < 1) & (l < 1)  # [B, N, L]
    return cost * real


def guided_attention_loss(weights: list[torch.Tensor], step_lengths: torch.Tensor,
                          token_lengths: torch.Tensor) -> torch.Tensor:
    """weights: per layer [B, H, N, L]; the mean cost over real pairs, heads and layers."""
    n_steps, n_tokens = weights[0].shape[-2:]
    cost = guide(step_lengths, token_lengths, n_steps, n_tokens)  # [B, N, L]
    pairs = (step_lengths * token_lengths).sum()
    per_layer = [(w * cost[:, None]).sum() / (pairs * w.shape[1]) for w in weights]
    return torch.stack(per_layer).mean()
