"""The mask cache's manifests and resume of `python -m preprocess masks` (davir/jobs/masks.py): where each process
records its progress, the pairs a manifest covers, the merge of the processes' manifests, a killed run's leftovers."""

from __future__ import annotations

import hashlib
from pathlib import Path

from davir.data.caches import MaskCache, cache_key
from davir.data.records import ChangePair
from davir.errors import DataError
from davir.jobs.processes import ProcessLayout
from davir.preprocessing.mask_pipeline import manifest_path


def own_manifest_path(root: Path, layout: ProcessLayout) -> Path:
    """Where this run records its progress: `manifest.json` (one process), `manifest-shard-I.json` (a hand-set
    shard, merged by `read_manifest`), `manifest-process-I-of-N.json` (a process of an `accelerate launch`,
    folded into `manifest.json` by the main process at the end and then removed)."""
    if layout.launched:
        return Path(root) / f"manifest-process-{layout.index}-of-{layout.count}.json"
    return manifest_path(root, layout.count, layout.index)


def pair_list(pairs: list[ChangePair]) -> dict:
    """The pairs a manifest covers, as a count and a digest of their ids in order (1,000,000 ids stay small)."""
    digest = hashlib.sha256("\n".join(p.pair_id for p in pairs).encode("utf-8")).hexdigest()
    return {"count": len(pairs), "sha256": digest}


def merge_process_manifests(parts: list[dict], pairs: list[ChangePair], seconds: float) -> dict:
    """The whole cache's manifest from the processes' own (in process order), as one process would write it."""
    merged = {key: value for key, value in parts[0].items() if key not in ("counts", "failures", "seconds")}
    merged["shard"] = {"count": 1, "index": 0}
    merged["processes"] = [
        {
            "index": i,
            "pairs": p["counts"]["pairs"],
            "computed": p["counts"]["computed"],
            "failed": p["counts"]["failed"],
            "seconds": p.get("seconds"),
        }
        for i, p in enumerate(parts)
    ]
    shared = ("reader_skipped",)  # what every process counts of the whole split, not of its share
    merged["counts"] = {
        key: parts[0]["counts"][key] if key in shared else sum(p["counts"][key] for p in parts)
        for key in parts[0]["counts"]
    }
    order = {p.pair_id: i for i, p in enumerate(pairs)}
    merged["failures"] = sorted((f for p in parts for f in p["failures"]), key=lambda f: order.get(f["record"], -1))
    merged["pair_list"] = pair_list(pairs)
    merged["status"] = "complete" if not merged["failures"] else "incomplete"
    merged["seconds"] = round(seconds, 2)
    return merged


def remove_stale_temporaries(cache: MaskCache, pair_ids: list[str]) -> int:
    """Delete temporary files a killed run left for these (unfinished) pairs; returns how many."""
    if not cache.folder.is_dir():
        return 0
    prefixes = {f".{cache_key(p)}" for p in pair_ids}
    removed = 0
    for path in cache.folder.glob(".*.tmp"):
        stem = path.name
        for suffix in ("_before.png", "_after.png", ".json"):
            head = stem.split(suffix + ".", 1)[0] if suffix + "." in stem else None
            if head in prefixes:
                path.unlink(missing_ok=True)
                removed += 1
                break
    return removed


def shard_pairs(pairs: list[ChangePair], num_shards: int, shard_index: int) -> list[ChangePair]:
    """Pairs i with i % num_shards == shard_index, in the reader's order (deterministic)."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise DataError(f"--shard-index must be in [0, {num_shards}), got {shard_index} (--num-shards {num_shards})")
    return pairs[shard_index::num_shards]
