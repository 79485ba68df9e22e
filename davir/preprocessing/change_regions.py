"""Change regions of DAVIR §3.1: difference map, threshold, DBSCAN clusters, prompts, IoU filter, union.

    regions = find_change_regions(before, after, RegionSettings())   # Eq. 2 → clusters and prompts
    ...segment each prompt in each image (davir.preprocessing.segmenters)...
    mask, kept, ious = change_mask_union(candidates, regions.regions_after, tau)   # Eq. 3

The choices the paper leaves open (working resolution, difference, registration, photometric matching,
clustering) and the paper's literal reading: docs/preprocessing.md, "Change regions".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import cv2
import numpy as np
from sklearn.cluster import DBSCAN

from davir.preprocessing.registration import (
    PHOTOMETRIC,
    REGISTRATIONS,
    estimate_registration,
    map_points,
    match_illumination,
    scale_homography,
    warp_to_after_frame,
)


@dataclass(frozen=True)
class RegionSettings:
    """Settings of Eq. 2 and of the IoU filter of Eq. 3 (pixel sizes are in working-resolution pixels)."""

    work_size: int = 224  # long side of the working resolution (smaller images are not upscaled)
    blur_sigma: float = 1.0  # Gaussian pre-blur before differencing
    threshold: float = 0.05  # δ of Eq. 2, on the [0, 1] difference map
    open_px: int = 1  # radius of a morphological opening of the thresholded map (0 = off)
    eps: float = 1.5  # DBSCAN neighbourhood radius (in clustering-grid units, see cluster_stride)
    min_samples: int = 4  # DBSCAN core-point count (points of the clustering grid)
    min_area: float = 0.001  # clusters under this share of the working image are dropped
    max_points: int = 5000  # points fed to DBSCAN at most (beyond: a subsample; only when most of the image changed)
    tolerance_px: int = 2  # misalignment tolerance of the difference map (0 = plain |I_s − I_t|)
    cluster_stride: int = 2  # DBSCAN on s×s blocks of changed pixels (1 = on every pixel); eps counts blocks
    close_px: int = 2  # closing radius that turns a cluster's pixels into its region
    region_hull: bool = True  # R_c = convex hull of the cluster instead of its closed pixels
    dilate_px: int = 1  # dilation of R_c for the IoU filter
    tau: float = 0.4  # τ of Eq. 3
    register: str = "ecc"  # none | ecc | orb
    photometric: str = "affine"  # none | affine: per-channel gain/offset of before fitted to after
    seed: int = 0

    def __post_init__(self) -> None:
        if self.register not in REGISTRATIONS:
            raise ValueError(f"register must be one of {REGISTRATIONS}, got {self.register!r}")
        if self.photometric not in PHOTOMETRIC:
            raise ValueError(f"photometric must be one of {PHOTOMETRIC}, got {self.photometric!r}")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold δ must be in [0, 1), got {self.threshold}")
        if self.work_size < 16:
            raise ValueError(f"work_size must be at least 16 px, got {self.work_size}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Cluster:
    """One DBSCAN cluster of changed pixels, in working-resolution (row, col) coordinates."""

    label: int
    pixels: np.ndarray  # (n, 2) int rows/cols of the cluster's changed pixels
    box: tuple[int, int, int, int]  # (x0, y0, x1, y1): x0/y0 inclusive, x1/y1 exclusive (pixel edges)
    centre: tuple[float, float]  # (x, y) continuous coordinates of a pixel centre on the cluster

    @property
    def size(self) -> int:
        return int(len(self.pixels))


@dataclass
class Prompt:
    """Location prompt P_c = (B_c, C_c) in one image's pixel coordinates (SAM's XYXY box and (x, y) point)."""

    box: tuple[float, float, float, float]
    point: tuple[float, float]
    cluster: int

    def to_dict(self) -> dict:
        return {
            "cluster": self.cluster,
            "box": [round(v, 2) for v in self.box],
            "point": [round(v, 2) for v in self.point],
        }


@dataclass
class ChangeRegions:
    """Everything Eq. 2 yields for one pair, in both image frames."""

    image_size: tuple[int, int]  # (H, W) of the images
    work_size: tuple[int, int]  # (h, w) of the working resolution
    diff: np.ndarray  # (h, w) float32 difference map in the after frame
    changed: np.ndarray  # (h, w) bool thresholded map
    clusters: list[Cluster]
    prompts_after: list[Prompt]
    prompts_before: list[Prompt]
    regions_after: list[np.ndarray]  # R_c (dilated) per cluster, image resolution, after frame
    regions_before: list[np.ndarray]  # the same regions mapped into the before frame
    after_to_before: np.ndarray | None  # 3x3 homography in image pixels, None = identity
    registration: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# Working resolution
# ----------------------------------------------------------------------------------------------


def working_shape(height: int, width: int, work_size: int) -> tuple[int, int]:
    """(h, w) with the long side at `work_size`; images already smaller keep their size."""
    scale = min(1.0, work_size / max(height, width))
    return max(1, round(height * scale)), max(1, round(width * scale))


def to_working(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Area-resample an (H, W, 3) uint8 image to (h, w)."""
    if image.shape[:2] == shape:
        return image
    return cv2.resize(image, (shape[1], shape[0]), interpolation=cv2.INTER_AREA)


def _disk(radius: int) -> np.ndarray:
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))


def _channel_sum(image: np.ndarray) -> np.ndarray:
    """R + G + B of a uint8 (h, w, 3) image as uint16 (a numpy sum over the short last axis is 10x slower)."""
    red, green, blue = cv2.split(image)
    return cv2.add(cv2.add(red, green, dtype=cv2.CV_16U), blue, dtype=cv2.CV_16U)


def fill_holes(mask: np.ndarray) -> np.ndarray:
    """Bool mask with every background pocket not connected to the border filled (OpenCV flood fill)."""
    if not mask.any():
        return mask.astype(bool)
    padded = np.pad(mask.astype(np.uint8), 1)
    outside = padded.copy()
    flood = np.zeros((padded.shape[0] + 2, padded.shape[1] + 2), np.uint8)
    cv2.floodFill(outside, flood, (0, 0), 1)  # everything reachable from the border becomes 1
    return (padded.astype(bool) | ~outside.astype(bool))[1:-1, 1:-1]


# ----------------------------------------------------------------------------------------------
# Eq. 2: C = DBSCAN(Diff(I_s, I_t) > δ)
# ----------------------------------------------------------------------------------------------


def difference_map(before: np.ndarray, after: np.ndarray, blur_sigma: float = 1.0) -> np.ndarray:
    """Diff(I_s, I_t) of Eq. 2: mean over RGB of |I_s − I_t| in [0, 1], after a Gaussian pre-blur.

    `before`, `after`: (h, w, 3) uint8 in the same frame. The pre-blur (σ in pixels, 0 = none)
    suppresses resampling and compression noise, which would otherwise pass δ as single pixels.
    """
    if before.shape != after.shape:
        raise ValueError(f"difference_map needs images of one shape, got {before.shape} and {after.shape}")
    if blur_sigma > 0:
        before = cv2.GaussianBlur(before, (0, 0), blur_sigma)
        after = cv2.GaussianBlur(after, (0, 0), blur_sigma)
    # Blur and difference in uint8 (rounding ≤ 0.5/255), summed in uint16: far cheaper than float maths.
    total = _channel_sum(cv2.absdiff(before, after))
    return total.astype(np.float32) * np.float32(1.0 / (3 * 255))


def tolerant_difference_map(
    before: np.ndarray, after: np.ndarray, blur_sigma: float = 1.0, tolerance_px: int = 1
) -> np.ndarray:
    """Diff(I_s, I_t) of Eq. 2 made tolerant to misalignment of up to `tolerance_px` pixels.

    For each pixel and channel, the distance of one image's value to the [min, max] range of the
    other image's values within a (2r+1)² square, taken both ways, maxed, then averaged over RGB
    (in [0, 1]). A colour or an object that is really new stays far from every neighbour's value;
    an edge that only moved by ≤ r pixels (parallax left over by registration) finds its value
    nearby and vanishes. r = 0 is exactly `difference_map`.
    """
    if tolerance_px <= 0:
        return difference_map(before, after, blur_sigma)
    if before.shape != after.shape:
        raise ValueError(f"difference_map needs images of one shape, got {before.shape} and {after.shape}")
    if blur_sigma > 0:
        before = cv2.GaussianBlur(before, (0, 0), blur_sigma)
        after = cv2.GaussianBlur(after, (0, 0), blur_sigma)
    square = np.ones((2 * tolerance_px + 1, 2 * tolerance_px + 1), np.uint8)
    total = None
    for source, target in ((before, after), (after, before)):
        low, high = cv2.erode(source, square), cv2.dilate(source, square)
        # distance of target to [low, high]: saturating uint8 subtraction does the clamping
        # (one of the two terms is 0 per channel, so their uint8 sum cannot overflow)
        outside = cv2.add(cv2.subtract(target, high), cv2.subtract(low, target))
        channel_sum = _channel_sum(outside)
        total = channel_sum if total is None else np.maximum(total, channel_sum)
    return total.astype(np.float32) * np.float32(1.0 / (3 * 255))


def threshold_difference(
    diff: np.ndarray, threshold: float, open_px: int = 0, valid: np.ndarray | None = None
) -> np.ndarray:
    """The `Diff > δ` of Eq. 2: a bool map of changed pixels.

    An optional opening of radius `open_px` removes specks thinner than the disk; `valid` (bool)
    excludes pixels with no counterpart after registration (the warped image's empty border).
    """
    changed = diff > threshold
    if valid is not None:
        changed &= valid
    if open_px > 0 and changed.any():
        changed = cv2.morphologyEx(changed.astype(np.uint8), cv2.MORPH_OPEN, _disk(open_px)).astype(bool)
    return changed


def cluster_changed_pixels(
    changed: np.ndarray,
    eps: float,
    min_samples: int,
    min_area: float = 0.0,
    max_points: int = 20000,
    seed: int = 0,
    stride: int = 1,
) -> list[Cluster]:
    """The DBSCAN of Eq. 2: spatially coherent clusters C of the changed pixels, largest first.

    DBSCAN (scikit-learn) runs on the (row, col) coordinates of the True pixels of `changed`; noise
    (label −1) is dropped, and so are clusters with fewer than `min_area` × (h·w) pixels. With
    `stride` s > 1 the points are the s×s blocks holding a changed pixel (eps and min_samples then
    count blocks) and every changed pixel joins its block's cluster: the same grouping from 1/s² of
    the points, which is what keeps DBSCAN cheap. Beyond `max_points` points a deterministic random
    subset is clustered (cluster sizes are scaled back by the sampling rate).
    """
    height, width = changed.shape
    if stride > 1:
        rows, cols = -(-height // stride), -(-width // stride)
        padded = np.zeros((rows * stride, cols * stride), dtype=bool)
        padded[:height, :width] = changed
        grid = padded.reshape(rows, stride, cols, stride).any(axis=(1, 3))
    else:
        grid = changed
    points = np.argwhere(grid)
    if len(points) == 0:
        return []
    rate = 1.0
    if len(points) > max_points:
        rng = np.random.default_rng(seed)
        points = points[np.sort(rng.choice(len(points), size=max_points, replace=False))]
        rate = max_points / int(grid.sum())
    labels = DBSCAN(eps=eps, min_samples=min_samples).fit_predict(points.astype(np.float32))
    label_map = np.full(grid.shape, -1, dtype=np.int64)
    label_map[points[:, 0], points[:, 1]] = labels
    pixels = np.argwhere(changed)
    pixel_labels = label_map[pixels[:, 0] // stride, pixels[:, 1] // stride]
    order = np.argsort(pixel_labels, kind="stable")
    found, starts = np.unique(pixel_labels[order], return_index=True)
    min_pixels = min_area * changed.size
    clusters: list[Cluster] = []
    for label, members in zip(found, np.split(order, starts[1:])):
        if label < 0 or len(members) / rate < min_pixels:
            continue
        clusters.append(cluster_from_pixels(int(label), pixels[members]))
    clusters.sort(key=lambda c: (-c.size, c.box))
    for index, cluster in enumerate(clusters):
        cluster.label = index
    return clusters


def cluster_from_pixels(label: int, pixels: np.ndarray) -> Cluster:
    """Bounding box B_c and centre point C_c of one cluster (the location prompt P_c of §3.1)."""
    rows, cols = pixels[:, 0], pixels[:, 1]
    box = (int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1)
    centroid = pixels.mean(axis=0)
    on_cluster = np.any(np.all(pixels == np.floor(centroid).astype(int), axis=1))
    if on_cluster:
        row, col = centroid
    else:  # a ring-shaped or concave cluster: the positive point must lie on the change itself
        row, col = pixels[np.argmin(((pixels - centroid) ** 2).sum(axis=1))].astype(float)
    return Cluster(label=label, pixels=pixels, box=box, centre=(float(col) + 0.5, float(row) + 0.5))


def cluster_region(
    cluster: Cluster, shape: tuple[int, int], close_px: int = 2, dilate_px: int = 0, hull: bool = False
) -> np.ndarray:
    """R_c: the cluster's pixels as a (h, w) bool region, dilated by `dilate_px`.

    Either closed (radius `close_px`) and hole-filled, or (`hull=True`) the convex hull of the
    pixels — an object whose change shows as a ring or arcs (a recoloured metal sphere keeps its
    highlight) then yields one solid region instead of a thin outline.
    """
    region = np.zeros(shape, dtype=np.uint8)
    if hull:
        points = np.ascontiguousarray(cluster.pixels[:, ::-1]).astype(np.int32)
        cv2.fillConvexPoly(region, cv2.convexHull(points), 1)
        region[cluster.pixels[:, 0], cluster.pixels[:, 1]] = 1
    else:
        region[cluster.pixels[:, 0], cluster.pixels[:, 1]] = 1
        if close_px > 0:
            region = cv2.morphologyEx(region, cv2.MORPH_CLOSE, _disk(close_px))
        region = fill_holes(region).astype(np.uint8)
    if dilate_px > 0:
        region = cv2.dilate(region, _disk(dilate_px))
    return region.astype(bool)


# ----------------------------------------------------------------------------------------------
# Eq. 3: M = ∪_{i: IoU_i ≥ τ} S(I, p_i)
# ----------------------------------------------------------------------------------------------


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two bool masks of one shape (0 when both are empty)."""
    union = np.count_nonzero(a | b)
    return float(np.count_nonzero(a & b) / union) if union else 0.0


def best_candidate(candidates: np.ndarray, region: np.ndarray) -> tuple[int, float]:
    """Index and IoU of the candidate mask (K, H, W) that best matches the cluster region R_c.

    SAM returns three masks per prompt (multimask_output=True); the one agreeing best with the
    detected change is the one Eq. 3 judges.
    """
    ious = [mask_iou(mask, region) for mask in candidates]
    best = int(np.argmax(ious))
    return best, ious[best]


def iou_filter(masks: list[np.ndarray], regions: list[np.ndarray], tau: float) -> tuple[list[bool], list[float]]:
    """The condition `IoU_i ≥ τ` of Eq. 3: which predicted masks M_c agree with their region R_c."""
    if len(masks) != len(regions):
        raise ValueError(f"{len(masks)} masks but {len(regions)} regions")
    ious = [mask_iou(m, r) for m, r in zip(masks, regions)]
    return [iou >= tau for iou in ious], ious


def union_of_masks(masks: list[np.ndarray], keep: list[bool], shape: tuple[int, int]) -> np.ndarray:
    """The union ∪ of Eq. 3 over the kept masks; an all-False (H, W) mask when none is kept."""
    union = np.zeros(shape, dtype=bool)
    for mask, kept in zip(masks, keep):
        if kept:
            union |= mask
    return union


def change_mask_union(
    candidates: list[np.ndarray], regions: list[np.ndarray], tau: float, shape: tuple[int, int]
) -> tuple[np.ndarray, list[bool], list[float], list[int]]:
    """Eq. 3 for one image: pick each prompt's best candidate, keep those with IoU ≥ τ, take the union.

    `candidates[i]` is (K, H, W) bool, the segmenter's masks for prompt i. Returns the final mask,
    the kept flags, the IoUs and the chosen candidate index per prompt.
    """
    chosen, choice = [], []
    for masks, region in zip(candidates, regions):
        index, _ = best_candidate(masks, region)
        chosen.append(masks[index])
        choice.append(index)
    keep, ious = iou_filter(chosen, regions, tau)
    return union_of_masks(chosen, keep, shape), keep, ious, choice


# ----------------------------------------------------------------------------------------------
# One pair
# ----------------------------------------------------------------------------------------------


def _resize_mask(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    if mask.shape == shape:
        return mask
    return cv2.resize(mask.astype(np.uint8), (shape[1], shape[0]), interpolation=cv2.INTER_NEAREST).astype(bool)


def _prompt_in_image(cluster: Cluster, scale_x: float, scale_y: float, width: int, height: int) -> Prompt:
    x0, y0, x1, y1 = cluster.box
    cx, cy = cluster.centre
    box = (x0 * scale_x, y0 * scale_y, min(x1 * scale_x, width), min(y1 * scale_y, height))
    return Prompt(box=box, point=(cx * scale_x, cy * scale_y), cluster=cluster.label)


def _prompt_in_before(prompt: Prompt, after_to_before: np.ndarray, width: int, height: int) -> Prompt:
    x0, y0, x1, y1 = prompt.box
    corners = map_points(np.array([[x0, y0], [x1, y0], [x0, y1], [x1, y1]]), after_to_before)
    ((px, py),) = map_points(np.array([prompt.point]), after_to_before)
    box = (
        float(np.clip(corners[:, 0].min(), 0, width)),
        float(np.clip(corners[:, 1].min(), 0, height)),
        float(np.clip(corners[:, 0].max(), 0, width)),
        float(np.clip(corners[:, 1].max(), 0, height)),
    )
    point = (float(np.clip(px, 0, width - 1e-3)), float(np.clip(py, 0, height - 1e-3)))
    return Prompt(box=box, point=point, cluster=prompt.cluster)


def find_change_regions(before: np.ndarray, after: np.ndarray, settings: RegionSettings) -> ChangeRegions:
    """Eq. 2 for one pair: difference map, threshold, DBSCAN, and per-cluster prompts and regions.

    `before`, `after`: (H, W, 3) uint8 RGB of one size. Returns prompts and regions R_c in both
    image frames (identical without registration).
    """
    if before.shape != after.shape or before.ndim != 3:
        raise ValueError(
            f"before and after must be (H, W, 3) arrays of one shape, got {before.shape} and {after.shape}"
        )
    height, width = after.shape[:2]
    shape = working_shape(height, width, settings.work_size)
    small_b, small_a = to_working(before, shape), to_working(after, shape)
    scale_x, scale_y = width / shape[1], height / shape[0]

    after_to_before = work_after_to_before = valid = None
    registration: dict = {"method": settings.register}
    if settings.register != "none":
        plain = difference_map(small_b, small_a, settings.blur_sigma)
        matrix = estimate_registration(small_b, small_a, settings.register)
        registration["status"] = "failed" if matrix is None else "rejected"
        if matrix is not None:
            warped, covered = warp_to_after_frame(small_b, matrix)
            registered = difference_map(warped, small_a, settings.blur_sigma)
            # Keep the transform only when it explains the pair better than the identity does.
            if covered.mean() > 0.5 and registered[covered].mean() < plain[covered].mean():
                small_b, valid, work_after_to_before = warped, covered, matrix
                after_to_before = scale_homography(matrix, scale_x, scale_y)
                registration["status"] = "applied"
                registration["matrix"] = [[round(float(v), 5) for v in row] for row in after_to_before]

    if settings.photometric == "affine":
        small_b = match_illumination(small_b, small_a, valid)
    diff = tolerant_difference_map(small_b, small_a, settings.blur_sigma, settings.tolerance_px)
    changed = threshold_difference(diff, settings.threshold, settings.open_px, valid)
    clusters = cluster_changed_pixels(
        changed,
        settings.eps,
        settings.min_samples,
        settings.min_area,
        settings.max_points,
        settings.seed,
        settings.cluster_stride,
    )

    prompts_after, prompts_before, regions_after, regions_before = [], [], [], []
    for cluster in clusters:
        region = cluster_region(cluster, shape, settings.close_px, settings.dilate_px, settings.region_hull)
        prompt = _prompt_in_image(cluster, scale_x, scale_y, width, height)
        prompts_after.append(prompt)
        regions_after.append(_resize_mask(region, (height, width)))
        if after_to_before is None:
            prompts_before.append(prompt)
            regions_before.append(regions_after[-1])
        else:
            prompts_before.append(_prompt_in_before(prompt, after_to_before, width, height))
            # Forward map after → before: the region lands where the change sits in the before image.
            small_region = cv2.warpPerspective(
                region.astype(np.uint8), work_after_to_before, (shape[1], shape[0]), flags=cv2.INTER_NEAREST
            )
            regions_before.append(_resize_mask(small_region.astype(bool), (height, width)))
    return ChangeRegions(
        image_size=(height, width),
        work_size=shape,
        diff=diff,
        changed=changed,
        clusters=clusters,
        prompts_after=prompts_after,
        prompts_before=prompts_before,
        regions_after=regions_after,
        regions_before=regions_before,
        after_to_before=after_to_before,
        registration=registration,
    )
