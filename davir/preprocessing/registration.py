"""Alignment of the before image to the after image, beyond the paper (`register`, `photometric` settings).

* `match_illumination`: per-channel gain and offset of the before image fitted to the after image
  (robust least squares), so a global light change does not pass δ everywhere.
* `estimate_registration`: an after→before homography (ECC affine, or ORB + RANSAC);
  `warp_to_after_frame` resamples the before image in the after frame.
"""

from __future__ import annotations

import cv2
import numpy as np

REGISTRATIONS = ("none", "ecc", "orb")
MIN_REGISTRATION_SIDE = 16  # px of the smaller side below which no registration is estimated
PHOTOMETRIC = ("none", "affine")


def _disk(radius: int) -> np.ndarray:
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1, 2 * radius + 1))


def match_illumination(
    before: np.ndarray, after: np.ndarray, valid: np.ndarray | None = None, keep: float = 0.8, stride: int = 3
) -> np.ndarray:
    """The before image with per-channel gain and offset fitted to the after image (uint8 out).

    Least squares of after_c ≈ g_c · before_c + o_c over the `valid` pixels (every `stride`-th row
    and column), refitted once on the `keep` share of pixels with the smallest residual: changed
    pixels are outliers to a global light change and must not bias it.
    """
    b = before[::stride, ::stride].reshape(-1, 3).astype(np.float32)
    a = after[::stride, ::stride].reshape(-1, 3).astype(np.float32)
    if valid is not None:
        use = valid[::stride, ::stride].reshape(-1)
        b, a = b[use], a[use]
    if len(b) < 16:
        return before

    def fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean_x, mean_y = x.mean(axis=0), y.mean(axis=0)
        var = ((x - mean_x) ** 2).mean(axis=0)
        cov = ((x - mean_x) * (y - mean_y)).mean(axis=0)
        gain = np.where(var > 1e-3, cov / np.maximum(var, 1e-3), 1.0)
        return gain, mean_y - gain * mean_x

    gain, offset = fit(b, a)
    residual = np.abs(b * gain + offset - a).sum(axis=1)
    cut = np.partition(residual, int(keep * (len(residual) - 1)))[int(keep * (len(residual) - 1))]
    inliers = residual <= cut
    if inliers.sum() >= 16:
        gain, offset = fit(b[inliers], a[inliers])
    # A per-channel affine map of uint8 values is a 256-entry lookup table.
    levels = np.arange(256, dtype=np.float32)[:, None] * gain + offset
    table = np.clip(levels + 0.5, 0, 255).astype(np.uint8).reshape(256, 1, 3)
    return cv2.LUT(before, table)


def estimate_registration(before: np.ndarray, after: np.ndarray, method: str) -> np.ndarray | None:
    """A 3x3 homography mapping after-frame pixels to before-frame pixels, or None on failure.

    `ecc`: OpenCV findTransformECC, affine, on grey levels (the template is the after image);
    when ECC does not converge, the `orb` estimate is used.
    `orb`: ORB keypoints, Hamming cross-checked matches, RANSAC homography (≥ 10 inliers).
    """
    if method not in REGISTRATIONS:
        raise ValueError(f"unknown registration {method!r}; choose from {REGISTRATIONS}")
    if min(after.shape[:2]) < MIN_REGISTRATION_SIDE or before.shape != after.shape:
        return None  # nothing to align in a few pixels (OpenCV's estimators raise on them)
    grey_b = cv2.cvtColor(before, cv2.COLOR_RGB2GRAY)
    grey_a = cv2.cvtColor(after, cv2.COLOR_RGB2GRAY)
    if method == "ecc":
        # Estimated at ≤ 112 px (a quarter of the pixels, same accuracy after scaling for the
        # small camera moves it has to undo), then expressed at the given resolution.
        scale = min(1.0, 112 / max(grey_a.shape))
        size = (max(8, round(grey_a.shape[1] * scale)), max(8, round(grey_a.shape[0] * scale)))
        small_a = cv2.resize(grey_a, size, interpolation=cv2.INTER_AREA).astype(np.float32)
        small_b = cv2.resize(grey_b, size, interpolation=cv2.INTER_AREA).astype(np.float32)
        warp = np.eye(2, 3, dtype=np.float32)
        criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 50, 1e-4)
        try:
            _, warp = cv2.findTransformECC(small_a, small_b, warp, cv2.MOTION_AFFINE, criteria, None, 3)
        except cv2.error:  # did not converge (large photometric + geometric change): try keypoints
            return estimate_registration(before, after, "orb")
        matrix = np.vstack([warp, [0.0, 0.0, 1.0]]).astype(np.float64)
        return scale_homography(matrix, grey_a.shape[1] / size[0], grey_a.shape[0] / size[1])
    if method == "orb":
        orb = cv2.ORB_create(nfeatures=1000, edgeThreshold=15, patchSize=15, fastThreshold=10)
        try:
            kp_b, des_b = orb.detectAndCompute(grey_b, None)
            kp_a, des_a = orb.detectAndCompute(grey_a, None)
        except cv2.error:
            return None
        if des_b is None or des_a is None or len(kp_b) < 10 or len(kp_a) < 10:
            return None
        matches = cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=True).match(des_a, des_b)
        if len(matches) < 10:
            return None
        src = np.float32([kp_a[m.queryIdx].pt for m in matches])
        dst = np.float32([kp_b[m.trainIdx].pt for m in matches])
        homography, inliers = cv2.findHomography(src, dst, cv2.RANSAC, 3.0)
        if homography is None or int(inliers.sum()) < 10:
            return None
        return homography.astype(np.float64)
    raise ValueError(f"unknown registration {method!r}; choose from {REGISTRATIONS}")


def warp_to_after_frame(before: np.ndarray, after_to_before: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The before image resampled in the after frame, and the bool map of pixels it covers."""
    h, w = before.shape[:2]
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    warped = cv2.warpPerspective(before, after_to_before, (w, h), flags=flags, borderMode=cv2.BORDER_REPLICATE)
    covered = cv2.warpPerspective(
        np.ones((h, w), np.uint8),
        after_to_before,
        (w, h),
        flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=0,
    )
    # Two pixels of margin: the border row is interpolated half from outside the image.
    covered = cv2.erode(covered, _disk(2)).astype(bool)
    return warped, covered


def scale_homography(matrix: np.ndarray, scale_x: float, scale_y: float) -> np.ndarray:
    """Express a working-resolution homography in image pixels (x_img = s · x_work)."""
    scale = np.diag([scale_x, scale_y, 1.0])
    return scale @ matrix @ np.linalg.inv(scale)


def map_points(points: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    return cv2.perspectiveTransform(points.reshape(-1, 1, 2).astype(np.float64), matrix).reshape(-1, 2)
