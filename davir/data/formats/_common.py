"""Helpers shared by the format readers: caption validation and merging of repeated ids."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from davir.data.records import ChangePair, DatasetIndex, SkippedRecord
from davir.errors import DataError
from davir.io import read_json

EMPTY_SENTENCE = "empty or whitespace-only reference sentence"


def clean_captions(
    value: Any, *, source: str, record: str, field: str = "sentences"
) -> tuple[tuple[str, ...], list[SkippedRecord]]:
    """Validate a list of reference sentences; drop (and count) empty ones, strip the rest.

    A value that is not a list of strings is a DataError naming the file and record; an empty or
    whitespace-only sentence is a documented skip (SkippedRecord), because the real annotation files
    contain a few (Spot-the-Diff val has 6 empty sentences among its 3,310).
    """
    if not isinstance(value, list):
        raise DataError(f"{source}: {record}: {field!r} must be a list of strings, got {type(value).__name__}")
    captions: list[str] = []
    skipped: list[SkippedRecord] = []
    for number, sentence in enumerate(value):
        if not isinstance(sentence, str):
            raise DataError(
                f"{source}: {record}: {field}[{number}] must be a string, got {type(sentence).__name__} {sentence!r}"
            )
        if not sentence.strip():
            skipped.append(SkippedRecord(source, f"{record} {field}[{number}]", EMPTY_SENTENCE))
            continue
        captions.append(sentence.strip())
    return tuple(captions), skipped


def read_record_list(path: Path, keys: tuple[str, ...]) -> list:
    """An annotation file that must hold a JSON list of records (each later checked for `keys`)."""
    records = read_json(path)
    if not isinstance(records, list):
        fields = ", ".join(f'"{key}"' for key in keys)
        raise DataError(f"{path}: expected a list of {{{fields}}} records, got {type(records).__name__}")
    return records


def require_keys(entry: Any, keys: tuple[str, ...], *, source: str, record: str) -> dict:
    """Check an annotation entry is an object with the given keys."""
    if not isinstance(entry, dict):
        raise DataError(f"{source}: {record}: expected a JSON object, got {type(entry).__name__}")
    missing = [key for key in keys if key not in entry]
    if missing:
        raise DataError(f"{source}: {record}: missing key(s) {', '.join(map(repr, missing))}")
    return entry


def require_id(value: Any, *, source: str, record: str, field: str) -> str:
    """An id field must be a non-empty string (integers are accepted and converted)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise DataError(f"{source}: {record}: {field!r} must be a non-empty string, got {value!r}")
    return str(value)


_IMAGE_FIELDS = ("before", "after", "distractor", "gt_mask_before", "gt_mask_after")


class PairMerger:
    """Collect pairs in file order, merging records that repeat an id.

    Repeated ids with the same images are one pair whose captions are concatenated in file order
    (Spot-the-Diff has several annotators per image; every downstream repository merges them).
    Repeated ids with different images are a DataError naming both records.
    """

    def __init__(self, source: str):
        self.source = source
        self._pairs: dict[str, ChangePair] = {}
        self._first_record: dict[str, str] = {}

    def add(self, pair: ChangePair, record: str) -> None:
        previous = self._pairs.get(pair.pair_id)
        if previous is None:
            self._pairs[pair.pair_id] = pair
            self._first_record[pair.pair_id] = record
            return
        for name in _IMAGE_FIELDS:
            old, new = getattr(previous, name), getattr(pair, name)
            if old != new:
                raise DataError(
                    f"{self.source}: {self._first_record[pair.pair_id]} and {record} share the id {pair.pair_id!r} "
                    f"but have different {name} images: {old} vs {new}"
                )
        source = None
        if previous.source_captions is not None and pair.source_captions is not None:
            source = previous.source_captions + pair.source_captions
        self._pairs[pair.pair_id] = replace(
            previous, captions=previous.captions + pair.captions, source_captions=source
        )

    def pairs(self) -> list[ChangePair]:
        return list(self._pairs.values())


def plain_file_name(name: str, *, source: str, record: str) -> str:
    """A file name taken from an annotation, refused unless it is one plain name (no folders).

    Cheaper than `resolve_in_root` (no realpath per file, which dominates reading LEVIR-CC's
    10,077 pairs) and just as safe for ids that are only ever file names: "../x" or "/x" are errors.
    """
    if (
        not name
        or name.strip() != name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or (len(name) > 1 and name[1] == ":")
    ):
        raise DataError(f"{source}: {record}: {name!r} is not a plain file name (no folders, no '..', not absolute)")
    return name


def links_leaving(root: Path) -> dict[str, str]:
    """{path: where it leads} of every file symlink under `root` that resolves outside its own folder.

    Benchmark readers join plain file names to fixed folders (no realpath per file: reading 67,660 CLEVR-Change
    pairs must stay fast), so a symlink planted inside the dataset (`x.png -> /etc/passwd`, as an archive can
    carry) is found by one walk of the tree instead: directory entries only (no stat per file), a realpath per
    link. A symlinked image folder (on another disk) is normal and walked through, once per real folder.
    """
    found: dict[str, str] = {}
    seen: set[str] = set()
    stack = [str(root)]
    while stack:
        folder = stack.pop()
        real_folder = os.path.realpath(folder)
        if real_folder in seen:
            continue
        seen.add(real_folder)
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:  # ~1 µs an entry: d_type answers both questions for all but the links
                try:
                    if entry.is_symlink():
                        if entry.is_dir():
                            stack.append(entry.path)
                        else:
                            real = os.path.realpath(entry.path)
                            if os.path.commonpath([real_folder, real]) != real_folder:
                                found[entry.path] = real
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                except OSError:
                    continue
    return found


def refuse_links_leaving(index: DatasetIndex) -> DatasetIndex:
    """The index, or a DataError naming the first pair whose image (or mask) is a symlink leading out of its folder."""
    found = links_leaving(index.root)
    if found:
        for pair in index.pairs:
            for path in (pair.before, pair.after, pair.distractor, pair.gt_mask_before, pair.gt_mask_after):
                if path is not None and str(path) in found:
                    raise DataError(
                        f"{index.format} split {index.split!r} at {index.root}: pair {pair.pair_id!r}: "
                        f"{path} is a symlink that leads out of its dataset folder {Path(path).parent} "
                        f"(to {found[str(path)]})"
                    )
    return index
