"""The settings of a synthetic set (`SynthConfig`), recorded in scenes.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from davir.errors import DataError

DIFFICULTIES = ("standard", "hard")
# Object counts per scene when min_objects / max_objects are not given.
DEFAULT_OBJECTS = {"standard": (3, 7), "hard": (6, 10)}
MAX_OBJECTS = {"standard": 8, "hard": 12}


@dataclass(frozen=True)
class SynthConfig:
    """What to generate. Every field is recorded in scenes.json; a rerun with the same config reuses the folder.

    `difficulty` picks the scene generator (docs/experiments/synthetic_hard.md has every knob with its range):

    * ``standard`` (default) — today's set, byte for byte: 3-7 objects, each at least 60 % visible, a
      small orbit of the camera around a floor point (azimuth ±2-5°, elevation ±3°, distance ±6 %, pan
      ±0.3) and a global light change (brightness, contrast, colour temperature) as distractors; a plain
      floor, no shadows.
    * ``hard`` — made to tell change localisers apart where camera moves have parallax
      (davir.data.synthetic.hard): 6-10 objects that may hide each other (at least 35 % of each visible),
      a share of small objects (radius 0.3 instead of 0.4), half of the changes on a small or partly
      hidden object, camera moves that translate the 3-D camera 0.9-2.4 units sideways, ±1.2 forward,
      ±0.6 up and re-aim it at a point up to 0.8 units from the scene centre (nearer objects shift more
      than far ones), illumination changes that also turn the key light 30-90° in azimuth and ±10° in
      elevation so the soft ground shadows move, and a mild value-noise texture (±4 % of the floor's
      brightness) fixed to the floor.

    `min_objects` / `max_objects` default to the difficulty's range (3-7 standard, 6-10 hard).
    """

    scenes: int = 5000
    seed: int = 0
    width: int = 320
    height: int = 240
    semantic_distractor_rate: float = 0.3
    min_objects: int | None = None
    max_objects: int | None = None
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    difficulty: Literal["standard", "hard"] = "standard"

    def __post_init__(self) -> None:
        if self.difficulty not in DIFFICULTIES:
            raise DataError(
                f"synthetic set: difficulty must be one of {', '.join(DIFFICULTIES)}, got {self.difficulty!r}"
            )
        low, high = DEFAULT_OBJECTS[self.difficulty]
        if self.min_objects is None:
            object.__setattr__(self, "min_objects", low)
        if self.max_objects is None:
            object.__setattr__(self, "max_objects", high)
        if self.scenes < 1:
            raise DataError(f"synthetic set: scenes must be at least 1, got {self.scenes}")
        if self.width < 64 or self.height < 48:
            raise DataError(f"synthetic set: image size {self.width}x{self.height} is too small (at least 64x48)")
        if not 0.0 <= self.semantic_distractor_rate <= 1.0:
            raise DataError(
                f"synthetic set: semantic_distractor_rate must be in [0, 1], got {self.semantic_distractor_rate}"
            )
        most = MAX_OBJECTS[self.difficulty]
        if not 2 <= self.min_objects < self.max_objects <= most:
            raise DataError(
                f"synthetic set: need 2 <= min_objects < max_objects <= {most} ({self.difficulty}), "
                f"got {self.min_objects}..{self.max_objects}"
            )
        if self.val_fraction < 0 or self.test_fraction < 0 or self.val_fraction + self.test_fraction >= 1:
            raise DataError(
                f"synthetic set: val_fraction {self.val_fraction} + test_fraction {self.test_fraction} must be in [0, 1)"
            )

    def record(self) -> dict[str, Any]:
        """The config as scenes.json records it: every field, `difficulty` only when it is not ``standard`` (so a
        standard set's scenes.json is byte-identical to the one written before difficulties existed)."""
        record = asdict(self)
        if self.difficulty == "standard":
            del record["difficulty"]
        return record
