"""`python -m preprocess mask-eval` — cached change masks against ground-truth masks.

    python -m preprocess mask-eval --format clevr_change --root data/synth --split test --masks cache/synth

Metrics (printed as a table, written as JSON with --out):
* IoU per image frame: IoU(predicted before mask, gt before mask) over the pairs whose gt before mask
  is non-empty, and likewise for the after frame (a cache made with --after-only has no before frame).
* IoU of the union: IoU(pred_before ∪ pred_after, gt_before ∪ gt_after) over the pairs with a change —
  the headline "mean mask IoU", comparable between per-image and after-only caches.
* Per change type: mean union IoU, and pixel precision/recall summed over the type's pairs.
* Distractor-only pairs (empty gt): the false-positive area (predicted union pixels / image pixels),
  its mean and 95th percentile, and the share of such pairs with any predicted pixel.
Pairs missing from the cache are counted and listed, not silently skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from davir.data.caches import MaskCache
from davir.data.images import load_mask
from davir.errors import DataError, check_output_file
from davir.io import write_json_atomic
from davir.runtime.arguments import check_limit, limit_type
from davir.runtime.signals import START_AGAIN, stop_on_signals


def iou(pred: np.ndarray, gt: np.ndarray) -> float:
    """Intersection over union of two bool masks (1.0 when both are empty: nothing to find, nothing found)."""
    union = np.count_nonzero(pred | gt)
    return float(np.count_nonzero(pred & gt) / union) if union else 1.0


def evaluate(format: str, root: str | Path, split: str, masks: str | Path, limit: int | None = None) -> dict:
    """All metrics of the module docstring for one split and one mask cache (`limit`: its first N pairs, N >= 1;
    None: all)."""
    from davir.data import read_dataset

    limit = check_limit(limit)
    index = read_dataset(format, root, split)
    pairs = index.pairs if limit is None else index.pairs[:limit]
    cache = MaskCache(masks)
    without_gt = [p.pair_id for p in pairs if not p.has_gt_mask]
    if len(without_gt) == len(pairs):
        raise DataError(
            f"{format} split {split!r} at {root} has no ground-truth masks (pairs need gt_mask_before/after)"
        )

    frame_ious: dict[str, list[float]] = {"before": [], "after": []}
    union_ious: list[float] = []
    per_type: dict[str, dict] = defaultdict(lambda: {"pairs": 0, "iou": [], "tp": 0, "fp": 0, "fn": 0})
    fp_area: list[float] = []
    missing: list[str] = []
    for pair in pairs:
        if not pair.has_gt_mask:
            continue
        if not cache.has(pair.pair_id):
            missing.append(pair.pair_id)
            continue
        predicted = cache.read(pair.pair_id)
        gt_before = load_mask(pair.gt_mask_before, record=pair.pair_id)
        gt_after = load_mask(pair.gt_mask_after, record=pair.pair_id)
        pred_union = predicted.union
        if pred_union.shape != gt_after.shape or gt_before.shape != gt_after.shape:
            raise DataError(
                f"pair {pair.pair_id!r}: predicted mask {pred_union.shape} and ground truth "
                f"{gt_before.shape}/{gt_after.shape} differ in size"
            )
        gt_union = gt_before | gt_after
        if not gt_union.any():  # a distractor-only pair: every predicted pixel is a false positive
            fp_area.append(float(pred_union.mean()))
            continue
        for frame, pred, gt in (("before", predicted.before, gt_before), ("after", predicted.after, gt_after)):
            if pred is not None and gt.any():
                frame_ious[frame].append(iou(pred, gt))
        value = iou(pred_union, gt_union)
        union_ious.append(value)
        stats = per_type[pair.change_type or "unknown"]
        stats["pairs"] += 1
        stats["iou"].append(value)
        stats["tp"] += int(np.count_nonzero(pred_union & gt_union))
        stats["fp"] += int(np.count_nonzero(pred_union & ~gt_union))
        stats["fn"] += int(np.count_nonzero(~pred_union & gt_union))

    def mean(values: list[float]) -> float | None:
        return round(float(np.mean(values)), 4) if values else None

    types = {}
    for name, stats in sorted(per_type.items()):
        predicted_pixels, gt_pixels = stats["tp"] + stats["fp"], stats["tp"] + stats["fn"]
        types[name] = {
            "pairs": stats["pairs"],
            "iou": mean(stats["iou"]),
            "precision": round(stats["tp"] / predicted_pixels, 4) if predicted_pixels else None,
            "recall": round(stats["tp"] / gt_pixels, 4) if gt_pixels else None,
        }
    return {
        "format": format,
        "root": str(root),
        "split": split,
        "masks": str(masks),
        "pairs": len(pairs),
        "evaluated": len(union_ious) + len(fp_area),
        "missing_from_cache": len(missing),
        "missing_examples": missing[:10],
        "without_gt": len(without_gt),
        "iou_union": mean(union_ious),
        "iou_before": mean(frame_ious["before"]),
        "iou_after": mean(frame_ious["after"]),
        "frames": {"before": len(frame_ious["before"]), "after": len(frame_ious["after"])},
        "per_type": types,
        "distractor": {
            "pairs": len(fp_area),
            "fp_area_mean": round(float(np.mean(fp_area)), 6) if fp_area else None,
            "fp_area_p95": round(float(np.percentile(fp_area, 95)), 6) if fp_area else None,
            "any_fp_share": round(float(np.mean([a > 0 for a in fp_area])), 4) if fp_area else None,
        },
    }


def format_table(result: dict) -> str:
    """A plain-text table of the headline numbers and the per-type breakdown."""

    def show(value) -> str:
        return "-" if value is None else f"{value:.3f}"

    lines = [
        f"masks {result['masks']}  ({result['split']}: {result['evaluated']} pairs evaluated, "
        f"{result['missing_from_cache']} missing from the cache)",
        f"IoU union {show(result['iou_union'])}   IoU before-frame {show(result['iou_before'])}   "
        f"IoU after-frame {show(result['iou_after'])}",
        f"{'type':<12}{'pairs':>7}{'IoU':>8}{'prec':>8}{'recall':>8}",
    ]
    for name, stats in result["per_type"].items():
        lines.append(
            f"{name:<12}{stats['pairs']:>7}{show(stats['iou']):>8}{show(stats['precision']):>8}"
            f"{show(stats['recall']):>8}"
        )
    d = result["distractor"]
    if d["pairs"]:
        lines.append(
            f"{'distractor':<12}{d['pairs']:>7}  false-positive area mean {100 * d['fp_area_mean']:.2f}% "
            f"p95 {100 * d['fp_area_p95']:.2f}%  pairs with any FP {100 * d['any_fp_share']:.1f}%"
        )
    return "\n".join(lines)


@stop_on_signals(rerun=START_AGAIN)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m preprocess mask-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--format", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--split", required=True)
    parser.add_argument("--masks", required=True, help="the cache folder written by `python -m preprocess masks`")
    parser.add_argument("--out", default=None, help="write the metrics as JSON here")
    parser.add_argument(
        "--limit", type=limit_type(), default=None, help="only the first N pairs of the split (N >= 1; default: all)"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.out:
            check_output_file(args.out, what="--out")  # before any work (docs/errors.md)
        result = evaluate(args.format, args.root, args.split, args.masks, args.limit)
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_table(result))
    if args.out:
        write_json_atomic(Path(args.out), result)
    else:
        print(json.dumps(result, indent=2))
    return 1 if result["missing_from_cache"] else 0
