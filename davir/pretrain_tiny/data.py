"""Scenes held in memory: one split's images decoded once at the model resolution, their texts, the normaliser."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from davir.data.images import load_rgb
from davir.data.synthetic import (
    COLOR_WORDS,
    MATERIAL_WORDS,
    NO_CHANGE_CAPTIONS,
    SHAPE_WORDS,
    SIZE_WORDS,
    image_names,
    load_scenes,
    object_phrase,
)
from davir.errors import DataError
from davir.io import read_json


@dataclass
class SceneTensors:
    """Scenes of one split: images (N, 3 views, 3, S, S) uint8 (before, after, nonsemantic), descriptions
    per view, change captions and "no change" captions per scene, the scene ids, the changed object's phrase
    (``subjects``, the entity an oracle retriever would return), the phrases of the before image's objects and
    the change type of each scene."""

    ids: list[str]
    images: torch.Tensor
    descriptions: list[tuple[str, str, str]]
    captions: list[list[str]]
    no_change: list[list[str]]
    subjects: list[str]
    objects: list[list[str]]
    change_types: list[str] = field(default_factory=list)


VIEWS = ("before", "after", "nonsemantic")


def _load_image(path: Path, size: int) -> np.ndarray:
    # The InstructBLIP processor's own resize: PIL bicubic to size×size on the uint8 RGB image.
    resized = load_rgb(path, record=path.name).resize((size, size), Image.BICUBIC)
    return np.asarray(resized).transpose(2, 0, 1)


def load_split(
    root: Path, split: str, size: int, *, limit: int | None = None, scenes: dict[str, Any] | None = None
) -> SceneTensors:
    """Decode the scenes of ``split`` once (all three views at ``size`` px) with their texts; ``scenes``:
    the set's records when the caller has read them already."""
    scenes = load_scenes(root) if scenes is None else scenes
    no_change_file = read_json(root / "no_change_captions.json")
    ids = sorted(k for k, r in scenes.items() if r.get("split") == split)[:limit]
    if not ids:
        raise DataError(f"{root / 'scenes.json'}: no scenes in split {split!r}")
    images = np.empty((len(ids), 3, 3, size, size), dtype=np.uint8)
    descriptions, captions, no_change, subjects, objects, change_types = [], [], [], [], [], []
    for row, scene_id in enumerate(ids):
        record = scenes[scene_id]
        for view_index, view in enumerate(VIEWS):
            images[row, view_index] = _load_image(root / record["images"][view]["file"], size)
        descriptions.append(tuple(record["images"][view]["description"] for view in VIEWS))
        captions.append(list(record["captions"]))
        key = Path(image_names(int(scene_id))["before"]).name
        no_change.append(list(no_change_file.get(key) or NO_CHANGE_CAPTIONS[-1:]))
        subjects.append(str(record["change"]["subject"]))
        objects.append([object_phrase(o) for o in record["images"]["before"]["objects"]])
        change_types.append(str(record["change"]["type"]))
    return SceneTensors(
        ids, torch.from_numpy(images), descriptions, captions, no_change, subjects, objects, change_types
    )


DESCRIPTION_ORDERS = ("left-to-right", "canonical")
_ATTRIBUTE_RANK = {
    **{value: i for i, value in enumerate(COLOR_WORDS)},
    **{value: i for i, value in enumerate(SHAPE_WORDS)},
    **{value: i for i, value in enumerate(MATERIAL_WORDS)},
    **{value: i for i, value in enumerate(SIZE_WORDS)},
}


def canonical_description(description: str) -> str:
    """Re-order a left-to-right description by attributes (colour, shape, material, size in the generator's
    order): the same set of objects, but reading it needs no spatial ordering, only "which are present"."""
    phrases = [p.strip() for p in description.split(" , ") if p.strip()]

    def key(phrase: str) -> tuple[int, ...]:
        size, color, material, shape = phrase.split()
        return (_ATTRIBUTE_RANK[color], _ATTRIBUTE_RANK[shape], _ATTRIBUTE_RANK[material], _ATTRIBUTE_RANK[size])

    return " , ".join(sorted(phrases, key=key))


class Normaliser:
    """uint8 (…, 3, S, S) → CLIP-normalised float, as InstructBLIP's image processor does after resizing."""

    def __init__(self) -> None:
        self.mean = torch.tensor(OPENAI_CLIP_MEAN).view(3, 1, 1)
        self.std = torch.tensor(OPENAI_CLIP_STD).view(3, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return (images.float() / 255.0 - self.mean) / self.std


class ModelPixels:
    """uint8 (N, 3, S, S) images at the model's resolution → the pixel tensors its forward takes: InstructBLIP's
    CLIP normalisation (:class:`Normaliser`), or a chat family's own processor (``model.image_processor``)."""

    def __init__(self, model) -> None:
        self.model = model
        self.normalise = Normaliser() if model.config.family == "instructblip" else None

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.normalise is not None:
            return self.normalise(images)
        pictures = [Image.fromarray(image.permute(1, 2, 0).numpy()) for image in images]
        return self.model.image_processor(pictures)
