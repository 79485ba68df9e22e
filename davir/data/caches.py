"""Per-pair caches written by `python -m preprocess …` and read back as batch fields.

Layout of a cache folder (all writes atomic; a pair is complete once its JSON exists, so a rerun
skips finished pairs and a killed run resumes without a corrupt file):

    CACHE/manifest.json                  what produced the cache (command, settings, counts)
    CACHE/masks/<key>.json               boxes, scores, clusters kept for the pair (written last)
    CACHE/masks/<key>_before.png         binary change mask in the before image's frame (0/255)
    CACHE/masks/<key>_after.png          binary change mask in the after image's frame
    CACHE/entities/part-<name>.json      {pair_id: [[entity, score], ...]} for a chunk of pairs

`key` is the pair id made safe for file names (ids such as "000123.png_n" are kept as they are).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from davir.data.images import load_mask, save_png_atomic
from davir.data.records import DataError
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
        write_json_atomic(info_path, {**info, "pair_id": pair_id, "has_before": before is not None,
                                      "has_after": after is not None})

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


class EntityCache:
    """Retrieved change entities per pair: a list of (entity, score), best first."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.folder = self.root / "entities"
        self._table: dict[str, list[tuple[str, float]]] | None = None

    def write_part(self, name: str, entities: dict[str, list[tuple[str, float]]]) -> None:
        write_json_atomic(self.folder / f"part-{name}.json",
                          {pid: [[e, float(s)] for e, s in items] for pid, items in entities.items()})
        self._table = None

    def table(self) -> dict[str, list[tuple[str, float]]]:
        if self._table is None:
            table: dict[str, list[tuple[str, float]]] = {}
            for part in sorted(self.folder.glob("part-*.json")):
                for pair_id, items in read_json(part).items():
                    table[pair_id] = [(str(e), float(s)) for e, s in items]
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
