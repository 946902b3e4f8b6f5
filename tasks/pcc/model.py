"""A PoinTr-style completion model built from the shared stacks.

    proxies:  FPS of the partial cloud to n_proxies centres; each centre's n_neighbors
              nearest input points, relative to it, through a shared two-stage PointNet
              (per-point MLP, max over the group, the max concatenated back, MLP, max)
              -> local features; plus an MLP embedding of the centre's coordinates
    encoder:  Encoder (noncausal self-attention, site encoder_attention) over the proxies
    queries:  the encoder's global feature (MLP, max over proxies) -> n_queries coarse
              points; each query = MLP(global feature, its coarse point)
    decoder:  Decoder(causal=False): noncausal self-attention among the queries (site
              query_attention) and noncausal cross-attention to the encoder (site
              cross_attention)
    dense:    two FoldingNet folds per query: MLP(query feature, a point of a 2-D grid) ->
              3-D offset, MLP(query feature, that offset) -> refined offset; the
              fold_points offsets are added to the query's coarse point
    output:   as PoinTr's, the prediction with the input appended: coarse = the
              n_queries coarse points and the n_proxies centres, dense = the
              n_queries x fold_points folded points and the n_input partial points
              (CAB / PoinTr on PCN: 224 x 64 = 14,336 + 2,048 = 16,384 points)

PoinTr itself takes the proxies' local features from DGCNN layers and a geometry-aware
attention; here both are the shared blocks, so every attention runs in every site.
"""

import math

import torch
from omegaconf import DictConfig
from torch import nn

from ...stacks import Decoder, Encoder
from .geometry import farthest_point_sample, gather_points, knn

# The folding grid spans [-1, 1]^2: a code of unit scale, which the fold's MLP maps to the
# patch's size. PoinTr's grid spans [-0.05, 0.05]^2; with inputs that small the first layer
# sees almost only the query feature (the trials: docs/benchmarks.md, "Point cloud
# completion (pcc)").
GRID_HALF_WIDTH = 1.0


def mlp(*sizes: int) -> nn.Sequential:
    """Linear layers of the given sizes with GELU between them (none after the last)."""
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.GELU())
    return nn.Sequential(*layers)


class PointProxies(nn.Module):
    """points [B, N, 3] -> (centres [B, P, 3], features [B, P, D])."""

    def __init__(self, d_model: int, n_proxies: int, n_neighbors: int):
        super().__init__()
        self.n_proxies, self.n_neighbors = n_proxies, n_neighbors
        self.first = mlp(3, d_model // 2, d_model // 2)
        self.second = mlp(d_model, d_model, d_model)

    def forward(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        centres = gather_points(points, farthest_point_sample(points, self.n_proxies))  # [B, P, 3]
        groups = gather_points(points, knn(centres, points, self.n_neighbors)) - centres[:, :, None]  # [B, P, k, 3]
        h = self.first(groups)  # [B, P, k, D/2]
        h = torch.cat([h, h.amax(dim=2, keepdim=True).expand_as(h)], dim=-1)  # [B, P, k, D]
        return centres, self.second(h).amax(dim=2)


def folding_grid(n: int) -> torch.Tensor:
    """[n, 2]: the first n points, row by row, of a square grid of ceil(sqrt(n))^2 points
    spanning [-GRID_HALF_WIDTH, GRID_HALF_WIDTH]^2."""
    side = math.ceil(math.sqrt(n))
    axis = torch.linspace(-GRID_HALF_WIDTH, GRID_HALF_WIDTH, side)
    return torch.stack(torch.meshgrid(axis, axis, indexing="ij"), dim=-1).reshape(-1, 2)[:n]


class Fold(nn.Module):
    """An MLP on the concatenation (query feature [D], per-point code [C]) -> 3, with its
    first layer split into the feature's part, computed once per query, and the code's
    part, computed per point: the same function as one Linear on the concatenation,
    without building the [B, Q, F, D + C] input."""

    def __init__(self, d_model: int, d_code: int):
        super().__init__()
        self.feature = nn.Linear(d_model, d_model)
        self.code = nn.Linear(d_code, d_model, bias=False)
        self.rest = nn.Sequential(nn.GELU(), nn.Linear(d_model, d_model // 2), nn.GELU(), nn.Linear(d_model // 2, 3))

    def forward(self, features: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        """features [B, Q, D], code [B or 1, Q or 1, F, C] -> [B, Q, F, 3]."""
        return self.rest(self.feature(features)[:, :, None] + self.code(code))


class Folding(nn.Module):
    """query features [B, Q, D] -> offsets [B, Q, F, 3] of F points around each query."""

    def __init__(self, d_model: int, fold_points: int):
        super().__init__()
        # Saved with the weights: a checkpoint records the grid its folds were trained on.
        self.register_buffer("grid", folding_grid(fold_points))
        self.fold1 = Fold(d_model, 2)
        self.fold2 = Fold(d_model, 3)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        offsets = self.fold1(features, self.grid.to(features.dtype)[None, None])  # [B, Q, F, 3]
        return self.fold2(features, offsets)


class PoinTr(nn.Module):
    """partial [B, N, 3] -> (coarse [B, n_queries + n_proxies, 3], dense [B, n_queries x fold_points + N, 3])."""

    def __init__(self, *, d_model: int, n_heads: int, n_proxies: int, n_neighbors: int, encoder_layers: int,
                 decoder_layers: int, n_queries: int, fold_points: int, d_ff: int, dropout: float,
                 encoder_attention: DictConfig, query_attention: DictConfig, cross_attention: DictConfig):
        super().__init__()
        self.n_queries = n_queries
        self.proxies = PointProxies(d_model, n_proxies, n_neighbors)
        self.position = mlp(3, d_model, d_model)
        self.encoder = Encoder(d_model=d_model, n_heads=n_heads, n_layers=encoder_layers,
                               attention=encoder_attention, d_ff=d_ff, dropout=dropout)
        self.global_feature = mlp(d_model, 2 * d_model, 2 * d_model)
        self.coarse = mlp(2 * d_model, 2 * d_model, 3 * n_queries)
        self.query = mlp(2 * d_model + 3, d_model, d_model)
        self.decoder = Decoder(d_model=d_model, n_heads=n_heads, n_layers=decoder_layers,
                               self_attention=query_attention, cross_attention=cross_attention, d_ff=d_ff,
                               dropout=dropout, causal=False, cross_causal=False)
        self.folding = Folding(d_model, fold_points)

    def forward(self, partial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        centres, features = self.proxies(partial)
        memory = self.encoder(features + self.position(centres))  # [B, P, D]
        pooled = self.global_feature(memory).amax(dim=1)  # [B, 2D]
        coarse = self.coarse(pooled).reshape(len(partial), self.n_queries, 3)  # [B, Q, 3]
        queries = self.query(torch.cat([pooled[:, None].expand(-1, self.n_queries, -1), coarse], dim=-1))
        features = self.decoder(queries, memory)  # [B, Q, D]
        dense = (coarse[:, :, None] + self.folding(features)).reshape(len(partial), -1, 3)  # [B, Q x F, 3]
        return torch.cat([coarse, centres], dim=1), torch.cat([dense, partial], dim=1)
