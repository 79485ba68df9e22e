"""Shared visual front-end: grid features → 1×1 projection + learned 2-D position embedding → tokens.

docs/methods/README.md (identical in the SCORER and DIRL code): optional coordinate channels
(`AddSpatialInfo`), `Conv2d(feat_dim, D, 1)`, then ``pos[:, r, c] = concat(w_emb[c], h_emb[r])`` from two
``Embedding(grid, D/2)`` tables is added, and the map is flattened row-major to (B, H·W, D).

The default (``init="paper"``, config ``frontend_init: paper``) is the references': raw features, PyTorch's
default projection init, N(0, 1) position tables. ``init="scaled"`` switches on two [D] departures
(docs/experiments/lightweight_demo.md, row 2, measures them per method):
* the grid features are standardised per channel with train-split statistics (`set_feature_statistics`,
  stored as buffers, so a saved model standardises its inputs the same way at inference); the papers feed
  raw ResNet-101 activations, whose scale depends on the backbone;
* the 1×1 projection starts at N(0, 1/fan_in) (unit-variance tokens from standardised features) and the
  position tables at N(0, 0.1²) instead of N(0, 1): with PyTorch's defaults the position table is ~25×
  the content at init and the image reaches the encoder as ~0.2 % of the token variance.

With ``init="paper"`` the training task sets no statistics (the buffers stay the identity).
"""

from __future__ import annotations

import torch
from torch import nn

from davir.data.feature_table import pool_grid, pooled_size


def coordinate_channels(height: int, width: int, *, device=None, dtype=None) -> torch.Tensor:
    """The two coordinate maps of `AddSpatialInfo` [C]: channel 0 is x = 2j/W − 1, channel 1 is y = 2i/H − 1.

    Returns (2, H, W); i is the row, j the column (so values lie in [-1, 1) — the reference never
    reaches +1).
    """
    cols = torch.arange(width, device=device, dtype=dtype or torch.float32) * (2.0 / width) - 1
    rows = torch.arange(height, device=device, dtype=dtype or torch.float32) * (2.0 / height) - 1
    x = cols.view(1, width).expand(height, width)
    y = rows.view(height, 1).expand(height, width)
    return torch.stack([x, y])


def add_coordinate_channels(features: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) → (B, C+2, H, W) with the coordinate maps appended after the feature channels."""
    batch, _, height, width = features.shape
    coords = coordinate_channels(height, width, device=features.device, dtype=features.dtype)
    return torch.cat([features, coords.unsqueeze(0).expand(batch, -1, -1, -1)], dim=1)


class GridPositionEmbedding(nn.Module):
    """Learned 2-D position embedding: ``pos[:, r, c] = concat(w_emb[c], h_emb[r])`` (Eq. 1 "pos(·)")."""

    def __init__(self, grid_size: int, dim: int, init_std: float = 1.0):
        super().__init__()
        if dim % 2:
            raise ValueError(f"position embedding size must be even, got {dim}")
        self.w_embedding = nn.Embedding(grid_size, dim // 2)
        self.h_embedding = nn.Embedding(grid_size, dim // 2)
        nn.init.normal_(self.w_embedding.weight, std=init_std)  # N(0, 1) in PyTorch and the references; 0.1 [D]
        nn.init.normal_(self.h_embedding.weight, std=init_std)

    def forward(self, height: int, width: int) -> torch.Tensor:
        """(D, H, W) position map."""
        if height > self.h_embedding.num_embeddings or width > self.w_embedding.num_embeddings:
            raise ValueError(
                f"feature grid {height}x{width} is larger than the position tables "
                f"({self.h_embedding.num_embeddings}x{self.w_embedding.num_embeddings})"
            )
        device = self.w_embedding.weight.device
        w = self.w_embedding(torch.arange(width, device=device))  # (W, D/2)
        h = self.h_embedding(torch.arange(height, device=device))  # (H, D/2)
        grid = torch.cat([w.unsqueeze(0).expand(height, -1, -1), h.unsqueeze(1).expand(-1, width, -1)], dim=-1)
        return grid.permute(2, 0, 1)


class FeatureFrontend(nn.Module):
    """``X~ = conv1x1(X) + pos(X)`` (SCORER Eq. 1, DIRL Eq. 1, RDD Eq. 1), flattened to (B, H·W, D).

    `pool` > 1 average-pools the grid first (a demo-size option: the attention and SCORER's B×B token
    matching cost fall with the square of the number of tokens); statistics are those of the pooled grid.
    """

    def __init__(
        self,
        feat_dim: int,
        hidden: int,
        grid_size: int = 14,
        coord_channels: bool = False,
        pool: int = 1,
        init: str = "paper",
    ):
        super().__init__()
        if pool < 1:
            raise ValueError(f"feature pooling factor must be >= 1, got {pool}")
        if init not in ("scaled", "paper"):
            raise ValueError(f"front-end init must be 'scaled' or 'paper', got {init!r}")
        self.feat_dim = feat_dim
        self.coord_channels = coord_channels
        self.pool = pool
        self.projection = nn.Conv2d(feat_dim, hidden, kernel_size=1)
        if init == "scaled":  # [D] unit-variance tokens; "paper" keeps PyTorch's default, as the references
            nn.init.normal_(self.projection.weight, std=feat_dim**-0.5)
            nn.init.zeros_(self.projection.bias)
        self.position = GridPositionEmbedding(grid_size, hidden, init_std=0.1 if init == "scaled" else 1.0)
        channels = feat_dim - 2 if coord_channels else feat_dim
        # Per-channel standardisation of the incoming features [D]; identity until statistics are set.
        self.register_buffer("feature_mean", torch.zeros(channels))
        self.register_buffer("feature_std", torch.ones(channels))

    @torch.no_grad()
    def set_feature_statistics(self, mean: torch.Tensor, std: torch.Tensor, *, floor: float = 0.1) -> None:
        """Standardise every later input with these per-channel statistics (train-split features)."""
        if mean.shape != self.feature_mean.shape or std.shape != self.feature_std.shape:
            raise ValueError(
                f"feature statistics must have shape {tuple(self.feature_mean.shape)}, "
                f"got {tuple(mean.shape)} and {tuple(std.shape)}"
            )
        self.feature_mean.copy_(mean)
        # Channels that (almost) never vary carry no information: keep them at their scale, not amplified.
        self.feature_std.copy_(std.clamp(min=max(float(std.mean()) * floor, 1e-6)))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Models saved before standardisation existed: identity statistics.
        for name in ("feature_mean", "feature_std"):
            state_dict.setdefault(
                prefix + name,
                getattr(self, name).new_full(getattr(self, name).shape, 0.0 if name == "feature_mean" else 1.0),
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def is_pooled(self, features: torch.Tensor) -> bool:
        """A grid already at the token size (⌈grid_size / pool⌉ on both sides) was pooled by the caller
        (the training runs' in-memory `PooledFeatureTable`); pooling it again would be wrong."""
        tokens = pooled_size(self.position.w_embedding.num_embeddings, self.pool)
        return tuple(features.shape[-2:]) == (tokens, tokens)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.dim() != 4:
            raise ValueError(f"grid features must be (B, C, H, W), got shape {tuple(features.shape)}")
        expected = self.feat_dim - 2 if self.coord_channels else self.feat_dim
        if features.shape[1] != expected:
            raise ValueError(
                f"grid features have {features.shape[1]} channels, expected {expected}"
                + (" (feat_dim counts the 2 coordinate channels added here)" if self.coord_channels else "")
            )
        features = features.to(self.projection.weight.dtype)
        if self.pool > 1 and not self.is_pooled(features):  # [D] demo size: 14×14 → 7×7 tokens for pool 2
            features = pool_grid(features, self.pool)
        features = (features - self.feature_mean.view(1, -1, 1, 1)) / self.feature_std.view(1, -1, 1, 1)
        if self.coord_channels:
            features = add_coordinate_channels(features)
        x = self.projection(features)
        x = x + self.position(x.shape[2], x.shape[3]).unsqueeze(0)
        return x.flatten(2).transpose(1, 2)
