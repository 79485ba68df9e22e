"""One pair's change masks, DAVIR §3.1 (Eqs. 2-3): change regions → segmenter → IoU filter → union.

    prepared, result = compute_pair(pair, RegionSettings(), build_segmenter("classical"))
    result.before, result.after   # per-image boolean masks at image resolution (None: not segmented)

The stages are separate functions so a batching segmenter (SAM) can run `segment` over many pairs:
`prepare_pair` (load + Eq. 2, CPU) → `segment_requests` → segmenter → `finish_pair` (Eq. 3 + the JSON
record). `read_manifest` reads a mask cache's manifest, merging the shards of a sharded run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from davir.data.images import load_pair
from davir.data.records import ChangePair
from davir.errors import DataError
from davir.io import read_json
from davir.preprocessing.change_regions import ChangeRegions, RegionSettings, change_mask_union, find_change_regions
from davir.preprocessing.segmenters import Candidates, SegmentRequest


@dataclass
class Prepared:
    """The CPU stage of one pair: its images and the change regions of Eq. 2."""

    pair_id: str
    before: np.ndarray
    after: np.ndarray
    regions: ChangeRegions


@dataclass
class PairResult:
    """Final per-image masks (None for an image that was not segmented) and the JSON record."""

    pair_id: str
    before: np.ndarray | None
    after: np.ndarray | None
    info: dict


def prepare_pair(pair: ChangePair, settings: RegionSettings) -> Prepared:
    """Load the pair (before resized to the after size when they differ) and run Eq. 2 on it."""
    before, after = load_pair(pair)
    before_array, after_array = np.asarray(before), np.asarray(after)
    return Prepared(pair.pair_id, before_array, after_array, find_change_regions(before_array, after_array, settings))


def segment_requests(prepared: Prepared, segment_both: bool) -> list[SegmentRequest]:
    """What the segmenter sees for one pair: the after image, and the before image when segmenting both."""
    regions = prepared.regions
    requests = [SegmentRequest(prepared.after, regions.prompts_after, regions.regions_after)]
    if segment_both:
        requests.append(SegmentRequest(prepared.before, regions.prompts_before, regions.regions_before))
    return requests


def finish_pair(prepared: Prepared, candidates: list[list[Candidates]], tau: float, segment_both: bool) -> PairResult:
    """Eq. 3 in each segmented image, and the JSON record of clusters, boxes, IoUs and scores."""
    regions = prepared.regions
    shape = regions.image_size
    after_mask, kept_a, ious_a, choice_a = change_mask_union(
        [c.masks for c in candidates[0]], regions.regions_after, tau, shape
    )
    before_mask = None
    if segment_both:
        before_mask, kept_b, ious_b, choice_b = change_mask_union(
            [c.masks for c in candidates[1]], regions.regions_before, tau, shape
        )
    records = []
    for i, cluster in enumerate(regions.clusters):
        record = {
            "cluster": cluster.label,
            "size_work_px": cluster.size,
            "box_after": regions.prompts_after[i].to_dict()["box"],
            "point_after": regions.prompts_after[i].to_dict()["point"],
            "iou_after": round(ious_a[i], 4),
            "kept_after": kept_a[i],
            "score_after": round(float(candidates[0][i].scores[choice_a[i]]), 4),
        }
        if segment_both:
            record.update(
                {
                    "box_before": regions.prompts_before[i].to_dict()["box"],
                    "point_before": regions.prompts_before[i].to_dict()["point"],
                    "iou_before": round(ious_b[i], 4),
                    "kept_before": kept_b[i],
                    "score_before": round(float(candidates[1][i].scores[choice_b[i]]), 4),
                }
            )
        records.append(record)
    area = shape[0] * shape[1]
    info = {
        "image_size": list(shape),
        "work_size": list(regions.work_size),
        "registration": regions.registration,
        "clusters": records,
        "kept_after": int(sum(kept_a)),
        "area_after": round(float(after_mask.sum()) / area, 6),
    }
    if segment_both:
        info.update({"kept_before": int(sum(kept_b)), "area_before": round(float(before_mask.sum()) / area, 6)})
    return PairResult(prepared.pair_id, before_mask, after_mask, info)


def compute_pair(
    pair: ChangePair, settings: RegionSettings, segmenter, segment_both: bool = True
) -> tuple[Prepared, PairResult]:
    """All stages of one pair in this process (the classical path; SAM batches across pairs)."""
    prepared = prepare_pair(pair, settings)
    candidates = segmenter.segment(segment_requests(prepared, segment_both))
    return prepared, finish_pair(prepared, candidates, settings.tau, segment_both)


def manifest_path(root: Path, num_shards: int, shard_index: int) -> Path:
    """`manifest.json` for an unsharded run, `manifest-shard-I.json` for shard I (shards never collide)."""
    return Path(root) / ("manifest.json" if num_shards == 1 else f"manifest-shard-{shard_index}.json")


def read_manifest(root: str | Path) -> dict:
    """The manifest of a mask cache; the shard manifests merged (counts summed) when it was sharded."""
    root = Path(root)
    shards = sorted(root.glob("manifest-shard-*.json"))
    if not shards:
        return read_json(root / "manifest.json")
    parts = [read_json(path) for path in shards]
    merged = {key: value for key, value in parts[0].items() if key not in ("counts", "failures", "shard", "seconds")}
    for path, part in zip(shards, parts):
        if part.get("settings") != parts[0].get("settings"):
            raise DataError(f"{path}: shard made with other settings than {shards[0]}")
    merged["shards"] = [{"index": p["shard"]["index"], "status": p.get("status"), "counts": p["counts"]} for p in parts]
    merged["num_shards"] = parts[0]["shard"]["count"]
    merged["counts"] = {key: sum(p["counts"].get(key, 0) for p in parts) for key in parts[0]["counts"]}
    merged["failures"] = [f for p in parts for f in p.get("failures", [])]
    merged["status"] = (
        "complete"
        if all(p.get("status") == "complete" for p in parts) and len(parts) == merged["num_shards"]
        else "incomplete"
    )
    return merged
