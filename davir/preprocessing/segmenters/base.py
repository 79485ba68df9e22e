"""What every segmenter takes and returns: images with prompts in, candidate masks with scores out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from davir.preprocessing.change_regions import Prompt


@dataclass
class SegmentRequest:
    """One image and its prompts; `regions[i]` is R_c of prompt i in this image's frame (H, W) bool."""

    image: np.ndarray
    prompts: list[Prompt]
    regions: list[np.ndarray]


@dataclass
class Candidates:
    """The segmenter's answer for one prompt: (K, H, W) bool masks and K scores."""

    masks: np.ndarray
    scores: np.ndarray


class Segmenter(Protocol):
    name: str

    def segment(self, requests: list[SegmentRequest]) -> list[list[Candidates]]: ...

    def settings(self) -> dict: ...
