"""The weight-free segmenter: refine each change region inside its box in the image itself.

`contrast` (default) inpaints the box from its surroundings (OpenCV Telea) and keeps the pixels that differ
from that estimate where they touch R_c; `grabcut` seeds OpenCV GrabCut with the box; `region` returns R_c.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import cv2
import numpy as np

from davir.preprocessing.change_regions import Prompt, fill_holes
from davir.preprocessing.components import option
from davir.preprocessing.segmenters.base import Candidates, SegmentRequest

CLASSICAL_METHODS = ("contrast", "grabcut", "region")


@dataclass(frozen=True)
class ClassicalSettings:
    """The classical segmenter's settings; the fields with a flag are `preprocess masks` options."""

    method: str = field(default="contrast", metadata=option("--classical-method", choices=CLASSICAL_METHODS))
    contrast_threshold: float = field(
        default=0.1,
        metadata=option(
            "--contrast-threshold", "contrast: mean-RGB difference from the inpainted background that counts as object"
        ),
    )
    pad: float = 0.25
    crop_size: int = 160
    grabcut_iterations: int = 2


def _disk(radius: int) -> np.ndarray:
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))


class ClassicalSegmenter:
    """Weight-free S: refine each cluster region inside a crop around its box (see the module docstring)."""

    name = "classical"

    def __init__(
        self,
        method: str = "contrast",
        contrast_threshold: float = 0.1,
        pad: float = 0.25,
        crop_size: int = 160,
        grabcut_iterations: int = 2,
    ):
        if method not in CLASSICAL_METHODS:
            raise ValueError(f"classical method must be one of {CLASSICAL_METHODS}, got {method!r}")
        self.method = method
        self.contrast_threshold = contrast_threshold
        self.pad = pad
        self.crop_size = crop_size
        self.grabcut_iterations = grabcut_iterations

    @classmethod
    def build(cls, settings: ClassicalSettings, *, checkpoint=None, device=None) -> ClassicalSegmenter:
        """The registry's builder: no weights, CPU only (`checkpoint` and `device` are not used)."""
        return cls(**asdict(settings))

    def settings(self) -> dict:
        return {
            "segmenter": self.name,
            "method": self.method,
            "contrast_threshold": self.contrast_threshold,
            "pad": self.pad,
            "crop_size": self.crop_size,
            "grabcut_iterations": self.grabcut_iterations,
        }

    def segment(self, requests: list[SegmentRequest]) -> list[list[Candidates]]:
        return [[self.segment_one(r.image, p, region) for p, region in zip(r.prompts, r.regions)] for r in requests]

    def segment_one(self, image: np.ndarray, prompt: Prompt, region: np.ndarray) -> Candidates:
        """One prompt: crop around the box, refine at ≤ crop_size px, paste back at image resolution."""
        height, width = image.shape[:2]
        if self.method == "region":
            return Candidates(region[None].copy(), np.ones(1, np.float32))
        x0, y0, x1, y1 = prompt.box
        pad = max(4.0, self.pad * max(x1 - x0, y1 - y0))
        cx0, cy0 = int(max(0, np.floor(x0 - pad))), int(max(0, np.floor(y0 - pad)))
        cx1, cy1 = int(min(width, np.ceil(x1 + pad))), int(min(height, np.ceil(y1 + pad)))
        crop = image[cy0:cy1, cx0:cx1]
        crop_region = region[cy0:cy1, cx0:cx1]
        box = (x0 - cx0, y0 - cy0, x1 - cx0, y1 - cy0)
        scale = min(1.0, self.crop_size / max(crop.shape[:2]))
        if scale < 1.0:
            size = (max(1, round(crop.shape[1] * scale)), max(1, round(crop.shape[0] * scale)))
            crop = cv2.resize(crop, size, interpolation=cv2.INTER_AREA)
            crop_region = cv2.resize(crop_region.astype(np.uint8), size, interpolation=cv2.INTER_NEAREST).astype(bool)
            box = tuple(v * scale for v in box)
        if self.method == "contrast":
            small = self._contrast(crop, crop_region, box)
        else:
            small = self._grabcut(crop, crop_region, box)
        if scale < 1.0:
            small = cv2.resize(small.astype(np.uint8), (cx1 - cx0, cy1 - cy0), interpolation=cv2.INTER_LINEAR) > 0
        mask = np.zeros((height, width), dtype=bool)
        mask[cy0:cy1, cx0:cx1] = small
        return Candidates(mask[None], np.ones(1, np.float32))

    @staticmethod
    def _box_mask(shape: tuple[int, int], box: tuple[float, ...], grow: int = 0) -> np.ndarray:
        inside = np.zeros(shape, dtype=np.uint8)
        x0, y0, x1, y1 = box
        inside[max(0, int(y0) - grow) : int(np.ceil(y1)) + grow, max(0, int(x0) - grow) : int(np.ceil(x1)) + grow] = 1
        return inside

    def _contrast(self, crop: np.ndarray, region: np.ndarray, box: tuple[float, ...]) -> np.ndarray:
        """Pixels that differ from an inpainted background estimate of the box, connected to R_c."""
        hole = self._box_mask(crop.shape[:2], box, grow=2) | cv2.dilate(region.astype(np.uint8), _disk(2))
        if hole.all():  # no surrounding pixels to inpaint from: fall back to the region itself
            return region
        # The background is smooth where it matters, so it is inpainted at ≤ 48 px and upsampled.
        background = self._inpaint_small(crop, hole, 48)
        evidence = np.abs(crop.astype(np.int16) - background.astype(np.int16)).mean(axis=2) / 255.0
        evidence = cv2.GaussianBlur(evidence.astype(np.float32), (3, 3), 0)
        candidate = ((evidence > self.contrast_threshold) & hole.astype(bool)).astype(np.uint8)
        candidate = cv2.morphologyEx(candidate, cv2.MORPH_OPEN, _disk(1))
        _, labels = cv2.connectedComponents(candidate, connectivity=8)
        touching = np.unique(labels[region & (labels > 0)])
        mask = np.isin(labels, touching[touching > 0])
        mask = cv2.morphologyEx(mask.astype(np.uint8), cv2.MORPH_CLOSE, _disk(2)).astype(bool)
        return fill_holes(mask)

    @staticmethod
    def _inpaint_small(crop: np.ndarray, hole: np.ndarray, size: int) -> np.ndarray:
        """Telea inpainting of `hole` at a long side of at most `size` px, resampled to the crop size."""
        height, width = crop.shape[:2]
        scale = min(1.0, size / max(height, width))
        if scale == 1.0:
            return cv2.inpaint(crop, hole, 3, cv2.INPAINT_TELEA)
        small_size = (max(2, round(width * scale)), max(2, round(height * scale)))
        small = cv2.resize(crop, small_size, interpolation=cv2.INTER_AREA)
        small_hole = cv2.dilate(cv2.resize(hole, small_size, interpolation=cv2.INTER_NEAREST), _disk(1))
        if small_hole.all():
            small_hole = cv2.resize(hole, small_size, interpolation=cv2.INTER_NEAREST)
        filled = cv2.inpaint(small, small_hole, 3, cv2.INPAINT_TELEA)
        return cv2.resize(filled, (width, height), interpolation=cv2.INTER_LINEAR)

    def _grabcut(self, crop: np.ndarray, region: np.ndarray, box: tuple[float, ...]) -> np.ndarray:
        """OpenCV GrabCut seeded by the box: outside = background, R_c = probable foreground."""
        inside = self._box_mask(crop.shape[:2], box).astype(bool)
        seeds = np.full(crop.shape[:2], cv2.GC_BGD, dtype=np.uint8)
        seeds[inside] = cv2.GC_PR_BGD
        seeds[region & inside] = cv2.GC_PR_FGD
        if not (seeds == cv2.GC_BGD).any() or not (seeds == cv2.GC_PR_FGD).any():
            return region
        bgd, fgd = np.zeros((1, 65), np.float64), np.zeros((1, 65), np.float64)
        try:
            cv2.grabCut(crop, seeds, None, bgd, fgd, self.grabcut_iterations, cv2.GC_INIT_WITH_MASK)
        except cv2.error:  # degenerate colour models (e.g. a flat crop): keep the region
            return region
        return fill_holes((seeds == cv2.GC_FGD) | (seeds == cv2.GC_PR_FGD))
