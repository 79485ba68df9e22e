"""Where `ChangeCaptioner` gets what a model needs besides the images: entities, and a lightweight model's features.

    entities   OnlineEntities (retrieval with the training cache's settings) or CachedEntities (a split's cache)
    features   OnlineFeatures (the ResNet backbone on the pair's images) or CachedFeatures (a split's cache)

Both kinds of a shape answer the same calls (the Protocols below); `needs_images` says whether the captioner
must load the pair's images for them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np
import torch
from PIL import Image

from davir.data.caches import EntityCache
from davir.data.records import ChangePair
from davir.errors import DataError

# the id `preprocess features --random-init` records (the zero-branch "random-init(seed=N)" of old caches
# cannot be rebuilt: build_backbone no longer makes it)
_RANDOM_INIT = re.compile(r"^random-init\(seed=(\d+),branches=1/sqrt\(blocks\)\)$")


class EntitySource(Protocol):
    """A pair's retrieved entities, best first: `(phrase, score)`. (OnlineEntities has no `needs_images`: it
    reads the images, which the captioner assumes of a source without the attribute.)"""

    needs_masks: bool
    cache_dir: Path

    def __call__(
        self, pair_id: str, before: np.ndarray | None, after: np.ndarray | None, masks, k: int
    ) -> list[tuple[str, float]]: ...


class CachedEntities:
    """The entities `preprocess entities` stored for each pair of a split, by pair id (no image is read)."""

    needs_masks = False
    needs_images = False

    def __init__(self, cache: EntityCache | str | Path):
        self.cache = cache if isinstance(cache, EntityCache) else EntityCache(cache)

    @property
    def cache_dir(self) -> Path:
        return self.cache.root

    def missing(self, pair_ids: Sequence[str]) -> list[str]:
        return [pair_id for pair_id in pair_ids if not self.cache.has(pair_id)]

    def __call__(self, pair_id: str, before, after, masks, k: int) -> list[tuple[str, float]]:
        return list(self.cache.get(pair_id)[:k])  # a pair without entities: a DataError, that pair's error


class FeatureSource(Protocol):
    """A lightweight model's ResNet-101 layer3 features of a pair: `inputs` per pair (the CPU stage, picklable),
    `batch` for the prepared pairs at once (→ before and after features, float32 of fp16 values)."""

    needs_images: bool

    def inputs(self, pair: ChangePair, before: Image.Image | None, after: Image.Image | None): ...

    def batch(self, inputs: list, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]: ...


class CachedFeatures:
    """The features `preprocess features` stored for the images of a split, by image path."""

    needs_images = False

    def __init__(self, cache, *, trained_with: str | None = None):
        used = cache.manifest.get("weights")
        if trained_with and used != trained_with:
            raise DataError(
                f"feature cache {cache.root} was made with backbone {used!r}, the model was trained on "
                f"{trained_with!r} features"
            )
        self.cache = cache

    def inputs(self, pair: ChangePair, before=None, after=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.get(pair.before), self.cache.get(pair.after)

    def batch(self, inputs: list, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.stack([b for b, _ in inputs]).to(device), torch.stack([a for _, a in inputs]).to(device))


class OnlineFeatures:
    """ResNet-101 layer3 features computed on the fly with the recipe of `preprocess features`: each image
    resized to 224x224 by OpenCV (bicubic, uint8), ImageNet-normalised, rounded through fp16 as the cache stores.

    `read_files`: each image is read from the pair's files and resized alone (evaluate.py on a split without a
    feature cache) instead of taking the images the captioner loaded (caption.py: its size policy applied)."""

    def __init__(
        self,
        weights: str | Path | None,
        *,
        trained_with: str | None = None,
        device: str | torch.device = "cpu",
        read_files: bool = False,
    ):
        from davir.preprocessing.backbone import IMAGENET_STD, build_backbone, file_sha256, shipped_backbone_matching

        match = _RANDOM_INIT.match(str(trained_with or ""))
        if weights is None and match is None:
            weights = shipped_backbone_matching(trained_with)  # the demo's: found, and checked by its hash
            if weights is None:
                raise DataError(
                    "the model was trained on features of the backbone "
                    f"{trained_with!r}: give that weights file with --backbone-weights"
                )
        elif (
            weights is not None
            and trained_with
            and not match
            and f"sha256:{file_sha256(Path(weights))}" != trained_with
        ):
            raise DataError(f"{weights} is not the backbone the model was trained on ({trained_with})")
        self.device = torch.device(device)
        self.std = IMAGENET_STD
        self.read_files = read_files
        self.backbone = build_backbone(weights, random_init=weights is None, seed=int(match.group(1)) if match else 0)
        self.backbone = self.backbone.to(self.device)

    @property
    def needs_images(self) -> bool:
        return not self.read_files

    def inputs(self, pair: ChangePair, before: Image.Image | None, after: Image.Image | None) -> np.ndarray:
        """(2, 224, 224, 3) uint8: before and after at the backbone's input size."""
        from davir.preprocessing.backbone import IMAGE_SIZE, load_resized

        if self.read_files:
            return np.stack([load_resized(Path(path), record=pair.pair_id) for path in (pair.before, pair.after)])
        return np.stack(
            [
                cv2.resize(np.asarray(image), (IMAGE_SIZE, IMAGE_SIZE), interpolation=cv2.INTER_CUBIC)
                for image in (before, after)
            ]
        )

    @torch.no_grad()
    def batch(self, inputs: list[np.ndarray], device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        from davir.preprocessing.backbone import normalize_batch

        images = torch.from_numpy(np.concatenate(inputs)).permute(0, 3, 1, 2)
        if self.read_files:  # the contiguous layout evaluate.py has always used: conv results depend on it (~1e-6)
            images = images.contiguous()
        features = self.backbone(normalize_batch(images.to(self.device), self.std)).to(torch.float16).float()
        return features[0::2], features[1::2]
