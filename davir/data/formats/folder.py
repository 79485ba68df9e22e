"""A user's own folder of before/after pairs: for captioning, and with captions for training and scoring.

    index = read_folder("my_pairs/", "train")          # or read_folder("my_pairs/pairs.csv", "all")

The three layouts (a pairs.csv/pairs.jsonl manifest, before/ + after/, NAME_before/NAME_after), the columns and
the seeded splits: docs/datasets.md, "Your own folder of pairs".
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from davir.data.formats.folder_rows import (
    COLUMNS,
    SPLITS,
    FolderPair,
    FolderRow,
    Problems,
    iter_manifest_rows,
    manifest_rows,
    merge_rows,
    read_caption_file,
    to_change_pair,
)
from davir.data.formats.folder_table import build_table
from davir.data.formats.registry import register_format
from davir.data.records import DatasetIndex, SkippedRecord
from davir.errors import DataError

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".gif"})
MANIFEST_NAMES = ("pairs.csv", "pairs.jsonl")
CAPTION_FILE = "captions.json"
MASK_FOLDER = "masks"
SIDE_BY_SIDE = re.compile(r"^(?P<name>.+)_(?P<side>before|after)$", re.IGNORECASE)
ALL = "all"
NOT_TRAINABLE = "no reference caption: captionable, never trainable (left out of train and val)"


@dataclass(frozen=True)
class SplitOptions:
    """The seeded split of pairs that have captions but no `split`: a fraction of image groups each."""

    seed: int = 0
    val_fraction: float = 0.1
    test_fraction: float = 0.1

    def __post_init__(self):
        if not (0 <= self.val_fraction and 0 <= self.test_fraction and self.val_fraction + self.test_fraction < 1):
            raise DataError(
                f"split fractions must be >= 0 and leave some pairs for train; got val "
                f"{self.val_fraction}, test {self.test_fraction}"
            )

    def assign(self, key: str) -> str:
        """The split of a group, fixed by (seed, key): the same on every read, whatever else the folder holds."""
        digest = hashlib.blake2b(f"{self.seed}:{key}".encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "little") / 2.0**64
        return "test" if u < self.test_fraction else "val" if u < self.test_fraction + self.val_fraction else "train"


@dataclass
class FolderContents:
    """Everything a folder holds, before one split is chosen (also what `davir.data import` checks)."""

    root: Path
    source: str
    pairs: list[FolderPair]
    skipped: list[SkippedRecord]
    notes: list[str]
    has_captions: bool = False  # a caption column or captions.json: the user meant to give captions


def _images_in(folder: Path) -> list[Path]:
    # A link to a missing file is kept: its pair is then that pair's error, naming the file, not its partner
    # reported as having no match.
    return sorted(
        path
        for path in folder.iterdir()
        if (path.is_file() or path.is_symlink())
        and not path.name.startswith(".")
        and path.suffix.lower() in IMAGE_EXTENSIONS
    )


def _by_name(paths: list[Path], key, folder: Path) -> dict[str, Path]:
    """name -> file; two files with one name (a.png and a.jpg) are ambiguous, so a DataError."""
    found: dict[str, Path] = {}
    for path in paths:
        name = key(path)
        if name in found:
            raise DataError(
                f"{folder}: {found[name].name} and {path.name} both give the pair name {name!r}; rename one"
            )
        found[name] = path
    return found


def _match(root: Path, befores: dict[str, Path], afters: dict[str, Path], problems: Problems) -> FolderContents:
    """Pairs of files matched by name, with the optional captions.json and masks/ beside them."""
    source = str(root)
    names = sorted(befores.keys() & afters.keys())
    skipped = [
        SkippedRecord(
            source,
            befores[name].name,
            f"before image has no matching after image (expected name {name!r})",
            drops_pair=True,
        )
        for name in sorted(befores.keys() - afters.keys())
    ] + [
        SkippedRecord(
            source,
            afters[name].name,
            f"after image has no matching before image (expected name {name!r})",
            drops_pair=True,
        )
        for name in sorted(afters.keys() - befores.keys())
    ]
    notes: list[str] = []
    captions: dict[str, list[str]] = {}
    if (root / CAPTION_FILE).is_file():
        caption_problems = Problems(str(root / CAPTION_FILE), problems.strict)
        captions, unknown = read_caption_file(root / CAPTION_FILE, set(names), caption_problems)
        problems.items.extend(caption_problems.items)
        if unknown:
            notes.append(
                f"{root / CAPTION_FILE}: {len(unknown)} key(s) name no pair and are ignored, e.g. {unknown[:3]}"
            )
    masks = (
        _by_name(_images_in(root / MASK_FOLDER), lambda path: path.stem, root / MASK_FOLDER)
        if (root / MASK_FOLDER).is_dir()
        else {}
    )
    rows = [
        FolderRow(
            record=befores[name].name,
            pair_id=name,
            before=befores[name],
            after=afters[name],
            captions=captions.get(name, []),
            mask=masks.get(name),
        )
        for name in names
    ]
    return FolderContents(
        root, source, merge_rows(rows, problems), skipped, notes, has_captions=(root / CAPTION_FILE).is_file()
    )


def _subfolders(root: Path, problems: Problems) -> FolderContents:
    befores = _by_name(_images_in(root / "before"), lambda path: path.stem, root / "before")
    afters = _by_name(_images_in(root / "after"), lambda path: path.stem, root / "after")
    return _match(root, befores, afters, problems)


def _side_by_side(root: Path, problems: Problems) -> FolderContents:
    sides: dict[str, list[Path]] = {"before": [], "after": []}
    for path in _images_in(root):
        match = SIDE_BY_SIDE.match(path.stem)
        if match:
            sides[match["side"].lower()].append(path)
    name_of = lambda path: SIDE_BY_SIDE.match(path.stem)["name"]  # noqa: E731
    return _match(root, _by_name(sides["before"], name_of, root), _by_name(sides["after"], name_of, root), problems)


def _manifest_notes(path: Path, unused: list[str]) -> list[str]:
    return (
        [
            f"{path}: column(s) {', '.join(map(repr, unused))} are not davir columns "
            f"({', '.join(COLUMNS)}); "
            "their values are kept in ChangePair.meta and otherwise unused"
        ]
        if unused
        else []
    )


def _manifest(path: Path, problems: Problems, encoding: str | None = None) -> FolderContents:
    if not path.is_file():
        raise DataError(f"pair manifest is missing: {path}")
    rows, unused, columns = manifest_rows(path, problems, encoding)
    return FolderContents(
        path.parent,
        str(path),
        merge_rows(rows, problems),
        [],
        _manifest_notes(path, unused),
        has_captions="caption" in columns or "captions" in columns,
    )


def manifest_of(path: str | Path) -> Path | None:
    """The manifest a folder (or manifest file) is read from: the file itself, the folder's pairs.csv /
    pairs.jsonl, or None for a folder of image files; a path that is neither is a DataError."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise DataError(f"{path}: no such folder or manifest file")
    return next((path / name for name in MANIFEST_NAMES if (path / name).is_file()), None)


def folder_contents(
    path: str | Path, problems: Problems | None = None, *, encoding: str | None = None
) -> FolderContents:
    """Read a folder (or manifest file) in whichever layout it has; `problems` collects row errors;
    `encoding`: a manifest's text encoding when it is not UTF-8."""
    path = Path(path)
    manifest = manifest_of(path)
    if manifest is not None:
        return _manifest(manifest, problems or Problems(str(manifest)), encoding)
    problems = problems or Problems(str(path))
    if (path / "before").is_dir() and (path / "after").is_dir():
        contents = _subfolders(path, problems)
    else:
        contents = _side_by_side(path, problems)
    if not contents.pairs and not contents.skipped:
        raise DataError(
            f"{path}: found no image pairs: expected before/ and after/ folders, NAME_before/NAME_after files, "
            "or a pairs.csv / pairs.jsonl manifest"
        )
    if not contents.pairs:  # every image lacks its partner: likely misnamed files, not a folder to caption nothing of
        examples = "; ".join(f"{skip.record} ({skip.reason})" for skip in contents.skipped[:3])
        raise DataError(f"no pairs found in {path}: {len(contents.skipped)} file(s) without a partner, e.g. {examples}")
    return contents


def assign_splits(pairs: list[FolderPair], options: SplitOptions) -> dict[str, str]:
    """pair_id -> split: the given one, else "test" without captions, else seeded per group sharing an image."""
    split_of = {pair.pair_id: pair.split or "test" for pair in pairs}
    split_of.update(
        draw_splits(
            [
                (pair.pair_id, pair.first.before, pair.first.after)
                for pair in pairs
                if pair.split is None and pair.captions
            ],
            options,
        )
    )
    return split_of


def draw_splits(open_pairs: list[tuple[str, object, object]], options: SplitOptions) -> dict[str, str]:
    """pair_id -> split of the pairs with captions and no split, `(pair_id, before, after)`: seeded per group of
    pairs sharing an image (paths compared as text)."""
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for pair_id, before, after in open_pairs:  # union the pair with its images: pairs sharing an image share a group
        for image in (before, after):
            a, b = find("pair:" + pair_id), find(f"image:{image}")
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[str, list[str]] = {}
    for pair_id, _, _ in open_pairs:
        groups.setdefault(find("pair:" + pair_id), []).append(pair_id)
    split_of: dict[str, str] = {}
    for members in groups.values():
        split = options.assign(min(members))
        for pair_id in members:
            split_of[pair_id] = split
    return split_of


@register_format("folder", splits=(*SPLITS, ALL))
def read_folder(path: str | Path, split: str = ALL, *, options: SplitOptions = SplitOptions()) -> DatasetIndex:
    """One split of a user's folder (or of a pairs.csv / pairs.jsonl manifest file); "all" = every pair."""
    if split not in (*SPLITS, ALL):
        raise DataError(f"folder: no split {split!r}; choose from {', '.join((*SPLITS, ALL))}")
    contents = folder_contents(path)
    split_of = assign_splits(contents.pairs, options)
    pairs, skipped = [], list(contents.skipped)
    merged, contents.pairs = contents.pairs, []
    for position, pair in enumerate(merged):
        merged[position] = None  # each merged row freed once its record exists: the peak of 1,000,000 pairs
        if split != ALL and split_of[pair.pair_id] != split:
            continue
        if split in ("train", "val") and not pair.captions:
            skipped.append(
                SkippedRecord(
                    contents.source, f"{pair.first.record} (id {pair.pair_id!r})", NOT_TRAINABLE, drops_pair=True
                )
            )
            continue
        pairs.append(to_change_pair(pair, split_of[pair.pair_id]))
    return DatasetIndex("folder", contents.root, split, pairs, skipped, notes=contents.notes)


def read_folder_pairs(path: str | Path, *, options: SplitOptions = SplitOptions()) -> DatasetIndex:
    """`read_folder(path, "all")` — every pair, the same records in the same order — with a manifest's pairs in a
    `FolderPairTable` (`index.pairs[i]` makes the ChangePair; `index.pairs.pair_id(i)` reads only the id): what
    `caption.py` holds of a million-row manifest. A folder of image files is read by `read_folder` (a list)."""
    manifest = manifest_of(path)
    if manifest is None:
        return read_folder(path, ALL, options=options)
    problems, columns = Problems(str(manifest)), []
    table = build_table(iter_manifest_rows(manifest, problems, None, columns, paths_as_text=True), problems)
    table.set_splits(draw_splits(list(table.open_pairs()), options))
    notes = _manifest_notes(manifest, [name for name in columns if name not in COLUMNS])
    return DatasetIndex("folder", manifest.parent, ALL, table, [], notes=notes)
