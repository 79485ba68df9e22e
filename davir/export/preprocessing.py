"""The preprocessing an exported model needs to caption new pairs, taken out of the run's caches.

The settings and fitted parts are copied, no entries and no SAM/CLIP weights: docs/sharing.md, "Captioning with
the exported folder".
"""

from __future__ import annotations

import shutil
from pathlib import Path

from davir.errors import DataError
from davir.export.shareable import scrub
from davir.io import read_json, write_json_atomic

# What of a mask cache's manifest captioning (and the profile check) reads; the rest (root, command, counts,
# failures, timings) describes the training data on the machine that made it.
MASK_MANIFEST_KEYS = (
    "version",
    "format",
    "settings",
    "comparable_settings",
    "profile",
    "profile_requested",
    "profile_deviations",
)
# Of an entity cache's manifest: all but the per-split counts and the command line.
ENTITY_MANIFEST_DROP = ("splits", "command")
ENTITY_FILES = ("vocab.json",)
ENTITY_FOLDERS = ("retriever", "gate")


def export_mask_settings(cache: Path, out: Path, bases=()) -> dict:
    """`out/manifest.json`: the settings of the mask cache `cache` (its shard manifests merged), absolute paths
    (the SAM weights file) made relative to `bases` or their last name (davir.export.shareable). Returns them."""
    from davir.preprocessing.mask_pipeline import read_manifest

    try:
        manifest = read_manifest(cache)
    except (OSError, ValueError, KeyError) as error:
        raise DataError(f"{cache} is not a mask cache (no readable manifest.json): {error}") from error
    if not isinstance(manifest.get("settings"), dict):
        raise DataError(f"{cache}/manifest.json records no 'settings': not a mask cache `preprocess masks` wrote")
    kept = scrub({key: manifest[key] for key in MASK_MANIFEST_KEYS if key in manifest}, bases)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "manifest.json", kept)
    return kept["settings"]


def export_entity_source(cache: Path, out: Path, bases=()) -> dict:
    """`out/`: the vocabulary, manifest settings and fitted retriever/gate of the entity cache `cache`, absolute
    paths of the vocabulary and the manifest (the mask cache, the CLIP weights file) made relative to `bases` or
    their last name (davir.export.shareable). Returns the manifest's settings as exported."""
    manifest_path = cache / "entities" / "manifest.json"
    if not manifest_path.is_file() or not (cache / "vocab.json").is_file():
        raise DataError(
            f"{cache} holds no entity vocabulary/retriever (entities/manifest.json, vocab.json); give the "
            "entity cache the run trained with (--entities-from)"
        )
    manifest = read_json(manifest_path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("settings"), dict):
        raise DataError(f"{manifest_path}: records no 'settings': not an entity cache `preprocess entities` wrote")
    (out / "entities").mkdir(parents=True, exist_ok=True)
    kept = scrub({key: value for key, value in manifest.items() if key not in ENTITY_MANIFEST_DROP}, bases)
    write_json_atomic(out / "entities" / "manifest.json", kept)
    for name in ENTITY_FILES:  # the vocabulary records the data root it was counted on: a path of this machine
        write_json_atomic(out / name, scrub(read_json(cache / name), bases))
    for name in ENTITY_FOLDERS:
        if (cache / name).is_dir():
            shutil.copytree(cache / name, out / name, dirs_exist_ok=True)
    return kept["settings"]


def describe(mask_settings: dict | None, entity_settings: dict | None) -> dict:
    """What the model card says of the preprocessing: segmenter, retriever, gate (None: not used)."""
    masks = None
    if mask_settings is not None:
        segmenter = mask_settings.get("segmenter") or {"segmenter": "classical"}
        masks = {
            "localisation": mask_settings.get("localisation", "pixel"),
            "segmenter": segmenter.get("segmenter", "classical"),
            "segment_both": mask_settings.get("segment_both", True),
            "register": (mask_settings.get("regions") or {}).get("register"),
        }
    entities = None
    if entity_settings is not None:
        entities = {
            key: entity_settings.get(key)
            for key in ("retriever", "retrieval", "entity_gate", "mask_source", "mask_weighting", "top_k", "clip_model")
            if entity_settings.get(key) is not None
        }
    return {"masks": masks, "entities": entities}
