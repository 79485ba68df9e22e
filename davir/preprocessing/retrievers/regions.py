"""Eq. 8's masked change regions of a pair, and the hand-made descriptor of a region.

    regions = pair_regions(pair_id, before, after, masks)   # I^m = I ⊙ M, cut to the padded mask box
    regions.before.descriptor                               # colour, material cues and shape, (F,)

The descriptor feeds the fitted retriever and the entity gate; CLIP reads the crops themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import cv2
import numpy as np

from davir.data.caches import PairMasks

MASK_SOURCES = ("per_image", "union")
MASK_WEIGHTINGS = ("binary", "soft")


@dataclass
class Region:
    """One image's change region: `crop` = (image ⊙ mask) cut to the padded mask box, `mask` inside it."""

    crop: np.ndarray  # (h, w, 3) uint8
    mask: np.ndarray  # (h, w) float in [0, 1]; all ones when the mask was empty
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 of the crop in the full image (x1, y1 exclusive)
    image_size: tuple[int, int]  # full image (width, height)
    empty: bool  # no mask pixel: the region is the whole image

    @cached_property
    def descriptor(self) -> np.ndarray:
        """`region_descriptor(self)`, computed once: the fitted retriever and the entity gate both read it."""
        return region_descriptor(self)


@dataclass
class PairRegions:
    """The before and after regions of one pair."""

    pair_id: str
    before: Region
    after: Region


def soft_patch_mask(mask: np.ndarray, grid: int = 16, sigma: float = 1.0) -> np.ndarray:
    """Eq. 6: M^ = GaussianBlur(Downsample(M)) — average-pool to a grid×grid patch map, 3×3 blur, σ in patches."""
    pooled = cv2.resize(mask.astype(np.float32), (grid, grid), interpolation=cv2.INTER_AREA)
    return cv2.GaussianBlur(pooled, (3, 3), sigma, borderType=cv2.BORDER_CONSTANT)


def resize_mask(mask: np.ndarray, height: int, width: int) -> np.ndarray:
    """A mask in the image's size: nearest for binary masks, bilinear for soft ones (the "upsampled" M^)."""
    if mask.shape == (height, width):
        return mask.astype(np.float32)
    if mask.dtype == bool:
        return cv2.resize(mask.astype(np.uint8), (width, height), interpolation=cv2.INTER_NEAREST).astype(np.float32)
    return cv2.resize(mask.astype(np.float32), (width, height), interpolation=cv2.INTER_LINEAR)


def padded_box(mask: np.ndarray, pad: float) -> tuple[int, int, int, int] | None:
    """Bounding box of mask > 0.5, grown by `pad` × its width/height on each side, clipped to the image."""
    rows = np.flatnonzero((mask > 0.5).any(axis=1))
    cols = np.flatnonzero((mask > 0.5).any(axis=0))
    if rows.size == 0:
        return None
    y0, y1, x0, x1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    grow_y, grow_x = int(math.ceil(pad * (y1 - y0))), int(math.ceil(pad * (x1 - x0)))
    height, width = mask.shape
    return max(0, x0 - grow_x), max(0, y0 - grow_y), min(width, x1 + grow_x), min(height, y1 + grow_y)


def masked_region(image: np.ndarray, mask: np.ndarray | None, *, pad: float = 0.1, weighting: str = "binary") -> Region:
    """Eq. 8: I^m = I ⊙ M, cropped to the mask's box padded by `pad`; the whole image if M is empty.

    `weighting="binary"` multiplies by the full-resolution binary mask; `"soft"` by the paper's
    patch-level soft mask M^ (Eq. 6) bilinearly upsampled to the image. The crop box always comes
    from the binary mask, so a small object is not lost when its soft mask never exceeds 0.5.
    """
    if weighting not in MASK_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {MASK_WEIGHTINGS}, got {weighting!r}")
    height, width = image.shape[:2]
    binary = None if mask is None else resize_mask(np.asarray(mask) > 0, height, width) > 0.5
    box = None if binary is None else padded_box(binary, pad)
    if box is None:
        return Region(
            crop=image.copy(),
            mask=np.ones((height, width), np.float32),
            box=(0, 0, width, height),
            image_size=(width, height),
            empty=True,
        )
    weights = (
        binary.astype(np.float32) if weighting == "binary" else resize_mask(soft_patch_mask(binary), height, width)
    )
    x0, y0, x1, y1 = box
    crop_weights = weights[y0:y1, x0:x1]
    crop = np.clip(image[y0:y1, x0:x1].astype(np.float32) * crop_weights[..., None] + 0.5, 0, 255).astype(np.uint8)
    return Region(
        crop=crop, mask=binary[y0:y1, x0:x1].astype(np.float32), box=box, image_size=(width, height), empty=False
    )


def pair_regions(
    pair_id: str,
    before: np.ndarray,
    after: np.ndarray,
    masks: PairMasks,
    *,
    mask_source: str = "per_image",
    pad: float = 0.1,
    weighting: str = "binary",
) -> PairRegions:
    """The regions of both images (Eq. 8).

    `union` applies one mask M = M_bef ∪ M_aft to both images, as the paper's single M^ does.
    `per_image` uses each image's own mask and falls back to the union where that mask is missing or
    empty (so an added object's location is still cut out of the before image); it differs from
    `union` only when the two masks are at different places (a moved object).
    """
    if mask_source not in MASK_SOURCES:
        raise ValueError(f"mask_source must be one of {MASK_SOURCES}, got {mask_source!r}")
    height, width = after.shape[:2]
    own = {"before": masks.before, "after": masks.after}
    resized = {
        side: None if m is None else resize_mask(np.asarray(m) > 0, height, width) > 0.5 for side, m in own.items()
    }
    present = [m for m in resized.values() if m is not None]
    union = np.logical_or.reduce(present) if present else None
    chosen = {}
    for side in ("before", "after"):
        mask = resized[side]
        chosen[side] = mask if mask_source == "per_image" and mask is not None and mask.any() else union
    return PairRegions(
        pair_id,
        masked_region(before, chosen["before"], pad=pad, weighting=weighting),
        masked_region(after, chosen["after"], pad=pad, weighting=weighting),
    )


HUE_BINS, SAT_BINS, VAL_BINS = 18, 4, 4


def _descriptor_names() -> list[str]:
    names = [f"hue{i}" for i in range(HUE_BINS)] + ["achromatic"]
    names += [f"sat{i}" for i in range(SAT_BINS)] + [f"val{i}" for i in range(VAL_BINS)]
    names += ["lab_l_med", "lab_a_med", "lab_b_med", "lab_l_std", "lab_a_std", "lab_b_std"]
    names += ["l_p10", "l_p90", "highlight", "dark", "grad_mean", "lap_abs_mean"]
    names += ["sqrt_area", "box_w", "box_h", "aspect", "extent", "solidity", "circularity", "vertices"]
    names += [f"hu{i}" for i in range(7)]
    names += ["center_x", "center_y", "bottom_y", "size_at_depth", "empty"]
    return names


DESCRIPTOR_NAMES = _descriptor_names()
EMPTY_FLAG = DESCRIPTOR_NAMES.index("empty")  # 1 for a pair side without a change region


def region_descriptor(region: Region) -> np.ndarray:
    """Colour (HSV histograms, Lab statistics), material cues (highlights, texture) and mask shape.

    Material: metal shows small unsaturated highlights and strong gradients, rubber is flat.
    Size: the mask's √area, and √area relative to its foot's height in the image (a depth proxy,
    since objects further up a ground-plane scene are further away).
    """
    values = np.zeros(len(DESCRIPTOR_NAMES), np.float32)
    if region.empty:
        values[-1] = 1.0
        return values
    inside = region.mask > 0.5
    count = int(inside.sum())
    width, height = region.image_size
    hsv = cv2.cvtColor(region.crop, cv2.COLOR_RGB2HSV)
    hue, sat, val = (hsv[..., c][inside].astype(np.float32) for c in range(3))
    chroma = (sat / 255.0) * (val / 255.0)
    hue_hist = (
        np.bincount(np.minimum((hue / 180.0 * HUE_BINS).astype(int), HUE_BINS - 1), weights=chroma, minlength=HUE_BINS)
        / count
    )
    features: list[float] = list(hue_hist) + [float(np.mean(chroma < 0.15))]
    features += list(
        np.bincount(np.minimum((sat / 256.0 * SAT_BINS).astype(int), SAT_BINS - 1), minlength=SAT_BINS) / count
    )
    features += list(
        np.bincount(np.minimum((val / 256.0 * VAL_BINS).astype(int), VAL_BINS - 1), minlength=VAL_BINS) / count
    )
    lab = cv2.cvtColor(region.crop, cv2.COLOR_RGB2LAB)[inside].astype(np.float32)
    features += list(np.median(lab, axis=0) / 255.0) + list(lab.std(axis=0) / 255.0)
    lightness = lab[:, 0] / 255.0
    features += [float(np.percentile(lightness, 10)), float(np.percentile(lightness, 90))]
    features += [float(np.mean((val > 220) & (sat < 80))), float(np.mean(val < 40))]
    gray = cv2.cvtColor(region.crop, cv2.COLOR_RGB2GRAY).astype(np.float32) / 255.0
    interior = cv2.erode(inside.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    interior = interior if interior.any() else inside
    gradient = np.hypot(cv2.Sobel(gray, cv2.CV_32F, 1, 0), cv2.Sobel(gray, cv2.CV_32F, 0, 1))
    features += [float(gradient[interior].mean()), float(np.abs(cv2.Laplacian(gray, cv2.CV_32F))[interior].mean())]

    mask_u8 = inside.astype(np.uint8)
    contours, _ = cv2.findContours(mask_u8, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    largest = max(contours, key=cv2.contourArea)
    area = float(count)
    ys, xs = np.nonzero(inside)
    box_w, box_h = float(xs.max() - xs.min() + 1), float(ys.max() - ys.min() + 1)
    hull_area = float(cv2.contourArea(cv2.convexHull(largest)))
    perimeter = float(cv2.arcLength(largest, True))
    vertices = len(cv2.approxPolyDP(largest, 0.02 * perimeter, True)) if perimeter > 0 else 0
    hu = cv2.HuMoments(cv2.moments(mask_u8, binaryImage=True)).ravel()
    hu = -np.sign(hu) * np.log10(np.abs(hu) + 1e-30)
    diagonal = math.hypot(width, height)
    x0, y0 = region.box[0], region.box[1]
    bottom = (y0 + ys.max() + 1) / height
    features += [
        math.sqrt(area) / diagonal,
        box_w / width,
        box_h / height,
        box_w / box_h,
        area / (box_w * box_h),
        area / hull_area if hull_area > 0 else 1.0,
        4 * math.pi * area / perimeter**2 if perimeter > 0 else 0.0,
        float(min(vertices, 12)),
    ]
    features += list(np.clip(hu, 0, 30) / 10.0)
    features += [
        (x0 + xs.mean()) / width,
        (y0 + ys.mean()) / height,
        bottom,
        math.sqrt(area) / diagonal / max(bottom, 0.05),
        0.0,
    ]
    values[:] = np.asarray(features, np.float32)
    return values


def whole_frame_region(image: np.ndarray) -> Region:
    """The whole image as a non-empty region (all-ones mask), for image-level retrieval.

    `masked_region(image, None)` also covers the whole frame but is marked `empty`, which
    `region_descriptor` maps to an all-zero "no change region" descriptor; this one is described.
    """
    height, width = image.shape[:2]
    return Region(
        crop=np.ascontiguousarray(image[..., :3]),
        mask=np.ones((height, width), np.float32),
        box=(0, 0, width, height),
        image_size=(width, height),
        empty=False,
    )


def frame_pair_features(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """`pair_features` of the two whole frames: (2, F), row 0 before, row 1 after."""
    return np.stack([region_descriptor(whole_frame_region(before)), region_descriptor(whole_frame_region(after))])


def pair_features(pair: PairRegions) -> np.ndarray:
    """The descriptors of both regions as a (2, F) array: row 0 before, row 1 after."""
    return np.stack([pair.before.descriptor, pair.after.descriptor])
