"""The settings of a synthetic set (`SynthConfig`), recorded in scenes.json."""

from __future__ import annotations

from dataclasses import dataclass

from davir.errors import DataError


@dataclass(frozen=True)
class SynthConfig:
    """What to generate. Every field is recorded in scenes.json; a rerun with the same config reuses the folder."""

    scenes: int = 5000
    seed: int = 0
    width: int = 320
    height: int = 240
    semantic_distractor_rate: float = 0.3
    min_objects: int = 3
    max_objects: int = 7
    val_fraction: float = 0.1
    test_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.scenes < 1:
            raise DataError(f"synthetic set: scenes must be at least 1, got {self.scenes}")
        if self.width < 64 or self.height < 48:
            raise DataError(f"synthetic set: image size {self.width}x{self.height} is too small (at least 64x48)")
        if not 0.0 <= self.semantic_distractor_rate <= 1.0:
            raise DataError(f"synthetic set: semantic_distractor_rate must be in [0, 1], got {self.semantic_distractor_rate}")
        if not 2 <= self.min_objects < self.max_objects <= 8:
            raise DataError(
                f"synthetic set: need 2 <= min_objects < max_objects <= 8, got {self.min_objects}..{self.max_objects}"
            )
        if self.val_fraction < 0 or self.test_fraction < 0 or self.val_fraction + self.test_fraction >= 1:
            raise DataError(
                f"synthetic set: val_fraction {self.val_fraction} + test_fraction {self.test_fraction} must be in [0, 1)"
            )
