"""Five-panel picture of one pair's change-mask extraction (written by `python -m preprocess masks --viz`).

    before (+ before mask outline) | after (+ after mask outline) | difference map |
    clusters with boxes and centre points (kept: green, dropped: red) | final mask over the after image

with a title bar and an optional line of text under it (a caption or the retrieved entity).
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

PALETTE = np.array(
    [
        (230, 25, 75),
        (60, 180, 75),
        (255, 225, 25),
        (0, 130, 200),
        (245, 130, 48),
        (145, 30, 180),
        (70, 240, 240),
        (240, 50, 230),
        (210, 245, 60),
        (250, 190, 212),
        (0, 128, 128),
        (220, 190, 255),
    ],
    dtype=np.uint8,
)
KEPT, DROPPED = (40, 220, 60), (235, 40, 40)


def _resize(image: np.ndarray, size: tuple[int, int], nearest: bool = False) -> np.ndarray:
    return cv2.resize(image, size, interpolation=cv2.INTER_NEAREST if nearest else cv2.INTER_AREA)


def _outline(image: np.ndarray, mask: np.ndarray | None, colour: tuple[int, int, int]) -> np.ndarray:
    """Draw the contour of a bool mask (already at the panel size) on an RGB image."""
    out = image.copy()
    if mask is not None and mask.any():
        contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        cv2.drawContours(out, contours, -1, colour, 2)
    return out


def difference_panel(diff: np.ndarray, size: tuple[int, int], full_scale: float = 0.4) -> np.ndarray:
    """The [0, 1] difference map as an inferno heat map; `full_scale` maps to the brightest colour."""
    level = np.clip(diff / full_scale, 0, 1)
    heat = cv2.applyColorMap((level * 255).astype(np.uint8), cv2.COLORMAP_INFERNO)
    return _resize(cv2.cvtColor(heat, cv2.COLOR_BGR2RGB), size, nearest=True)


def draw_mask_panels(
    before: np.ndarray,
    after: np.ndarray,
    diff: np.ndarray,
    labels: np.ndarray,
    boxes: Sequence[Sequence[float]],
    points: Sequence[Sequence[float]],
    kept: Sequence[bool],
    mask_before: np.ndarray | None,
    mask_after: np.ndarray | None,
    title: str = "",
    caption: str | None = None,
    panel_height: int = 200,
) -> Image.Image:
    """Compose the five panels.

    `before`, `after`: (H, W, 3) uint8; `diff`: (h, w) float difference map and `labels`: (h, w) int
    cluster label per working pixel (−1 = none), both at the working resolution; `boxes` (XYXY) and
    `points` (x, y) in image pixels, one per cluster, with `kept[i]` from the IoU filter; masks (H, W)
    bool in each image's frame, None when not computed.
    """
    height, width = after.shape[:2]
    scale = panel_height / height
    size = (max(1, round(width * scale)), panel_height)

    def panel_mask(mask: np.ndarray | None) -> np.ndarray | None:
        return None if mask is None else _resize(mask.astype(np.uint8), size, nearest=True).astype(bool)

    small_before = _resize(before, size)
    small_after = _resize(after, size)
    p_before, p_after = panel_mask(mask_before), panel_mask(mask_after)
    panels = [
        _outline(small_before, p_before, (0, 255, 255)),
        _outline(small_after, p_after, (255, 255, 0)),
        difference_panel(diff, size),
    ]

    cluster_panel = (small_after * 0.35).astype(np.uint8)
    label_map = _resize(labels.astype(np.int32).astype(np.float32), size, nearest=True).astype(np.int32)
    on = label_map >= 0
    cluster_panel[on] = PALETTE[label_map[on] % len(PALETTE)]
    for box, point, keep in zip(boxes, points, kept):
        colour = KEPT if keep else DROPPED
        x0, y0, x1, y1 = (round(v * scale) for v in box)
        cv2.rectangle(cluster_panel, (x0, y0), (max(x0, x1 - 1), max(y0, y1 - 1)), colour, 1)
        cv2.circle(cluster_panel, (round(point[0] * scale), round(point[1] * scale)), 3, (255, 255, 255), -1)
        cv2.circle(cluster_panel, (round(point[0] * scale), round(point[1] * scale)), 3, colour, 1)
    panels.append(cluster_panel)

    union = None
    for mask in (p_before, p_after):
        if mask is not None:
            union = mask if union is None else union | mask
    final = small_after.copy()
    if union is not None and union.any():
        final[union] = (0.45 * final[union] + 0.55 * np.array([255, 30, 30])).astype(np.uint8)
    panels.append(_outline(final, union, (255, 255, 255)))

    gap = 4
    names = ("before", "after", "difference", "clusters / boxes", "change mask")
    font = ImageFont.load_default()
    header, footer = 30, 18 if caption else 0
    canvas = Image.new("RGB", (len(panels) * (size[0] + gap) - gap, panel_height + header + footer), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    draw.text((2, 1), title, fill=(0, 0, 0), font=font)
    for i, (panel, name) in enumerate(zip(panels, names)):
        x = i * (size[0] + gap)
        canvas.paste(Image.fromarray(panel), (x, header))
        draw.text((x + 2, header - 13), name, fill=(60, 60, 60), font=font)
    if caption:
        draw.text((2, header + panel_height + 3), caption, fill=(0, 0, 0), font=font)
    return canvas
