"""Captions and descriptions: the reference sentences of a change or no change, and a single image's description."""

from __future__ import annotations

from typing import Any

import numpy as np

from davir.data.synthetic.world import COLORS, SceneObject

# Synonyms are kept few (CLEVR-Change uses the same ones) so ~80 words cover everything.
SIZE_WORDS = {"small": ("small", "tiny"), "large": ("large", "big")}
COLOR_WORDS = {name: (name,) for name in COLORS}
MATERIAL_WORDS = {"metal": ("metal", "metallic", "shiny"), "rubber": ("rubber", "matte")}
SHAPE_WORDS = {"sphere": ("sphere", "ball"), "cube": ("cube", "block"), "cylinder": ("cylinder",)}
CHANGE_TEMPLATES: dict[str, tuple[str, ...]] = {
    "color": ("the {obj} changed to {new}", "the {obj} became {new}", "the {obj} turned {new}"),
    "material": ("the {obj} changed to {new}", "the {obj} became {new}", "the {obj} turned {new}"),
    "add": ("someone added a {obj}", "a {obj} has appeared", "a {obj} has been added", "a {obj} has been newly placed"),
    "drop": ("the {obj} has disappeared", "the {obj} is missing", "the {obj} is gone", "the {obj} is no longer there"),
    "move": (
        "the {obj} moved",
        "the {obj} changed its location",
        "the {obj} is in a different location",
        "the {obj} has been moved",
    ),
}
NO_CHANGE_CAPTIONS = (
    "the scene remains the same",
    "the two scenes seem identical",
    "no change has occurred",
    "nothing has changed",
    "there is no change",
)
MIN_REFERENCES, MAX_REFERENCES = 3, 5


def _phrase(obj: SceneObject, rng: np.random.Generator | None) -> str:
    """Attribute phrase; canonical words without `rng`, otherwise each attribute may use a synonym."""
    words = []
    for table, value in (
        (SIZE_WORDS, obj.size),
        (COLOR_WORDS, obj.color),
        (MATERIAL_WORDS, obj.material),
        (SHAPE_WORDS, obj.shape),
    ):
        options = table[value]
        words.append(
            options[0]
            if rng is None or len(options) == 1 or rng.random() < 0.6
            else options[int(rng.integers(1, len(options)))]
        )
    return " ".join(words)


def change_captions(change: dict[str, Any], subject: SceneObject, rng: np.random.Generator) -> list[str]:
    """3-5 distinct references for a change; the first uses the first template and canonical words.

    `subject` is the changed object as it was before (color/material/drop/move) or as added (add),
    so the attributes named are its true ones and the new colour/material follows "to"/"became"/"turned".
    """
    templates = CHANGE_TEMPLATES[change["type"]]
    new = change.get("new", "")
    captions = [templates[0].format(obj=_phrase(subject, None), new=new)]
    wanted = int(rng.integers(MIN_REFERENCES, MAX_REFERENCES + 1))
    for _ in range(50):
        if len(captions) == wanted:
            break
        sentence = templates[int(rng.integers(len(templates)))].format(obj=_phrase(subject, rng), new=new)
        if sentence not in captions:
            captions.append(sentence)
    return captions


def no_change_captions(rng: np.random.Generator) -> list[str]:
    count = int(rng.integers(MIN_REFERENCES, MAX_REFERENCES + 1))
    order = rng.permutation(len(NO_CHANGE_CAPTIONS))[:count]
    return [NO_CHANGE_CAPTIONS[i] for i in order]


def object_phrase(record: dict[str, Any]) -> str:
    """Canonical attribute phrase of a stored object record, as `SceneObject.phrase`: "small red metal sphere"."""
    return f"{record['size']} {record['color']} {record['material']} {record['shape']}"


def describe(objects: list[dict[str, Any]]) -> str:
    """Single-image description: canonical phrases left to right by box centre, joined by " , "."""
    ordered = sorted(objects, key=lambda o: ((o["box"][0] + o["box"][2]) / 2.0, o["id"]))
    return " , ".join(object_phrase(o) for o in ordered)
