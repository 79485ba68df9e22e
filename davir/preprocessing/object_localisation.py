"""Change localisation at object level [D] (`preprocess masks --localisation object`), beside the paper's Eqs. 2-3.

    masks = localise_objects(before, after, ObjectSettings())
    masks.before, masks.after      # boolean masks, each in its own image's frame

Why and how: docs/experiments/synthetic_hard.md, "Part 2", and docs/preprocessing.md, "Change regions".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import cv2
import numpy as np

from davir.preprocessing.registration import estimate_registration

LOCALISATIONS = ("pixel", "object")

# Hues (degrees) of the CLEVR colours other than gray: red, brown, yellow, green, cyan, blue, purple.
HUES = np.array([0.0, 28.0, 55.0, 114.0, 180.0, 229.0, 275.0])
ACHROMATIC = len(HUES)  # class index of gray / white / black foreground
FLOOR = -1


@dataclass(frozen=True)
class ObjectSettings:
    """Settings of the object-level localiser (pixel sizes at the image resolution)."""

    chroma: float = 0.16  # min chroma (max-min over the white-balanced channels / max) of a coloured pixel
    dark: float = 0.5  # achromatic pixels under this share of the floor level are foreground
    bright: float = 1.25  # ... and over this share of it (specular highlights)
    mode_px: int = 2  # radius of the mode filter on the class map
    min_segment_px: int = 12  # segments smaller than this are dropped (noise, anti-aliased edges)
    search_px: int = 14  # parallax left after the global fit that a present object may still have
    present: float = 0.45  # share of a segment's pixels that must land on its class in the other view
    metal_cv: float = 0.4  # brightness spread (std / median) above which a segment looks metal
    material_gap: float = 0.15  # ... and the spread difference a material change needs besides
    min_area: float = 0.0008  # changed segments under this share of the image are dropped
    dilate_px: int = 1  # the masks are grown by this many pixels (anti-aliased object edges)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ObjectMasks:
    before: np.ndarray
    after: np.ndarray
    info: dict


@dataclass
class _View:
    classes: np.ndarray  # (H, W) int8: FLOOR, a hue index or ACHROMATIC
    labels: np.ndarray  # (H, W) int32 segment labels (0 = none)
    segments: list[dict]  # label, class, area, centroid, highlight share
    value: np.ndarray  # (H, W) float32 white-balanced brightness (1 = floor)


def _white_balance(image: np.ndarray) -> np.ndarray:
    rgb = image.astype(np.float32)
    floor = np.median(rgb.reshape(-1, 3), axis=0)
    return rgb / np.maximum(floor, 1.0)


def _hue(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hue in degrees and chroma (max − min over max) of white-balanced colours."""
    high, low = rgb.max(axis=-1), rgb.min(axis=-1)
    chroma = (high - low) / np.maximum(high, 1e-3)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    hue = np.degrees(np.arctan2(np.sqrt(3.0) * (g - b), 2.0 * r - g - b)) % 360.0
    return hue, chroma


def _floor_level(value: np.ndarray, floorish: np.ndarray) -> np.ndarray:
    """(H, 1) floor brightness per row: the 70th percentile of the floor-like pixels, smoothed over the rows."""
    height = value.shape[0]
    rows = np.full(height, np.nan, np.float32)
    for y in range(height):
        v = value[y][floorish[y]]
        if len(v) >= 8:
            rows[y] = np.percentile(v, 70)
    if np.isnan(rows).all():
        return np.ones((height, 1), np.float32)
    known = ~np.isnan(rows)
    rows = np.interp(np.arange(height), np.flatnonzero(known), rows[known]).astype(np.float32)
    kernel = max(3, (height // 16) | 1)
    return cv2.GaussianBlur(rows.reshape(-1, 1), (1, kernel), 0).reshape(-1, 1)


def _mode_filter(classes: np.ndarray, radius: int) -> np.ndarray:
    """Each pixel takes the most frequent class of its (2r+1)² box (floor included)."""
    if radius <= 0:
        return classes
    size = 2 * radius + 1
    best = np.zeros(classes.shape, np.float32)
    out = np.full(classes.shape, FLOOR, np.int8)
    for k in range(FLOOR, ACHROMATIC + 1):
        count = cv2.boxFilter((classes == k).astype(np.float32), -1, (size, size), normalize=False)
        better = count > best
        out[better], best[better] = k, count[better]
    return out


def describe_view(image: np.ndarray, settings: ObjectSettings) -> _View:
    """Colour classes, segments and their descriptions of one image."""
    rgb = _white_balance(image)
    value = rgb.mean(axis=-1)
    hue, chroma = _hue(rgb)
    coloured = chroma >= settings.chroma
    level = _floor_level(value, ~coloured)
    relative = value / np.maximum(level, 1e-3)
    grey_fg = ~coloured & ((relative < settings.dark) | (relative > settings.bright))
    distance = np.abs(((hue[..., None] - HUES) + 180.0) % 360.0 - 180.0)
    classes = np.full(image.shape[:2], FLOOR, np.int8)
    classes[coloured] = np.argmin(distance, axis=-1).astype(np.int8)[coloured]
    classes[grey_fg] = ACHROMATIC
    classes = _mode_filter(classes, settings.mode_px)
    labels = np.zeros(image.shape[:2], np.int32)
    segments: list[dict] = []
    highlight = relative > 1.15
    for k in range(ACHROMATIC + 1):
        count, component, stats, centroids = cv2.connectedComponentsWithStats((classes == k).astype(np.uint8), 8)
        for c in range(1, count):
            area = int(stats[c, cv2.CC_STAT_AREA])
            if area < settings.min_segment_px:
                continue
            pixels = component == c
            label = len(segments) + 1
            labels[pixels] = label
            segments.append(
                {
                    "label": label,
                    "class": k,
                    "area": area,
                    "centroid": centroids[c].astype(np.float64),
                    "highlight": float(highlight[pixels].mean()),
                }
            )
    return _View(classes, labels, segments, relative.astype(np.float32))


def _affine_to(matrix: np.ndarray | None) -> np.ndarray:
    return np.eye(3) if matrix is None else np.asarray(matrix, np.float64)


def _apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    homogeneous = np.concatenate([points, np.ones((len(points), 1))], axis=1) @ matrix.T
    return homogeneous[:, :2] / homogeneous[:, 2:3]


def _refine_fit(first: _View, second: _View, start: np.ndarray, radius: float) -> tuple[np.ndarray, int]:
    """A first→second similarity from segments of one class whose centroids lie within `radius` after `start`
    (nearest, mutual), by RANSAC; `start` when fewer than 3 such pairs agree. Returns (3x3, inliers)."""
    if not first.segments or not second.segments:
        return start, 0
    a = np.array([s["centroid"] for s in first.segments])
    b = np.array([s["centroid"] for s in second.segments])
    moved = _apply(start, a)
    classes_a = np.array([s["class"] for s in first.segments])
    classes_b = np.array([s["class"] for s in second.segments])
    distance = np.linalg.norm(moved[:, None] - b[None], axis=-1)
    distance[classes_a[:, None] != classes_b[None]] = np.inf
    pairs = [(i, int(np.argmin(distance[i]))) for i in range(len(a)) if np.isfinite(distance[i].min())]
    pairs = [(i, j) for i, j in pairs if distance[i, j] <= radius and int(np.argmin(distance[:, j])) == i]
    if len(pairs) < 3:
        return start, len(pairs)
    src = a[[i for i, _ in pairs]].astype(np.float32)
    dst = b[[j for _, j in pairs]].astype(np.float32)
    matrix, inliers = cv2.estimateAffinePartial2D(src, dst, method=cv2.RANSAC, ransacReprojThreshold=radius / 2)
    if matrix is None or inliers is None or int(inliers.sum()) < 3:
        return start, len(pairs)
    return np.vstack([matrix, [0.0, 0.0, 1.0]]), int(inliers.sum())


def _spread(values: np.ndarray) -> float | None:
    """Brightness spread std / median of an object's pixels: metal (dark body, white highlight) spreads more."""
    if len(values) < 8:
        return None
    return float(np.std(values) / max(float(np.median(values)), 1e-3))


def _presence(
    view: _View, other: _View, matrix: np.ndarray, settings: ObjectSettings
) -> list[tuple[float, float | None, float | None]]:
    """Per segment of `view`: (share of its pixels on its class in `other` at the best shift, its brightness
    spread here, the spread of its (hole-filled) region there at that shift)."""
    height, width = view.classes.shape
    results = []
    step = 2
    shifts = [
        (dx, dy)
        for dy in range(-settings.search_px, settings.search_px + 1, step)
        for dx in range(-settings.search_px, settings.search_px + 1, step)
    ]
    for segment in view.segments:
        ys, xs = np.nonzero(view.labels == segment["label"])
        mapped = _apply(matrix, np.stack([xs, ys], axis=1).astype(np.float64))
        mx, my = np.round(mapped[:, 0]).astype(int), np.round(mapped[:, 1]).astype(int)
        best, best_shift = 0.0, (0, 0)
        for dx, dy in shifts:
            x, y = mx + dx, my + dy
            inside = (x >= 0) & (x < width) & (y >= 0) & (y < height)
            share = float(np.count_nonzero(other.classes[y[inside], x[inside]] == segment["class"])) / len(xs)
            if share > best:
                best, best_shift = share, (dx, dy)
        fy, fx = np.nonzero(_fill(view.labels == segment["label"]))
        here = _spread(view.value[fy, fx])
        mapped = _apply(matrix, np.stack([fx, fy], axis=1).astype(np.float64))
        x = np.round(mapped[:, 0]).astype(int) + best_shift[0]
        y = np.round(mapped[:, 1]).astype(int) + best_shift[1]
        inside = (x >= 0) & (x < width) & (y >= 0) & (y < height)
        x, y = x[inside], y[inside]
        on_object = other.classes[y, x] != FLOOR
        there = _spread(other.value[y[on_object], x[on_object]])
        results.append((best, here, there))
    return results


def _fill(mask: np.ndarray) -> np.ndarray:
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    filled = np.zeros(mask.shape, np.uint8)
    cv2.drawContours(filled, contours, -1, 1, thickness=-1)
    return filled.astype(bool)


def localise_objects(before: np.ndarray, after: np.ndarray, settings: ObjectSettings | None = None) -> ObjectMasks:
    """The change masks of one pair (uint8 RGB images of one size), each in its own image's frame."""
    settings = settings or ObjectSettings()
    if before.shape != after.shape:
        raise ValueError(f"object localisation needs images of one size, got {before.shape} and {after.shape}")
    view_b, view_a = describe_view(before, settings), describe_view(after, settings)
    # estimate_registration maps after-frame pixels to the before frame
    after_to_before = estimate_registration(before, after, "ecc")
    start = np.linalg.inv(_affine_to(after_to_before))  # before → after
    radius = 3.0 * settings.search_px
    fit, matched = _refine_fit(view_b, view_a, start, radius)
    fit, matched = _refine_fit(view_b, view_a, fit, 1.5 * settings.search_px)
    inverse = np.linalg.inv(fit)
    area = before.shape[0] * before.shape[1]
    masks, records = {}, {}
    for name, view, other, matrix in (("before", view_b, view_a, fit), ("after", view_a, view_b, inverse)):
        mask = np.zeros(view.classes.shape, bool)
        changed = []
        for segment, (share, here, there) in zip(view.segments, _presence(view, other, matrix, settings)):
            reason = None
            if share < settings.present:
                reason = "absent"
            elif (
                here is not None
                and there is not None
                and abs(here - there) > settings.material_gap
                and (here - settings.metal_cv) * (there - settings.metal_cv) < 0
            ):
                reason = "material"
            if reason is None:
                continue
            pixels = _fill(view.labels == segment["label"])
            if pixels.sum() < settings.min_area * area:
                continue
            mask |= pixels
            changed.append(
                {
                    "class": int(segment["class"]),
                    "area_px": int(pixels.sum()),
                    "reason": reason,
                    "present": round(share, 3),
                    "centroid": [round(float(v), 1) for v in segment["centroid"]],
                }
            )
        if settings.dilate_px > 0 and mask.any():
            kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * settings.dilate_px + 1,) * 2)
            mask = cv2.dilate(mask.astype(np.uint8), kernel).astype(bool)
        masks[name] = mask
        records[name] = {"segments": len(view.segments), "changed": changed}
    info = {
        "localisation": "object",
        "fit": [round(float(v), 5) for v in fit[:2].reshape(-1)],
        "fit_matches": matched,
        "segments_before": records["before"]["segments"],
        "segments_after": records["after"]["segments"],
        "changed_before": records["before"]["changed"],
        "changed_after": records["after"]["changed"],
    }
    return ObjectMasks(masks["before"], masks["after"], info)


def object_pair(pair, settings: ObjectSettings):
    """`preprocess masks --localisation object` for one ChangePair: its masks as a mask_pipeline.PairResult (the
    before image resized to the after size when they differ, as `--localisation pixel` does)."""
    from davir.data.images import load_pair
    from davir.preprocessing.mask_pipeline import PairResult

    before, after = load_pair(pair)
    before_array, after_array = np.asarray(before), np.asarray(after)
    return PairResult(pair.pair_id, *object_result(before_array, after_array, settings))


def object_result(
    before: np.ndarray, after: np.ndarray, settings: ObjectSettings
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(before mask, after mask, the cache's JSON record) of one loaded pair."""
    masks = localise_objects(before, after, settings)
    area = before.shape[0] * before.shape[1]
    info = {
        "image_size": list(after.shape[:2]),
        **masks.info,
        "clusters": [],
        "kept_after": len(masks.info["changed_after"]),
        "kept_before": len(masks.info["changed_before"]),
        "area_after": round(float(masks.after.sum()) / area, 6),
        "area_before": round(float(masks.before.sum()) / area, 6),
    }
    return masks.before, masks.after, info


class OnlineObjectMasks:
    """`OnlineMasks` (davir.preprocessing.online) for a cache made with `--localisation object`: the masks of one
    pair with the recorded ObjectSettings (same `__call__`, `from_arrays` and `settings_dict`)."""

    def __init__(self, settings: ObjectSettings):
        self.settings = settings

    @classmethod
    def from_recorded(cls, recorded: dict) -> OnlineObjectMasks:
        """From a mask cache's manifest settings ({"localisation": "object", "object": {...}})."""
        return cls(ObjectSettings(**(recorded.get("object") or {})))

    def settings_dict(self) -> dict:
        return {"localisation": "object", "object": self.settings.to_dict(), "segment_both": True}

    def __call__(self, pair):
        from davir.data.caches import PairMasks

        result = object_pair(pair, self.settings)
        return PairMasks(before=result.before, after=result.after, info=result.info)

    def from_arrays(self, pair_id: str, before: np.ndarray, after: np.ndarray):
        from davir.data.caches import PairMasks

        mask_before, mask_after, info = object_result(before, after, self.settings)
        return PairMasks(before=mask_before, after=mask_after, info=info)
