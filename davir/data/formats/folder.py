"""A user's own folder of before/after pairs, for inference (no references).

Three layouts, tried in this order:
    1. a manifest `pairs.csv` (columns before,after[,id]) or `pairs.jsonl` ({"before", "after"[, "id"]}
       per line); paths are relative to the manifest's folder and may not escape it;
    2. `before/` and `after/` sub-folders whose files match by name (extension may differ);
    3. `NAME_before.EXT` next to `NAME_after.EXT`.
A before with no after (or the reverse) is a counted skip (SkippedRecord) with the reason; files that
are not images are ignored. pair_id is the manifest id, else the shared name. The split argument is
accepted for the registry but ignored: every pair gets split "test".

    index = read_folder("my_pairs/")          # or read_folder("my_pairs/pairs.csv")
"""

from __future__ import annotations

import csv
import re
from pathlib import Path, PurePosixPath

from davir.data.formats.registry import register_format
from davir.data.formats._common import PairMerger, require_id
from davir.data.images import resolve_in_root
from davir.data.records import ChangePair, DataError, DatasetIndex, SkippedRecord
from davir.io import read_jsonl

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".gif"})
MANIFEST_NAMES = ("pairs.csv", "pairs.jsonl")
SIDE_BY_SIDE = re.compile(r"^(?P<name>.+)_(?P<side>before|after)$", re.IGNORECASE)
SPLIT = "test"


def _images_in(folder: Path) -> list[Path]:
    return sorted(
        path for path in folder.iterdir()
        if path.is_file() and not path.name.startswith(".") and path.suffix.lower() in IMAGE_EXTENSIONS
    )


def _by_name(paths: list[Path], key, folder: Path) -> dict[str, Path]:
    """name -> file; two files with one name (a.png and a.jpg) are ambiguous, so a DataError."""
    found: dict[str, Path] = {}
    for path in paths:
        name = key(path)
        if name in found:
            raise DataError(f"{folder}: {found[name].name} and {path.name} both give the pair name {name!r}; rename one")
        found[name] = path
    return found


def _match(befores: dict[str, Path], afters: dict[str, Path], source: str) -> tuple[list[ChangePair], list[SkippedRecord]]:
    pairs = [
        ChangePair(pair_id=name, before=befores[name], after=afters[name], split=SPLIT)
        for name in sorted(befores.keys() & afters.keys())
    ]
    skipped = [
        SkippedRecord(source, befores[name].name, f"before image has no matching after image (expected name {name!r})")
        for name in sorted(befores.keys() - afters.keys())
    ] + [
        SkippedRecord(source, afters[name].name, f"after image has no matching before image (expected name {name!r})")
        for name in sorted(afters.keys() - befores.keys())
    ]
    return pairs, skipped


def _read_subfolders(root: Path) -> DatasetIndex:
    befores = _by_name(_images_in(root / "before"), lambda path: path.stem, root / "before")
    afters = _by_name(_images_in(root / "after"), lambda path: path.stem, root / "after")
    pairs, skipped = _match(befores, afters, str(root))
    return DatasetIndex("folder", root, SPLIT, pairs, skipped)


def _read_side_by_side(root: Path) -> DatasetIndex:
    sides: dict[str, list[Path]] = {"before": [], "after": []}
    for path in _images_in(root):
        match = SIDE_BY_SIDE.match(path.stem)
        if match:
            sides[match["side"].lower()].append(path)
    name_of = lambda path: SIDE_BY_SIDE.match(path.stem)["name"]  # noqa: E731
    pairs, skipped = _match(_by_name(sides["before"], name_of, root), _by_name(sides["after"], name_of, root), str(root))
    return DatasetIndex("folder", root, SPLIT, pairs, skipped)


def _manifest_rows(path: Path) -> list[tuple[str, dict]]:
    """(record name, row) of a pairs.csv or pairs.jsonl."""
    if path.suffix.lower() == ".csv":
        try:
            with open(path, newline="", encoding="utf-8-sig") as handle:  # -sig: Excel writes a BOM
                reader = csv.DictReader(handle)
                columns = [name.strip() for name in (reader.fieldnames or [])]
                if "before" not in columns or "after" not in columns:
                    raise DataError(f"{path}: the header must name the columns before,after[,id]; got {reader.fieldnames}")
                # Row numbers count the header as line 1, as a spreadsheet shows them.
                return [
                    (f"line {number}", {key.strip(): value for key, value in row.items() if key is not None})
                    for number, row in enumerate(reader, start=2)
                ]
        except (UnicodeDecodeError, csv.Error) as error:  # a binary or mis-encoded file (issue 18)
            raise DataError(f"{path}: not a UTF-8 CSV file ({error})") from error
    if path.suffix.lower() == ".jsonl":
        return [(f"row {number}", row) for number, row in enumerate(read_jsonl(path), start=1)]
    raise DataError(f"{path}: a pair manifest must be a .csv or .jsonl file")


def _read_manifest(path: Path) -> DatasetIndex:
    if not path.is_file():
        raise DataError(f"pair manifest is missing: {path}")
    root = path.parent
    merger = PairMerger(str(path))
    for record, row in _manifest_rows(path):
        if not isinstance(row, dict):
            raise DataError(f"{path}: {record}: expected an object with \"before\" and \"after\", got {row!r:.80}")
        for column in ("before", "after"):
            if not row.get(column):
                raise DataError(f"{path}: {record}: the {column!r} path is missing or empty")
        before = resolve_in_root(root, row["before"], source=str(path), record=record)
        after = resolve_in_root(root, row["after"], source=str(path), record=record)
        raw_id = row.get("id")
        pair_id = PurePosixPath(row["before"]).stem if raw_id in (None, "") else require_id(
            raw_id, source=str(path), record=record, field="id")
        merger.add(ChangePair(pair_id=pair_id, before=before, after=after, split=SPLIT), f"{record} (id {pair_id!r})")
    return DatasetIndex("folder", root, SPLIT, merger.pairs(), [])


@register_format("folder", splits=(SPLIT, "all"))
def read_folder(path: str | Path, split: str = SPLIT) -> DatasetIndex:
    """Pairs of a user's folder (or of a pairs.csv / pairs.jsonl manifest file); `split` is ignored."""
    path = Path(path)
    if path.is_file():
        return _read_manifest(path)
    if not path.is_dir():
        raise DataError(f"{path}: no such folder or manifest file")
    for name in MANIFEST_NAMES:
        if (path / name).is_file():
            return _read_manifest(path / name)
    if (path / "before").is_dir() and (path / "after").is_dir():
        index = _read_subfolders(path)
    else:
        index = _read_side_by_side(path)
    if not index.pairs and not index.skipped:
        raise DataError(
            f"{path}: found no image pairs: expected before/ and after/ folders, NAME_before/NAME_after files, "
            "or a pairs.csv / pairs.jsonl manifest"
        )
    return index
