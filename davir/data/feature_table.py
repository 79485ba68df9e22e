"""The cached grid features a training run reads, loaded once into memory at the model's token grid.

    table = PooledFeatureTable.load(FeatureCache("cache/features"), image_paths, pool=2)
    table.get(path)            # (1024, 7, 7) float32: the cached (1024, 14, 14) fp16 grid, average-pooled 2×2

Why once, and why the model's result is unchanged: docs/preprocessing.md, "Cache layouts".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch
from torch.nn import functional

from davir.data.feature_cache import FeatureCache
from davir.errors import DataError


def pool_grid(grid: torch.Tensor, pool: int) -> torch.Tensor:
    """(…, C, H, W) → (…, C, ⌈H/pool⌉, ⌈W/pool⌉) average pooling: the one pooling of the lightweight features,
    shared by this table, the front-end (`FeatureFrontend`) and the train-split statistics."""
    return functional.avg_pool2d(grid, pool, ceil_mode=True) if pool > 1 else grid


def pooled_size(size: int, pool: int) -> int:
    """Side of a `size`-wide grid after `pool_grid`: ⌈size / pool⌉."""
    return -(-size // pool)


_last_loaded: tuple[tuple, PooledFeatureTable] | None = None


class PooledFeatureTable:
    """Features of a fixed set of images, pooled by `pool` and held in one float32 tensor (``get`` as FeatureCache)."""

    def __init__(self, cache: FeatureCache, index: dict[str, int], table: torch.Tensor, pool: int):
        self.cache = cache
        self.index = index
        self.table = table
        self.pool = pool

    @classmethod
    def load(
        cls, cache: FeatureCache, images: Iterable, *, pool: int = 1, rows_per_read: int = 256
    ) -> PooledFeatureTable:
        """Read and pool the features of `images`; the last table loaded is kept and reused when the same
        images of the same chunk files are asked for again (the runs of a sweep, one process)."""
        global _last_loaded
        keys = list(dict.fromkeys(cache.key(path) for path in images))
        missing = [key for key in keys if key not in cache.entries]
        if missing:
            raise DataError(f"{len(missing)} images have no features in {cache.root}, e.g. {missing[:2]}")
        identity = (str(cache.root.resolve()), pool, tuple((key, *cache.entries[key]) for key in keys))
        if _last_loaded is not None and _last_loaded[0] == identity:
            return cls(cache, _last_loaded[1].index, _last_loaded[1].table, pool)
        table = cls._read(cache, keys, pool, rows_per_read)
        _last_loaded = (identity, table)
        return table

    @classmethod
    def _read(cls, cache: FeatureCache, keys: list[str], pool: int, rows_per_read: int) -> PooledFeatureTable:
        by_chunk: dict[str, list[tuple[int, int]]] = defaultdict(list)  # chunk → [(row in chunk, row in table)]
        for position, key in enumerate(keys):
            name, row = cache.entries[key]
            by_chunk[name].append((row, position))
        table = None
        for name, rows in by_chunk.items():
            rows.sort()
            features = cache.chunk_rows(name)
            for start in range(0, len(rows), rows_per_read):
                part = rows[start : start + rows_per_read]
                first, last = part[0][0], part[-1][0]
                block = features[first : last + 1]  # one contiguous read; rows between are few in practice
                grids = pool_grid(block[[row - first for row, _ in part]].float(), pool)
                if table is None:
                    table = torch.empty((len(keys), *grids.shape[1:]), dtype=torch.float32)
                table[[position for _, position in part]] = grids
        if table is None:
            table = torch.empty((0,), dtype=torch.float32)
        return cls(cache, {key: i for i, key in enumerate(keys)}, table, pool)

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, image_path) -> bool:
        return self.cache.key(image_path) in self.index

    def get(self, image_path) -> torch.Tensor:
        key = self.cache.key(image_path)
        if key not in self.index:
            raise DataError(
                f"image {image_path} (key {key!r}) is not among the {len(self.index)} images loaded "
                f"from {self.cache.root}"
            )
        return self.table[self.index[key]]
