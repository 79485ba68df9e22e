"""Records + per-pair caches → training/evaluation examples.

A `ChangeCaptionDataset` turns `ChangePair` records into dicts. What goes into an example beyond the
id and captions is decided by pluggable *fields* (images for DAVIR, cached masks and entities,
cached ResNet features for the lightweight methods, ground-truth masks for evaluation), so a new
method adds a field instead of a new dataset class.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from davir.data.caches import EntityCache, MaskCache, PairMasks
from davir.data.images import load_mask, load_pair
from davir.data.records import ChangePair
from davir.errors import DataError


class PairField(Protocol):
    """Adds entries to an example; `keys` lists what it adds (used for documentation and checks)."""

    keys: tuple[str, ...]

    def __call__(self, pair: ChangePair) -> dict[str, Any]: ...


def _resize_mask(mask: np.ndarray, size: int) -> torch.Tensor:
    """Coverage of each output pixel by the mask (area resampling), as float in [0, 1], shape (size, size)."""
    image = Image.fromarray(mask.astype(np.float32), mode="F")  # float mode: no 8-bit rounding of coverage
    return torch.from_numpy(np.array(image.resize((size, size), Image.BOX), dtype=np.float32))


def _resize_to(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A boolean mask resampled (nearest) to `shape` (H, W)."""
    image = Image.fromarray(mask.astype(np.uint8) * 255)
    return np.array(image.resize((shape[1], shape[0]), Image.NEAREST)) > 127


@dataclass
class ImageField:
    """`pixel_before`, `pixel_after`: both images through the model's image processor (C, S, S)."""

    processor: Callable[[list[Image.Image]], torch.Tensor]
    size_policy: str = "resize_before_to_after"
    keys: tuple[str, ...] = ("pixel_before", "pixel_after")

    def __call__(self, pair: ChangePair) -> dict[str, Any]:
        before, after = load_pair(pair, size_policy=self.size_policy)
        pixels = self.processor([before, after])
        return {"pixel_before": pixels[0], "pixel_after": pixels[1]}


@dataclass
class MaskField:
    """`mask_before`, `mask_after` (S, S) float coverage from a preprocessing cache (or the records' own
    ground-truth masks, `RecordMasks`), and `mask_valid`.

    `source`: "per_image" uses each image's own mask (the union where one is missing), "union" uses the
    union for both, "after_only" uses the after image's mask for both (the paper). A pair whose mask is
    empty (no change found) has `mask_valid=False` and contributes no FAC term.
    """

    cache: MaskCache | RecordMasks
    size: int
    source: str = "per_image"
    keys: tuple[str, ...] = ("mask_before", "mask_after", "mask_valid")

    def __call__(self, pair: ChangePair) -> dict[str, Any]:
        masks = self.cache.read(pair.pair_id)
        union = masks.union
        if self.source == "per_image":
            before = masks.before if masks.before is not None else union
            after = masks.after if masks.after is not None else union
        elif self.source == "union":
            before = after = union
        elif self.source == "after_only":
            if masks.after is None:
                raise DataError(f"pair {pair.pair_id!r}: mask_source 'after_only' but the cache has no after mask")
            before = after = masks.after
        else:
            raise ValueError(f"unknown mask source {self.source!r}")
        return {
            "mask_before": _resize_mask(before, self.size),
            "mask_after": _resize_mask(after, self.size),
            "mask_valid": bool(union.any()),
        }


class RecordMasks:
    """The ground-truth change masks the records carry, read like a MaskCache (`has`, `read`): FAC's target
    when a user asks for it (`data.fac_masks: ground_truth`)."""

    def __init__(self, pairs: list[ChangePair]):
        self.pairs = {pair.pair_id: pair for pair in pairs}

    def has(self, pair_id: str) -> bool:
        pair = self.pairs.get(pair_id)
        return pair is not None and pair.has_gt_mask

    def read(self, pair_id: str) -> PairMasks:
        pair = self.pairs.get(pair_id)
        if pair is None or not pair.has_gt_mask:
            raise DataError(f"pair {pair_id!r} has no ground-truth change mask")
        before = load_mask(pair.gt_mask_before, record=pair_id)
        after = load_mask(pair.gt_mask_after, record=pair_id)
        if before.shape != after.shape:  # the before mask in the before image's own frame (e.g. IER)
            before = _resize_to(before, after.shape)
        return PairMasks(before=before, after=after, info={"pair_id": pair_id, "source": "ground_truth"})


@dataclass
class GroundTruthMaskField:
    """`gt_mask_before`, `gt_mask_after` (S, S) float coverage from the record's ground-truth masks."""

    size: int
    keys: tuple[str, ...] = ("gt_mask_before", "gt_mask_after", "gt_mask_valid")

    def __call__(self, pair: ChangePair) -> dict[str, Any]:
        if not pair.has_gt_mask:
            raise DataError(f"pair {pair.pair_id!r} has no ground-truth change mask")
        before = load_mask(pair.gt_mask_before, record=pair.pair_id)
        after = load_mask(pair.gt_mask_after, record=pair.pair_id)
        return {
            "gt_mask_before": _resize_mask(before, self.size),
            "gt_mask_after": _resize_mask(after, self.size),
            "gt_mask_valid": bool(before.any() or after.any()),
        }


@dataclass
class EntityField:
    """`entities`: the top-k retrieved change entities of the pair (list of phrases, best first)."""

    cache: EntityCache
    top_k: int = 1
    keys: tuple[str, ...] = ("entities",)

    def __call__(self, pair: ChangePair) -> dict[str, Any]:
        return {"entities": [entity for entity, _ in self.cache.get(pair.pair_id)[: self.top_k]]}


def stable_index(seed: int, epoch: int, index: int, modulo: int) -> int:
    """A choice in range(modulo) fixed by (seed, epoch, index): the same on a resumed run, new each epoch."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % modulo


class ChangeCaptionDataset(torch.utils.data.Dataset):
    """Examples = {pair_id, caption, captions, change_type, split} + whatever the fields add.

    `caption_mode`: "sample" picks one reference per pair per epoch (deterministic in seed/epoch, so a
    resumed run sees the same captions); "expand" makes one example per reference sentence.
    """

    def __init__(
        self,
        pairs: Sequence[ChangePair],
        fields: Sequence[PairField] = (),
        *,
        caption_mode: str = "sample",
        seed: int = 0,
        require_captions: bool = False,
    ):
        if caption_mode not in ("sample", "expand"):
            raise ValueError(f"caption_mode must be 'sample' or 'expand', got {caption_mode!r}")
        self.pairs = list(pairs)
        self.fields = list(fields)
        self.caption_mode = caption_mode
        self.seed = seed
        self.epoch = 0
        if require_captions:
            empty = [p.pair_id for p in self.pairs if not p.captions]
            if empty:
                raise DataError(f"{len(empty)} pair(s) have no reference caption, e.g. {empty[:5]}")
        if caption_mode == "expand":
            self.items = [(i, c) for i, p in enumerate(self.pairs) for c in range(max(1, len(p.captions)))]
        else:
            self.items = [(i, None) for i in range(len(self.pairs))]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def describe(self) -> str:
        """How an epoch is made, for the start-of-training summary."""
        if self.caption_mode == "expand":
            return f"caption_mode expand: every reference sentence of {len(self.pairs)} pairs"
        return f"caption_mode sample: {len(self.pairs)} pairs, one reference caption each per epoch"

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        pair_index, caption_index = self.items[index]
        pair = self.pairs[pair_index]
        if caption_index is None and pair.captions:
            caption_index = stable_index(self.seed, self.epoch, index, len(pair.captions))
        caption = pair.captions[caption_index] if pair.captions else ""
        example: dict[str, Any] = {
            "pair_id": pair.pair_id,
            "caption": caption,
            "captions": list(pair.captions),
            "change_type": pair.change_type,
            "split": pair.split,
        }
        for field in self.fields:
            example.update(field(pair))
        return example


def collate_examples(examples: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensors and bools; keep strings and lists as lists."""
    batch: dict[str, Any] = {}
    for key in examples[0]:
        values = [example[key] for example in examples]
        if isinstance(values[0], torch.Tensor):
            batch[key] = torch.stack(values)
        elif isinstance(values[0], bool):
            batch[key] = torch.tensor(values, dtype=torch.bool)
        else:
            batch[key] = values
    return batch
