"""The localisation score of `evaluate.py --checkpoint`: how much of DAVIR's attention falls on the change.

masks = change_masks(pairs, mask_cache="caches/masks")      # ground-truth masks, else preprocessed ones
localisation_summary(results, masks)                        # results: CaptionResult with attention maps
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from davir.data.records import ChangePair

# A patch counts as inside the change when the mask covers at least this share of it (as in the calibration).
INSIDE_COVERAGE = 0.25


def patch_coverage(mask: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Share of each patch covered by a boolean mask (any resolution) on a (rows, cols) patch grid."""
    image = Image.fromarray(np.asarray(mask, dtype=np.float32), mode="F")
    return np.asarray(image.resize((grid[1], grid[0]), Image.BOX), dtype=np.float64)


def attention_localisation(attention: np.ndarray, mask: np.ndarray) -> dict[str, float] | None:
    """Share of the attention mass on patches inside the change mask, pointing hit, and the uniform baseline.

    `attention` (Hp, Wp) sums to 1; `mask` any-resolution bool in the same image frame. None for an
    empty mask (nothing to point at).
    """
    inside = patch_coverage(mask, attention.shape) >= INSIDE_COVERAGE
    if not inside.any():
        return None
    share = float(attention[inside].sum() / max(attention.sum(), 1e-12))
    peak = np.unravel_index(int(np.argmax(attention)), attention.shape)
    return {"share": share, "pointing": float(inside[peak]), "uniform": float(inside.mean())}


def localisation_summary(results: Sequence, masks: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """Mean attention share inside the change mask and pointing accuracy over every image with a non-empty mask.

    `results`: objects with `pair_id`, `error`, `attention_before`, `attention_after` (CaptionResult)."""
    rows = []
    for result in results:
        if result.error or result.pair_id not in masks:
            continue
        mask_before, mask_after = masks[result.pair_id]
        for attention, mask in ((result.attention_before, mask_before), (result.attention_after, mask_after)):
            if attention is not None and mask is not None:
                score = attention_localisation(attention, mask)
                if score is not None:
                    rows.append(score)
    if not rows:
        return {"images": 0}
    mean = {key: float(np.mean([row[key] for row in rows])) for key in ("share", "pointing", "uniform")}
    return {
        "images": len(rows),
        "attention_share_in_mask": mean["share"],
        "pointing_accuracy": mean["pointing"],
        "uniform_share": mean["uniform"],
        "share_over_uniform": mean["share"] / max(mean["uniform"], 1e-12),
    }


def localisation_line(summary: dict, *, ground_truth: bool) -> str:
    """The line evaluate.py prints (and appends to metrics.md) for a `localisation_summary` with images."""
    return (
        f"localisation ({'ground-truth' if ground_truth else 'preprocessed'} masks, "
        f"{summary['images']} images): attention share in mask {summary['attention_share_in_mask']:.3f} "
        f"(uniform {summary['uniform_share']:.3f}, x{summary['share_over_uniform']:.2f}), "
        f"pointing accuracy {summary['pointing_accuracy']:.3f}"
    )


def change_masks(
    pairs: Sequence[ChangePair], mask_cache: str | Path | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(before, after) change masks per pair id: a pair's ground-truth masks, else the mask cache's entry
    (its union for a side it lacks); pairs with neither are left out."""
    from davir.data.caches import MaskCache
    from davir.data.images import load_mask

    masks: dict = {}
    cache = MaskCache(mask_cache) if mask_cache else None
    for pair in pairs:
        if pair.has_gt_mask:
            masks[pair.pair_id] = (
                load_mask(pair.gt_mask_before, record=pair.pair_id),
                load_mask(pair.gt_mask_after, record=pair.pair_id),
            )
        elif cache is not None and cache.has(pair.pair_id):
            entry = cache.read(pair.pair_id)
            union = entry.union
            masks[pair.pair_id] = (
                entry.before if entry.before is not None else union,
                entry.after if entry.after is not None else union,
            )
    return masks
