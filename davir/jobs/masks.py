"""`python -m preprocess masks` — offline change masks of DAVIR §3.1 (Eqs. 2-3) into a MaskCache.

    python -m preprocess masks --format clevr_change --root data/synth --split train --out cache/synth
    python -m preprocess masks --format spot_the_diff --root data/spot --split val --out cache/spot \\
        --segmenter sam --sam-checkpoint ckpt/sam_vit_h_4b8939.pth --sam-type vit_h

Per pair: difference map at a working resolution → threshold δ → DBSCAN clusters → box + centre
prompts (Eq. 2, davir.preprocessing.change_regions) → segmenter in the before and the after image
(davir.preprocessing.segmenters) → IoU filter against the cluster regions and union (Eq. 3) → per-image PNG
masks and a JSON of boxes, scores and kept clusters (davir.data.caches.MaskCache). Segmenters are built
through the SEGMENTERS registry; each one's own options (`--classical-method`, `--sam-type`, …; see --help)
go to that segmenter only, and one of another segmenter than the run's is refused.

Masks are at image resolution, each in its own image's frame (before-frame = the before image after
`load_pair`'s size policy, i.e. resized to the after size when the two differ, as for IER).
`--profile paper` is the paper's literal pipeline (SAM on the after image, `--register none --photometric
none --tolerance-px 0 --cluster-stride 1 --after-only`); `--profile toolkit` (default) the toolkit's
deviations [D] (tuned on the synthetic train split): classical segmenter, ECC registration, photometric
matching, a 2-px misalignment tolerance, both images segmented. The manifest records the profile.

Resumable: a pair is done once its JSON exists (written last, atomically), so a rerun skips finished
pairs and a killed run picks up where it stopped; temporary files of unfinished pairs are removed
first. A rerun with different settings into the same cache is refused (use a new --out or
--overwrite). `accelerate launch [--num_machines M --machine_rank R] -m preprocess masks …` splits the pairs
over N processes (process I takes pairs i with i % N == I of the first --limit, each on its own device) and
the main process writes one `manifest.json` once every share is done; the cache is byte-identical to a
one-process run's. Without accelerate, `--num-shards K --shard-index I` process every K-th pair by hand,
each shard writing its own `manifest-shard-I.json`; `read_manifest` merges them.
Pairs whose images are missing or corrupt are counted and listed in the manifest (exit status 1),
never silently dropped; a rerun retries them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np

from davir.data.caches import MaskCache, cache_key, refuse_another_root
from davir.data.records import ChangePair
from davir.errors import DataError, check_output_dir, settings_differences
from davir.io import read_json, write_json_atomic
from davir.jobs.component_options import component_checkpoint, component_settings
from davir.jobs.mask_manifest import (
    merge_process_manifests,
    own_manifest_path,
    pair_list,
    remove_stale_temporaries,
    shard_pairs,
)
from davir.jobs.mask_parser import build_parser
from davir.jobs.processes import ProcessLayout, process_layout
from davir.preprocessing.change_regions import RegionSettings
from davir.preprocessing.mask_pipeline import (
    PairResult,
    Prepared,
    compute_pair,
    finish_pair,
    prepare_pair,
    segment_requests,
)
from davir.preprocessing.object_localisation import ObjectSettings, object_pair
from davir.preprocessing.profiles import mask_options, mask_profile, profile_deviations
from davir.preprocessing.segmenters import SEGMENTERS
from davir.runtime.locks import output_lock, shard_job
from davir.runtime.signals import ignore_interrupts, stop_on_signals

MANIFEST_VERSION = 1


# ----------------------------------------------------------------------------------------------
# Visualisation
# ----------------------------------------------------------------------------------------------


def draw_viz(prepared: Prepared, result: PairResult, folder: Path, caption: str | None = None) -> Path:
    """Save the five-panel picture of one pair (davir.viz.masks) as `<folder>/<key>.png`."""
    from davir.viz.masks import draw_mask_panels

    regions = prepared.regions
    labels = np.full(regions.work_size, -1, dtype=np.int32)
    for cluster in regions.clusters:
        labels[cluster.pixels[:, 0], cluster.pixels[:, 1]] = cluster.label
    kept = [r["kept_after"] or r.get("kept_before", False) for r in result.info["clusters"]]
    picture = draw_mask_panels(
        prepared.before,
        prepared.after,
        regions.diff,
        labels,
        boxes=[p.box for p in regions.prompts_after],
        points=[p.point for p in regions.prompts_after],
        kept=kept,
        mask_before=result.before,
        mask_after=result.after,
        title=f"{prepared.pair_id}  clusters {len(kept)}  kept {sum(kept)}  registration "
        f"{regions.registration.get('status', 'none')}",
        caption=caption,
    )
    path = Path(folder) / f"{cache_key(prepared.pair_id)}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    picture.save(path)
    return path


# ----------------------------------------------------------------------------------------------
# Workers
# ----------------------------------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(
    settings: RegionSettings,
    segmenter_build: tuple | None,
    segment_both: bool,
    cache_root: str,
    viz_folder: str | None,
    stage: str,
) -> None:
    """`segmenter_build` = (builder, typed settings, checkpoint, device) of the registry entry: the workers get the
    builder itself, not a name, so they need no registry of their own (a spawned worker re-imports modules)."""
    import cv2

    cv2.setNumThreads(1)  # parallelism is across pairs; OpenCV's own threads would oversubscribe the cores
    _WORKER.update(
        settings=settings,
        segment_both=segment_both,
        cache=MaskCache(cache_root),
        viz=None if viz_folder is None else Path(viz_folder),
        stage=stage,
    )
    if stage == "object":  # --localisation object: `settings` are the ObjectSettings, no segmenter
        return
    if stage == "all":
        build, segmenter_settings, checkpoint, device = segmenter_build
        _WORKER["segmenter"] = build(segmenter_settings, checkpoint=checkpoint, device=device)


def _run_pair(job: tuple[ChangePair, bool]):
    """Worker body: the whole pair (a segmenter registered `in_workers`, e.g. classical) or only the CPU stage
    (SAM); DataError → a counted failure."""
    pair, with_viz = job
    if _WORKER["stage"] == "object":
        try:
            result = object_pair(pair, _WORKER["settings"])
        except DataError as error:
            return pair.pair_id, None, str(error)
        _write_result(_WORKER["cache"], result)
        return pair.pair_id, _summary(result), None
    try:
        if _WORKER["stage"] == "prepare":
            return pair.pair_id, prepare_pair(pair, _WORKER["settings"]), None
        prepared, result = compute_pair(pair, _WORKER["settings"], _WORKER["segmenter"], _WORKER["segment_both"])
    except DataError as error:
        return pair.pair_id, None, str(error)
    _write_result(_WORKER["cache"], result)
    if with_viz and _WORKER["viz"] is not None:
        draw_viz(prepared, result, _WORKER["viz"], caption=pair.captions[0] if pair.captions else None)
    return pair.pair_id, _summary(result), None


def _write_result(cache: MaskCache, result: PairResult) -> None:
    cache.write(result.pair_id, result.before, result.after, result.info)


def _summary(result: PairResult) -> dict:
    return _info_summary(result.info)


def _info_summary(info: dict) -> dict:
    """A pair's counts from its mask info (a result's, or the JSON the cache holds for it)."""
    return {
        "clusters": len(info["clusters"]),
        "kept_after": info["kept_after"],
        "kept_before": info.get("kept_before", 0),
        "empty": not (info["kept_after"] or info.get("kept_before", 0)),
    }


def count_reused(cache: MaskCache, pair_ids: list[str], counts: dict) -> None:
    """Add the reused pairs' cached counts, so a resumed run's manifest describes the cache, not the last run."""
    for pair_id in pair_ids:
        path = cache._paths(pair_id)[0]
        try:
            summary = _info_summary(read_json(path))
        except (KeyError, TypeError) as error:
            raise DataError(f"{path}: not a mask entry ({error!r} missing); delete it to recompute it") from None
        counts["empty_masks"] += int(summary.pop("empty"))
        for key, value in summary.items():
            counts[key] += value


def _init_pool_worker(*initargs) -> None:
    ignore_interrupts()  # Ctrl-C reaches the whole group; the parent stops the pool (davir.runtime.signals)
    _init_worker(*initargs)


def _iterate(jobs, workers: int, initargs: tuple, chunksize: int = 4):
    """Results of `_run_pair` over the jobs: in a pool of `workers` processes, or in this process."""
    if workers <= 1:
        _init_worker(*initargs)
        for job in jobs:
            yield _run_pair(job)
        return
    # fork is cheap for the in-worker (classical) path; with SAM loaded (maybe on a GPU) the workers are
    # spawned, since a forked copy of a CUDA process is unsafe.
    method = "fork" if sys.platform.startswith("linux") and initargs[-1] in ("all", "object") else "spawn"
    with multiprocessing.get_context(method).Pool(workers, initializer=_init_pool_worker, initargs=initargs) as pool:
        # Ordered (imap) so the SAM stage can batch and the viz picks are reproducible.
        yield from pool.imap(_run_pair, jobs, chunksize=chunksize)


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def apply_profile(args: argparse.Namespace) -> dict:
    """Fill the options left unset from --profile; returns the explicit deviations from it."""
    options = mask_options(args.profile)
    chosen = {key: getattr(args, key) for key in options}
    for key, value in options.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return profile_deviations("masks", args.profile, {k: v for k, v in chosen.items() if v is not None})


def region_settings(args: argparse.Namespace) -> RegionSettings:
    names = {f.name for f in fields(RegionSettings)}
    return RegionSettings(**{name: getattr(args, name) for name in names if hasattr(args, name)})


def _as_recorded_today(settings):
    """A manifest's comparable settings with the segmenter's as this version records them
    (`Component.as_recorded_today`)."""
    segmenter = settings.get("segmenter") if isinstance(settings, dict) else None
    if not isinstance(segmenter, dict) or segmenter.get("segmenter") not in SEGMENTERS:
        return settings
    return {**settings, "segmenter": SEGMENTERS[segmenter["segmenter"]].as_recorded_today(segmenter)}


def run(args: argparse.Namespace, argv: list[str], layout: ProcessLayout | None = None) -> dict:
    """Compute (or resume) the masks of one split/shard; returns the manifest written (under `accelerate launch`:
    the whole cache's, merged from every process's share)."""
    from tqdm import tqdm

    from davir.data import read_dataset

    started = time.time()
    check_output_dir(args.out, what="--out")  # before any work (docs/errors.md)
    refuse_another_root(args.out, args.root, args.moved_from)
    if args.viz:
        check_output_dir(args.viz, what="--viz")
    deviations = apply_profile(args)
    settings = region_settings(args)
    layout = layout or process_layout(args.num_shards, args.shard_index)
    entry = SEGMENTERS[args.segmenter]
    # One device per process of a launch, unless --device names one (a segmenter without a model ignores it).
    segmenter_build = (
        entry.build,
        component_settings(SEGMENTERS, args.segmenter, args),
        component_checkpoint(SEGMENTERS, args.segmenter, args),
        args.device or layout.device,
    )
    if args.localisation == "object":
        # No segmenter and no Eq. 2: the object localiser's own settings are recorded instead.
        segmenter = None
        object_settings = ObjectSettings()
        all_settings = {
            "localisation": "object",
            "object": object_settings.to_dict(),
            "segmenter": None,
            "segment_both": True,
            "size_policy": "resize_before_to_after",
        }
        comparable = dict(all_settings)
    else:
        # Build once here: a bad checkpoint or option fails before any work, and a model segmenter lives in this
        # process.
        build, segmenter_settings, checkpoint, device = segmenter_build
        segmenter = build(segmenter_settings, checkpoint=checkpoint, device=device)
        all_settings = {
            "regions": settings.to_dict(),
            "segmenter": segmenter.settings(),
            "segment_both": args.segment_both,
            "size_policy": "resize_before_to_after",
        }
        comparable = {
            **all_settings,
            "segmenter": {k: v for k, v in segmenter.settings().items() if k not in entry.uncompared_keys()},
        }

    index = read_dataset(args.format, args.root, args.split)
    if layout.launched:  # the processes share the --limit of one run, so the cache is the same whatever N
        whole = index.pairs[: args.limit] if args.limit is not None else index.pairs
        pairs = layout.share(whole)
    else:  # a hand-set shard: --limit counts within the shard, as it always has
        pairs = shard_pairs(index.pairs, layout.count, layout.index)[: args.limit]
    layout.announce(len(pairs), len(whole) if layout.launched else len(index.pairs))
    cache = MaskCache(args.out)
    path = own_manifest_path(cache.root, layout)
    earlier = [path, *([cache.root / "manifest.json"] if layout.launched else [])]
    for previous_path in [p for p in earlier if p.is_file()] if not args.overwrite else []:
        before = _as_recorded_today(read_json(previous_path).get("comparable_settings"))
        if before != comparable:
            raise DataError(
                f"{previous_path}: this cache was made with other settings ({settings_differences(before, comparable)}); "
                "use a new --out, or --overwrite to recompute every pair"
            )
    todo = pairs if args.overwrite else [p for p in pairs if not cache.has(p.pair_id)]
    pending = {p.pair_id for p in todo}
    reused = [p.pair_id for p in pairs if p.pair_id not in pending]
    removed = remove_stale_temporaries(cache, [p.pair_id for p in todo])
    for name in {path.name, *(["manifest.json"] if layout.launched and layout.index == 0 else [])}:
        for stale in cache.root.glob(f".{name}.*.tmp"):  # a kill while the manifest was written
            stale.unlink(missing_ok=True)
            removed += 1
    manifest = {
        "version": MANIFEST_VERSION,
        "command": "python -m preprocess masks " + " ".join(argv),
        "format": args.format,
        "root": str(Path(args.root).resolve()),
        "split": args.split,
        "shard": {"count": 1, "index": 0} if layout.launched else {"count": layout.count, "index": layout.index},
        "settings": all_settings,
        "comparable_settings": comparable,
        "status": "running",
        # derived from the settings (davir.preprocessing.profiles), recorded for the reader
        "profile": mask_profile(all_settings),
        "profile_requested": args.profile,
        "profile_deviations": {k: {"profile": a, "chosen": b} for k, (a, b) in deviations.items()},
        "counts": {
            "pairs": len(pairs),
            "reused": len(pairs) - len(todo),
            "computed": 0,
            "failed": 0,
            "empty_masks": 0,
            "clusters": 0,
            "kept_after": 0,
            "kept_before": 0,
            "stale_temporaries_removed": removed,
            "reader_skipped": len(index.skipped),
        },
        "failures": [],
    }
    count_reused(cache, reused, manifest["counts"])  # empty_masks, clusters, kept_*: of every pair in the cache
    write_json_atomic(path, manifest)

    workers = (os.cpu_count() or 1) if args.workers == 0 else args.workers
    viz_ids = {p.pair_id for p in todo[: args.viz_count]} if args.viz else set()
    jobs = [(p, p.pair_id in viz_ids) for p in todo]
    stage = "all" if entry.declared.get("in_workers") else "prepare"
    if args.localisation == "object":
        stage = "object"
    # Only in-worker segmenters travel to the workers (a spawned worker unpickles the builder by reference).
    initargs = (
        object_settings if stage == "object" else settings,
        segmenter_build if stage == "all" else None,
        args.segment_both if stage != "object" else True,
        str(cache.root),
        args.viz,
        stage,
    )
    counts = manifest["counts"]
    progress = tqdm(
        total=len(jobs),
        desc=f"masks {args.split}" + (f" {layout.describe()}" if layout.count > 1 else ""),
        unit="pair",
        disable=args.no_progress,
    )
    by_id = {p.pair_id: p for p in todo}

    def record(pair_id: str, summary: dict | None, error: str | None) -> None:
        if error is not None:
            counts["failed"] += 1
            manifest["failures"].append({"record": pair_id, "reason": error})
        else:
            counts["computed"] += 1
            counts["empty_masks"] += int(summary["empty"])
            for key in ("clusters", "kept_after", "kept_before"):
                counts[key] += summary[key]
        progress.update(1)

    if stage in ("all", "object"):
        for pair_id, summary, error in _iterate(jobs, workers, initargs):
            record(pair_id, summary, error)
    else:  # a model segmenter (SAM): CPU stage in the workers, batched segmentation and Eq. 3 here
        batch: list[Prepared] = []
        batch_size = max(1, int(getattr(segmenter, "batch_size", 1)))

        def flush() -> None:
            requests = [r for prepared in batch for r in segment_requests(prepared, args.segment_both)]
            answers = segmenter.segment(requests)
            per_pair = 2 if args.segment_both else 1
            for k, prepared in enumerate(batch):
                result = finish_pair(
                    prepared, answers[k * per_pair : (k + 1) * per_pair], settings.tau, args.segment_both
                )
                _write_result(cache, result)
                if prepared.pair_id in viz_ids:
                    pair = by_id[prepared.pair_id]
                    draw_viz(prepared, result, Path(args.viz), caption=pair.captions[0] if pair.captions else None)
                record(prepared.pair_id, _summary(result), None)
            batch.clear()

        images_per_pair = 2 if args.segment_both else 1
        for pair_id, prepared, error in _iterate(jobs, workers, initargs):
            if error is not None:
                record(pair_id, None, error)
                continue
            batch.append(prepared)
            if len(batch) * images_per_pair >= batch_size:
                flush()
        if batch:
            flush()
    progress.close()

    manifest["status"] = "complete" if counts["failed"] == 0 else "incomplete"
    manifest["counts"]["in_cache"] = sum(cache.has(p.pair_id) for p in pairs)
    manifest["seconds"] = round(time.time() - started, 2)
    if not layout.launched:
        manifest["pair_list"] = pair_list(pairs)
        write_json_atomic(path, manifest)
        return manifest
    write_json_atomic(path, manifest)  # this share's record, kept if another process is killed
    merged = merge_process_manifests(layout.gather(manifest), whole, time.time() - started)
    if layout.is_main:  # every share is complete now: one manifest for the whole cache
        cache.write_manifest(merged)
        for part in cache.root.glob("manifest-process-*-of-*.json"):
            part.unlink(missing_ok=True)
    return merged


@stop_on_signals()
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        check_output_dir(args.out, what="--out")  # before its lock file is made beside it
        layout = process_layout(args.num_shards, args.shard_index)
        with output_lock(
            args.out,
            what=f"mask cache {args.out}",
            wait=args.wait_lock,
            job=shard_job("masks", layout.count, layout.index),
        ):
            manifest = run(args, argv, layout)
    except (DataError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    counts = manifest["counts"]
    speaks = not layout.launched or layout.is_main  # one summary for a launch; every process exits with its status
    if speaks:
        print(json.dumps({"out": args.out, "status": manifest["status"], **counts}, indent=2))
    if counts["failed"]:
        for failure in manifest["failures"][:10] if speaks else []:
            print(f"failed: {failure['record']}: {failure['reason']}", file=sys.stderr)
        if speaks:
            print(f"{counts['failed']} pair(s) failed (listed in the manifest); rerun to retry them", file=sys.stderr)
        return 1
    return 0
