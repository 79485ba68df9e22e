"""Per-pair caches written by `python -m preprocess …` and read back as batch fields.

    masks = MaskCache("cache/masks").read(pair_id)       # PairMasks: the before and after masks
    entities = EntityCache("cache/entities").get(pair_id)  # [(entity, score), ...]

The folder layout, written atomically and resumable: docs/preprocessing.md, "Cache layouts".
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from davir.data.images import load_mask, save_png_atomic
from davir.errors import DataError
from davir.io import read_json, write_json_atomic

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def cache_key(pair_id: str) -> str:
    """A file-name-safe key for a pair id; unsafe ids get a hash suffix so two ids never collide."""
    safe = _UNSAFE.sub("_", pair_id)
    if safe != pair_id or safe.startswith("."):
        safe = f"{safe.lstrip('.')}-{hashlib.sha1(pair_id.encode()).hexdigest()[:8]}"
    return safe


@dataclass
class PairMasks:
    """Change masks of one pair; a mask the preprocessing did not make is None."""

    before: np.ndarray | None
    after: np.ndarray | None
    info: dict

    @property
    def union(self) -> np.ndarray:
        """Eq. 3's single mask: the union of whatever per-image masks exist (in the after frame's size)."""
        masks = [m for m in (self.before, self.after) if m is not None]
        if not masks:
            raise DataError(f"pair {self.info.get('pair_id')!r} has no mask in the cache")
        union = np.zeros_like(masks[-1], dtype=bool)
        for mask in masks:
            if mask.shape != union.shape:
                raise DataError(f"pair {self.info.get('pair_id')!r}: before/after masks differ in size")
            union |= mask
        return union


class MaskCache:
    """Read/write change masks keyed by pair id (see the module docstring for the layout)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.folder = self.root / "masks"

    def _paths(self, pair_id: str) -> tuple[Path, Path, Path]:
        key = cache_key(pair_id)
        return self.folder / f"{key}.json", self.folder / f"{key}_before.png", self.folder / f"{key}_after.png"

    def has(self, pair_id: str) -> bool:
        return self._paths(pair_id)[0].is_file()

    def write(self, pair_id: str, before: np.ndarray | None, after: np.ndarray | None, info: dict) -> None:
        """Write the masks first and the JSON last, so a present JSON means a complete entry."""
        info_path, before_path, after_path = self._paths(pair_id)
        for mask, path in ((before, before_path), (after, after_path)):
            if mask is not None:
                save_png_atomic(np.asarray(mask, dtype=bool), path)
        write_json_atomic(
            info_path, {**info, "pair_id": pair_id, "has_before": before is not None, "has_after": after is not None}
        )

    def read(self, pair_id: str) -> PairMasks:
        info_path, before_path, after_path = self._paths(pair_id)
        if not info_path.is_file():
            raise DataError(
                f"pair {pair_id!r} has no change mask in {self.root}; run "
                f"`python -m preprocess masks --out {self.root} …` for this dataset split first"
            )
        info = read_json(info_path)
        before = load_mask(before_path, record=pair_id) if info.get("has_before") else None
        after = load_mask(after_path, record=pair_id) if info.get("has_after") else None
        return PairMasks(before=before, after=after, info=info)

    def write_manifest(self, manifest: dict) -> None:
        write_json_atomic(self.root / "manifest.json", manifest)

    def manifest(self) -> dict:
        return read_json(self.root / "manifest.json")


def read_entity_part(path: Path) -> dict[str, list[tuple[str, float]]]:
    """One `part-*.json`: {pair_id: [[entity, score], ...]}; any other shape is a DataError naming the file."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataError(
            f"{path}: an entity part must be a JSON object {{pair_id: [[entity, score], ...]}}, "
            f"got {type(data).__name__}; rerun `python -m preprocess entities` into a new --out"
        )
    part: dict[str, list[tuple[str, float]]] = {}
    for pair_id, items in data.items():
        if not isinstance(items, list):
            raise DataError(f"{path}: pair {pair_id!r}: expected a list of [entity, score], got {type(items).__name__}")
        entries = []
        for number, item in enumerate(items):
            if not (
                isinstance(item, list)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], (int, float))
                and not isinstance(item[1], bool)
            ):
                raise DataError(f"{path}: pair {pair_id!r} entry {number}: expected [entity, score], got {item!r}")
            entries.append((item[0], float(item[1])))
        part[pair_id] = entries
    return part


def recorded_roots(cache: str | Path) -> list[tuple[Path, str]]:
    """(manifest, dataset root) for every manifest in a cache folder that records the root it was built from:
    masks (`manifest.json`, `manifest-shard-I.json`: "root"), entities (`entities/manifest.json`: each
    split's "root"), features (`manifest.json`, and `manifest.incomplete.json` of an unfinished first run:
    "dataset_root")."""
    from davir.data.feature_cache import UNFINISHED_MANIFEST

    cache = Path(cache)
    found = []
    for path in [cache / "manifest.json", cache / UNFINISHED_MANIFEST, *sorted(cache.glob("manifest-shard-*.json"))]:
        if path.is_file():
            manifest = read_json(path)
            for key in ("root", "dataset_root"):
                if isinstance(manifest, dict) and isinstance(manifest.get(key), str):
                    found.append((path, manifest[key]))
    entities = cache / "entities" / "manifest.json"
    if entities.is_file():
        manifest = read_json(entities)
        splits = (manifest.get("splits") if isinstance(manifest, dict) else None) or {}
        found += [
            (entities, s["root"]) for s in splits.values() if isinstance(s, dict) and isinstance(s.get("root"), str)
        ]
    return found


def check_cache_root(
    cache: str | Path,
    data_root: str | Path,
    *,
    key: str,
    moved_from: str | Path | None = None,
    root_key: str = "data.root",
    moved_hint: str = "set data.moved_from=",
    remedy: str = "rebuild the cache for this dataset",
) -> None:
    """Refuse a cache built from another dataset: pair ids repeat across datasets (000123.png …), so a
    cache for other data would be used silently. `moved_from` accepts caches that recorded the dataset's
    old location (the data moved, the caches did not). `key` names the cache (a config key, or a command's flag
    such as --out); `root_key`, `moved_hint` and `remedy` name the dataset root, the way to pass `moved_from` and
    what to do instead, in the words of the config or the command."""
    other = made_from_another_root(cache, data_root, moved_from)
    if other is not None:
        manifest, root = other
        raise DataError(
            f"{key}={cache} was built from dataset root {root} ({manifest}), but {root_key} is "
            f"{Path(data_root).resolve()}: {remedy}, or, if the dataset only moved, {moved_hint}{root}"
        )


def made_from_another_root(
    cache: str | Path, data_root: str | Path, moved_from: str | Path | None = None
) -> tuple[Path, str] | None:
    """(manifest, the root it records) of the first manifest in `cache` built from another dataset root than
    `data_root` (or `moved_from`, the dataset's old place), else None."""
    accepted = {Path(data_root).resolve()} | ({Path(moved_from).resolve()} if moved_from else set())
    return next(((m, root) for m, root in recorded_roots(cache) if Path(root).resolve() not in accepted), None)


def refuse_another_root(
    cache: str | Path, data_root: str | Path, moved_from: str | Path | None, *, flag: str = "--out"
) -> None:
    """A preprocessing job adding to the cache `flag` (or reading it) stops before any work when the cache holds
    another dataset root's pairs: their ids and image names repeat across datasets, so the pairs already there
    would be skipped as done and the cache would mix two datasets. `moved_from`: `--moved-from`, the cache's
    recorded root when the dataset only moved since (as train.py's data.moved_from)."""
    check_cache_root(
        cache,
        data_root,
        key=flag,
        moved_from=moved_from,
        root_key="--root",
        moved_hint="pass --moved-from ",
        remedy=f"use another {flag} for this dataset",
    )


def add_moved_from_argument(parser) -> None:
    """`--moved-from OLD_ROOT` of the preprocessing jobs that add to a cache (see `refuse_another_root`)."""
    parser.add_argument(
        "--moved-from",
        default=None,
        help="the dataset root the --out cache was made from, when the dataset only moved since (as train.py's "
        "data.moved_from); another dataset's pairs are refused",
    )


def require_cached(pairs, has, *, what: str, command: str) -> None:
    """Refuse to start when a cache lacks pairs (ChangePairs; `has(pair_id)`): computing them silently on the fly
    is not allowed."""
    missing = [p.pair_id for p in pairs if not has(p.pair_id)]
    if missing:
        raise DataError(
            f"{len(missing)} of {len(pairs)} pairs have no {what}, e.g. {missing[:3]}; run `{command}` first"
        )


class EntityCache:
    """Retrieved change entities per pair: a list of (entity, score), best first."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.folder = self.root / "entities"
        self._table: dict[str, list[tuple[str, float]]] | None = None

    def write_part(self, name: str, entities: dict[str, list[tuple[str, float]]]) -> None:
        write_json_atomic(
            self.folder / f"part-{name}.json",
            {pid: [[e, float(s)] for e, s in items] for pid, items in entities.items()},
        )
        self._table = None

    def table(self) -> dict[str, list[tuple[str, float]]]:
        if self._table is None:
            table: dict[str, list[tuple[str, float]]] = {}
            for part in sorted(self.folder.glob("part-*.json")):
                table.update(read_entity_part(part))
            self._table = table
        return self._table

    def has(self, pair_id: str) -> bool:
        return pair_id in self.table()

    def get(self, pair_id: str) -> list[tuple[str, float]]:
        table = self.table()
        if pair_id not in table:
            raise DataError(
                f"pair {pair_id!r} has no retrieved entities in {self.root}; run "
                f"`python -m preprocess entities --out {self.root} …` for this dataset split first"
            )
        return table[pair_id]
