"""Float64 references for nearest-neighbour searches between point clouds [B, N, 3], shared
by pcc's geometry tests and the nearest-neighbour kernel's."""

import torch


def brute_nearest_squared(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, N]: the squared distance from each point of a to its nearest point of b, from
    every pair's difference in float64."""
    return (a[:, :, None].double() - b[:, None].double()).square().sum(-1).min(dim=2).values


def squared_at(a: torch.Tensor, b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[B, N]: the float64 squared distance from each point of a to b's point at index [B, N]."""
    rows = torch.arange(b.shape[0], device=b.device)[:, None]  # [B, 1]
    return (a.double() - b.double()[rows, index]).square().sum(-1)
