"""Training batches and the description loss: sampled descriptions, change pairs, and retriever-like entities."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch

from davir.models.losses import caption_cross_entropy
from davir.models.vlm.instructblip import DavirModel
from davir.pretrain_tiny.data import Normaliser, SceneTensors
from davir.pretrain_tiny.model import DESCRIBE_PROMPT


def description_loss(
    model: DavirModel, pixels: torch.Tensor, captions: list[str], prompt: str = DESCRIBE_PROMPT
) -> torch.Tensor:
    """Single-image captioning: [one image's Q visual tokens | prompt | caption], token CE on the caption.

    Same layout as ``DavirModel.forward`` with one image instead of two (the before/after pair); a chat
    family's turn holds the one picture, then the prompt (``ChatDavirModel.teacher_forced``)."""
    batch = pixels.shape[0]
    if model.config.family != "instructblip":
        logits, labels = model.teacher_forced([pixels], [prompt] * batch, captions)
        model.attention_hook.pop()  # the FAC hook recorded this pass; not used here
        return caption_cross_entropy(logits, labels)
    qformer = model.qformer_tokenizer([prompt] * batch, padding=True, return_tensors="pt")
    features = model.core.get_image_features(
        pixels,
        qformer_input_ids=qformer["input_ids"],
        qformer_attention_mask=qformer["attention_mask"],
        return_dict=True,
    )
    model.attention_hook.pop()  # the FAC hook recorded this pass; not used here
    logits, labels = model.language_pass(features.pooler_output, [prompt] * batch, captions)
    return caption_cross_entropy(logits, labels)


def sample_description_batch(
    data: SceneTensors, batch: int, rng: random.Random, norm: Normaliser
) -> tuple[torch.Tensor, list[str]]:
    rows = [rng.randrange(len(data.ids)) for _ in range(batch)]
    views = [rng.randrange(3) for _ in range(batch)]
    pixels = norm(data.images[rows, views])
    return pixels, [data.descriptions[r][v] for r, v in zip(rows, views)]


@dataclass
class ChangeBatch:
    """Sampled pairs: pixels, one reference each, their rows in the split and whether each is a changed pair."""

    before: torch.Tensor
    after: torch.Tensor
    captions: list[str]
    rows: list[int]
    semantic: list[bool]


def sample_change_batch(
    data: SceneTensors, batch: int, rng: random.Random, norm: Normaliser, changed_weights: list[float] | None = None
) -> ChangeBatch:
    """Half semantic pairs, half distractor pairs (as in the data), one reference drawn per pair.
    ``changed_weights``: cumulative weights of the scenes (:func:`change_type_weights`) by which the changed
    pairs are drawn instead of uniformly."""
    rows = [rng.randrange(len(data.ids)) for _ in range(batch)]
    semantic = [rng.random() < 0.5 for _ in range(batch)]
    if changed_weights is not None:
        scenes = range(len(data.ids))
        rows = [rng.choices(scenes, cum_weights=changed_weights)[0] if s else r for r, s in zip(rows, semantic)]
    after_views = [1 if s else 2 for s in semantic]
    before = norm(data.images[rows, [0] * batch])
    after = norm(data.images[rows, after_views])
    captions = [rng.choice(data.captions[r] if s else data.no_change[r]) for r, s in zip(rows, semantic)]
    return ChangeBatch(before, after, captions, rows, semantic)


def change_type_weights(data: SceneTensors, weights: dict[str, float]) -> list[float] | None:
    """Cumulative per-scene weights for drawing changed pairs (a type's weight, 1 for the types not named);
    None when no type is weighted."""
    if not weights:
        return None
    return list(itertools.accumulate(weights.get(kind, 1.0) for kind in data.change_types))


@dataclass(frozen=True)
class EntityNoise:
    """How the pretraining's entities imitate a real retriever's: ``wrong`` is the share of changed pairs
    whose entity is another object of the scene, ``on_distractor`` the share of distractor ("no change")
    pairs that get one of the scene's objects instead of no entity (the demo's fitted retriever: top-1 0.89
    on changed pairs, an entity on 23% of distractor pairs)."""

    wrong: float = 0.1
    on_distractor: float = 0.25

    def __post_init__(self) -> None:
        for name in ("wrong", "on_distractor"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"entity noise {name} must be a share in [0, 1], got {getattr(self, name)}")


def noisy_entities(
    data: SceneTensors, rows: list[int], semantic: list[bool], rng: random.Random, noise: EntityNoise
) -> list[list[str]]:
    """One entity per pair (or none): the changed object's phrase, or with the ``noise`` shares another
    object of the scene (changed pairs) or one of its objects (distractor pairs), as retrieval errs."""
    entities = []
    for row, changed in zip(rows, semantic):
        if changed:
            others = [o for o in data.objects[row] if o != data.subjects[row]] or data.objects[row]
            entities.append([rng.choice(others)] if rng.random() < noise.wrong else [data.subjects[row]])
        else:
            entities.append([rng.choice(data.objects[row])] if rng.random() < noise.on_distractor else [])
    return entities
