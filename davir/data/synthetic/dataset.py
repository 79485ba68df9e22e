"""The whole set: change types and splits, scenes written in parallel, the JSON files; reading scenes.json back."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from davir.data.records import CHANGE_TYPES
from davir.data.synthetic.config import SynthConfig
from davir.data.synthetic.scene_files import build_task, worker_init
from davir.errors import DataError
from davir.io import read_json, write_json_atomic

FORMAT_VERSION = 1


def scene_types(config: SynthConfig) -> list[str]:
    """Change type of every scene: each block of 5 consecutive ids holds the 5 types in a seeded order."""
    types: list[str] = []
    for block in range((config.scenes + len(CHANGE_TYPES) - 1) // len(CHANGE_TYPES)):
        rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(1, block)))
        types.extend(CHANGE_TYPES[i] for i in rng.permutation(len(CHANGE_TYPES)))
    return types[: config.scenes]


def make_splits(config: SynthConfig) -> dict[str, list[int]]:
    """Seeded partition of the scene ids into train/val/test (sorted id lists)."""
    rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(2,)))
    order = rng.permutation(config.scenes)
    n_val = int(round(config.scenes * config.val_fraction))
    n_test = int(round(config.scenes * config.test_fraction))
    return {
        "train": sorted(int(i) for i in order[n_val + n_test :]),
        "val": sorted(int(i) for i in order[:n_val]),
        "test": sorted(int(i) for i in order[n_val : n_val + n_test]),
    }


def _worker_count(workers: int) -> int:
    if workers < 0:
        raise DataError(f"synthetic set: workers must be >= 0 (0 = one per core), got {workers}")
    if workers == 0:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return workers


def _summary(
    out: Path,
    config: SynthConfig,
    types: list[str],
    splits: dict[str, list[int]],
    seconds: float,
    workers: int,
    reused: bool,
) -> dict[str, Any]:
    return {
        "output": str(out),
        "scenes": config.scenes,
        "pairs": 2 * config.scenes,
        "change_types": {t: types.count(t) for t in CHANGE_TYPES},
        "splits": {name: len(ids) for name, ids in splits.items()},
        "width": config.width,
        "height": config.height,
        "seed": config.seed,
        "difficulty": config.difficulty,
        "workers": workers,
        "reused_existing": reused,
        "seconds": round(seconds, 2),
    }


def generate_dataset(out: str | Path, config: SynthConfig, workers: int = 0) -> dict[str, Any]:
    """Render the whole set into `out` (CLEVR-Change layout + gt_masks + scenes.json); returns a summary.

    `workers` = processes (0 = one per core; 1 = in this process). The JSON files are written after
    every image, scenes.json last: a folder whose scenes.json holds the same config is complete and is
    reused as it is; one made with another config is refused rather than mixed.
    """
    start = time.perf_counter()
    out = Path(out)
    types = scene_types(config)
    splits = make_splits(config)
    count = _worker_count(workers)
    scenes_path = out / "scenes.json"
    if scenes_path.is_file():
        existing = read_json(scenes_path)
        if isinstance(existing, dict) and existing.get("config") == config.record():
            return _summary(out, config, types, splits, time.perf_counter() - start, count, reused=True)
        raise DataError(
            f"{out} already holds a synthetic set made with another config ({scenes_path}); "
            "choose another --out or delete that folder"
        )
    if out.exists() and not out.is_dir():
        raise DataError(f"synthetic set: output {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)

    tasks = [(index, types[index], config, str(out)) for index in range(config.scenes)]
    if count == 1 or config.scenes < 8:
        results = [build_task(task) for task in tasks]
    else:
        # spawn: the parent may hold threads (torch, OpenCV) that fork would copy in a broken state.
        with multiprocessing.get_context("spawn").Pool(count, initializer=worker_init) as pool:
            results = list(pool.imap(build_task, tasks, chunksize=max(1, min(64, config.scenes // (count * 8)))))

    split_of = {index: name for name, ids in splits.items() for index in ids}
    change_file: dict[str, list[str]] = {}
    no_change_file: dict[str, list[str]] = {}
    scenes: dict[str, Any] = {}
    for index, record in enumerate(results):
        key = f"CLEVR_default_{index:06d}.png"
        change_file[key] = record.pop("_captions")
        no_change_file[key] = record.pop("_no_change_captions")
        record["split"] = split_of.get(index)
        record["captions"] = change_file[key]
        scenes[f"{index:06d}"] = record
    type_mapping = {t: [f"{i:06d}.png" for i, ti in enumerate(types) if ti == t] for t in CHANGE_TYPES}
    write_json_atomic(out / "change_captions.json", change_file, indent=None)
    write_json_atomic(out / "no_change_captions.json", no_change_file, indent=None)
    write_json_atomic(out / "splits.json", splits, indent=None)
    write_json_atomic(out / "type_mapping.json", type_mapping, indent=None)
    write_json_atomic(
        scenes_path, {"version": FORMAT_VERSION, "config": config.record(), "scenes": scenes}, indent=None
    )
    return _summary(out, config, types, splits, time.perf_counter() - start, count, reused=False)


def load_synthetic_set(root: str | Path) -> dict[str, Any]:
    """root/scenes.json of a synthetic set, checked: {"version", "config" (the generator settings, seed
    included), "scenes"} (see :func:`load_scenes` for the records)."""
    path = Path(root) / "scenes.json"
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("scenes"), dict):
        raise DataError(f'{path}: expected an object with a "scenes" mapping (a davir synthetic set)')
    if data.get("version") != FORMAT_VERSION:
        raise DataError(
            f"{path}: synthetic set version {data.get('version')!r}; this davir reads version {FORMAT_VERSION}"
        )
    return data


def load_scenes(root: str | Path) -> dict[str, Any]:
    """The per-scene records of a synthetic set: {"%06d": record} from root/scenes.json.

    A record holds "change" (type, object id, old/new or from/to, subject phrase), "images" (before /
    after / nonsemantic: file, objects with shape/color/material/size, box [x0, y0, x1, y1) in that
    image, visible fraction, depth_order 0 = nearest, ground position; and a left-to-right
    "description"), "distractors" (semantic / nonsemantic: None or kind + camera/illumination),
    "masks" (relative paths), "split" and "captions".
    """
    return load_synthetic_set(root)["scenes"]
