"""What does "look at every object" score in the change mask, for a vision tower that sees one image at a time?

    python bench/fac_object_reference.py --data outputs/demo/data --split test --grids 8,16 [--runs RUN ...]

A DAVIR model encodes the before and the after image separately, so the map FAC supervises cannot know which
object changed: from one image it can look at the objects, not at the change. (A map sharper on the objects that
change more often can score above the reference: it is a yardstick, not a bound.) On a synthetic clevr_change set (its
``scenes.json`` has every object's box) this prints, as JSON:

* ``all_objects_reference``: per patch grid, the attention share inside the change mask (``evaluate.py``'s
  localisation score, same masks, same 25 % patch coverage) of a map spread evenly over the area of *all*
  objects' boxes — what "look at every object" scores — beside the uniform map's share and FAC's own target
  (Eq. 6's blurred mask, ``attn_norm: sum``).
* per ``--runs`` folder: its maps' share in the change mask, share on all objects, and entropy (nats), from
  ``ChangeCaptioner(..., attention=True)`` on the split's pairs that have a change mask.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from davir.data.formats import read_dataset
from davir.errors import DataError
from davir.evaluation.localisation import INSIDE_COVERAGE, attention_localisation, change_masks, patch_coverage
from davir.models.losses import change_mask_target, spatial_distribution


def objects_mask(scene: dict, side: str, shape: tuple[int, int]) -> np.ndarray:
    """(H, W) bool: the union of every object's box in one image of a generated scene."""
    mask = np.zeros(shape, dtype=bool)
    for obj in scene["images"][side]["objects"]:
        x0, y0, x1, y1 = obj["box"]
        mask[y0:y1, x0:x1] = True
    return mask


def masked_images(pairs, masks, scenes) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """(pair id, side, change mask, all-objects mask) of every image with a non-empty change mask."""
    rows = []
    for pair in pairs:
        if pair.pair_id not in masks:
            continue
        scene = scenes.get(Path(pair.pair_id).stem)
        if scene is None:
            raise DataError(f"scenes.json has no scene for pair {pair.pair_id!r}")
        for side, change in zip(("before", "after"), masks[pair.pair_id]):
            if change is not None and change.any():
                rows.append((pair.pair_id, side, change, objects_mask(scene, side, change.shape)))
    return rows


def all_objects_reference(rows, grid: int) -> dict:
    objects, target, uniform = [], [], []
    for _, _, change, everything in rows:
        coverage = patch_coverage(everything, (grid, grid))
        spread = attention_localisation(coverage / coverage.sum(), change)
        if spread is None:  # the mask covers no patch to 25 %: evaluate.py leaves such images out too
            continue
        soft = change_mask_target(torch.from_numpy(change.astype(np.float32))[None], (grid, grid))
        fac_target = spatial_distribution(soft, norm="sum", eps=1e-6).reshape(grid, grid).numpy()
        objects.append(spread["share"])
        target.append(attention_localisation(fac_target, change)["share"])
        uniform.append(spread["uniform"])
    return {
        "images": len(objects),
        "uniform_share": round(float(np.mean(uniform)), 4),
        "all_objects_share": round(float(np.mean(objects)), 4),
        "fac_target_share": round(float(np.mean(target)), 4),
    }


def run_maps(run: Path, pairs, rows) -> dict:
    from davir.inference.captioner import ChangeCaptioner

    by_image = {(pair_id, side): (change, everything) for pair_id, side, change, everything in rows}
    wanted = sorted({pair_id for pair_id, _ in by_image})
    captioner = ChangeCaptioner.from_pretrained(run)
    results = captioner.caption_records([p for p in pairs if p.pair_id in wanted], attention=True, batch_size=32)
    share, on_objects, entropy = [], [], []
    for result in results:
        for side, attention in (("before", result.attention_before), ("after", result.attention_after)):
            if attention is None or (result.pair_id, side) not in by_image:
                continue
            change, everything = by_image[(result.pair_id, side)]
            score = attention_localisation(attention, change)
            if score is None:
                continue
            p = attention / attention.sum()
            share.append(score["share"])
            on_objects.append(float(p[patch_coverage(everything, p.shape) >= INSIDE_COVERAGE].sum()))
            entropy.append(float(-(p * np.log(np.clip(p, 1e-12, None))).sum()))
    return {
        "images": len(share),
        "grid": list(p.shape) if share else None,
        "share_in_change_mask": round(float(np.mean(share)), 4),
        "share_on_all_objects": round(float(np.mean(on_objects)), 4),
        "entropy_nats": round(float(np.mean(entropy)), 3),
        "max_entropy_nats": round(float(np.log(p.size)), 3) if share else None,
    }


def build_report(args: argparse.Namespace) -> dict:
    scenes_file = args.data / "scenes.json"
    if not scenes_file.is_file():
        raise DataError(f"{scenes_file} not found: the reference needs a generated set's object boxes")
    scenes = json.loads(scenes_file.read_text())["scenes"]
    pairs = list(read_dataset("clevr_change", args.data, split=args.split))
    rows = masked_images(pairs, change_masks(pairs, mask_cache=args.masks), scenes)
    return {
        "data": str(args.data),
        "split": args.split,
        "all_objects_reference": {
            f"{g}x{g}": all_objects_reference(rows, g) for g in (int(x) for x in args.grids.split(","))
        },
        "runs": {str(run): run_maps(run, pairs, rows) for run in args.runs},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="a clevr_change root with the generator's scenes.json")
    parser.add_argument("--split", default="test")
    parser.add_argument("--masks", type=Path, help="mask cache for pairs without ground-truth masks")
    parser.add_argument("--grids", default="8,16", help="patch grids (square) for the reference")
    parser.add_argument("--runs", type=Path, nargs="*", default=[])
    args = parser.parse_args(argv)
    try:
        report = build_report(args)
    except DataError as error:  # a missing set, split, scene or run folder: one line, exit 2 (docs/errors.md)
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
