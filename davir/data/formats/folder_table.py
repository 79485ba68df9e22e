"""A manifest's pairs held compactly: what `caption.py` keeps of a user's 1,000,000 pairs before the first one.

    table = read_folder_pairs("my_pairs/pairs.jsonl").pairs   # davir.data.formats.folder: build_table + splits
    len(table), table.pair_id(i)                              # no ChangePair made
    table[i]                                                  # the ChangePair read_folder(…, "all") gives

Memory per pair, and why: docs/datasets.md, "Your own folder of pairs".
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from davir.data.formats.folder_rows import (
    SPLITS,
    FolderPair,
    FolderRow,
    Problems,
    image_conflict,
    split_conflict,
    to_change_pair,
)
from davir.data.records import ChangePair

CAPTION_SEPARATOR = "\n"  # never inside a caption: caption_list joins each sentence's words with single spaces
_NO_SPLIT = -1


class TextColumn:
    """A column of strings: their UTF-8 bytes end to end in one bytearray, and where each one ends. A column of
    empty strings only (a manifest without masks) keeps just its length."""

    __slots__ = ("data", "ends", "empties")

    def __init__(self):
        self.data = bytearray()
        self.ends: array | None = None  # made at the first non-empty value
        self.empties = 0  # values appended while `ends` is None

    def append(self, text: str) -> None:
        if self.ends is None:
            if not text:
                self.empties += 1
                return
            self.ends = array("Q", bytes(8 * self.empties))
        self.data += text.encode("utf-8", "surrogatepass")  # a JSON manifest may hold a lone surrogate ("\ud800")
        self.ends.append(len(self.data))

    def __getitem__(self, i: int) -> str:
        if self.ends is None:
            if not 0 <= i < self.empties:
                raise IndexError("text column index out of range")
            return ""
        return self.data[self.ends[i - 1] if i else 0 : self.ends[i]].decode("utf-8", "surrogatepass")

    def is_empty(self, i: int) -> bool:
        return self.ends is None or self.ends[i] == (self.ends[i - 1] if i else 0)

    def __len__(self) -> int:
        return self.empties if self.ends is None else len(self.ends)

    def nbytes(self) -> int:
        return len(self.data) + (0 if self.ends is None else self.ends.itemsize * len(self.ends))


class FolderPairTable(Sequence):
    """The merged pairs of a manifest, in first-appearance order; `table[i]` makes pair i's `ChangePair`.

    Text columns hold what a pair's first row gave (paths as `str(Path)`, "" for none; `meta` as JSON); the
    captions of the pair's later rows, when an id repeats, are kept apart (`_more_captions`)."""

    def __init__(self):
        self._ids, self._records = TextColumn(), TextColumn()
        self._before, self._after = TextColumn(), TextColumn()
        self._mask, self._mask_before = TextColumn(), TextColumn()
        self._captions, self._meta = TextColumn(), TextColumn()
        self._explicit = array("b")
        self._split = array("b")  # index into SPLITS; _NO_SPLIT until `set_splits`
        self._more_captions: dict[int, list[str]] = {}

    # ------------------------------------------------------------------------------------------- building
    def append_row(self, row: FolderRow) -> int:
        """Pair `row` begins (the first row of its id); its position."""
        position = len(self._ids)
        self._ids.append(row.pair_id)
        self._records.append(row.record)
        for column, path in (
            (self._before, row.before),
            (self._after, row.after),
            (self._mask, row.mask),
            (self._mask_before, row.mask_before),
        ):
            column.append("" if path is None else str(path))  # a resolved path is never "" (normpath gives ".")
        if any(CAPTION_SEPARATOR in caption for caption in row.captions):  # not made by caption_list: kept apart
            self._captions.append("")
            self._more_captions[position] = list(row.captions)
        else:
            self._captions.append(CAPTION_SEPARATOR.join(row.captions))
        self._meta.append("" if row.meta is None else json.dumps(row.meta, ensure_ascii=False))
        self._explicit.append(row.explicit_id)
        self._split.append(_NO_SPLIT if row.split is None else SPLITS.index(row.split))
        return position

    def add_captions(self, position: int, captions: list[str]) -> None:
        """Captions of a later row of pair `position`'s id, after the ones it has."""
        if captions:
            self._more_captions.setdefault(position, []).extend(captions)

    def given_split(self, position: int) -> str | None:
        code = self._split[position]
        return None if code == _NO_SPLIT else SPLITS[code]

    def set_given_split(self, position: int, split: str) -> None:
        self._split[position] = SPLITS.index(split)

    def open_pairs(self) -> Iterator[tuple[str, str, str]]:
        """(pair id, before, after) of each pair with captions and no split: the ones `assign_splits` draws."""
        for position in range(len(self)):
            if self._split[position] == _NO_SPLIT and self.has_captions(position):
                yield self._ids[position], self._before[position], self._after[position]

    def set_splits(self, drawn: dict[str, str]) -> None:
        """Every pair's split: its given one, else the drawn one (`drawn`, by id), else "test"."""
        test = SPLITS.index("test")
        for position in range(len(self)):
            if self._split[position] == _NO_SPLIT:
                split = drawn.get(self._ids[position]) if self.has_captions(position) else None
                self._split[position] = test if split is None else SPLITS.index(split)

    # ------------------------------------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._ids)

    def pair_id(self, position: int) -> str:
        return self._ids[position]

    def has_captions(self, position: int) -> bool:
        return not self._captions.is_empty(position) or bool(self._more_captions.get(position))

    def captions(self, position: int) -> list[str]:
        text = self._captions[position]
        return (text.split(CAPTION_SEPARATOR) if text else []) + self._more_captions.get(position, [])

    def first_row(self, position: int, *, paths_as_text: bool = False) -> FolderRow:
        """The first row of pair `position` as the manifest reader made it (its own captions aside); its paths
        are Paths, or their text with `paths_as_text`."""
        kind = str if paths_as_text else Path

        def path(column: TextColumn):
            return kind(column[position]) if not column.is_empty(position) else None

        meta = self._meta[position]
        return FolderRow(
            record=self._records[position],
            pair_id=self._ids[position],
            before=path(self._before),
            after=path(self._after),
            split=self.given_split(position),
            mask=path(self._mask),
            mask_before=path(self._mask_before),
            explicit_id=bool(self._explicit[position]),
            meta=json.loads(meta) if meta else None,
        )

    def __getitem__(self, position):
        if isinstance(position, slice):
            return [self[i] for i in range(*position.indices(len(self)))]
        if position < 0:
            position += len(self)
        if not 0 <= position < len(self):
            raise IndexError("pair index out of range")
        code = self._split[position]
        first = self.first_row(position)
        return to_change_pair(
            FolderPair(first, [first.record], self.captions(position), first.split),
            "test" if code == _NO_SPLIT else SPLITS[code],
        )

    def __iter__(self) -> Iterator[ChangePair]:
        return (self[i] for i in range(len(self)))

    def nbytes(self) -> int:
        """Bytes the columns hold (the later rows' captions aside)."""
        columns = (
            self._ids,
            self._records,
            self._before,
            self._after,
            self._mask,
            self._mask_before,
            self._captions,
            self._meta,
        )
        return sum(column.nbytes() for column in columns) + len(self._explicit) + len(self._split)


def build_table(rows: Iterable[FolderRow], problems: Problems) -> FolderPairTable:
    """`merge_rows` into a table, one row at a time: one pair per id in first-appearance order, a repeated id's
    captions after its first row's. The merge problems are reported after every row is read, in row order — as
    `merge_rows` does after the whole manifest is parsed, so a strict reader raises the same first problem."""
    table = FolderPairTable()
    position_of: dict[str, int] = {}
    merge_problems: list[tuple[str, str]] = []
    for row in rows:
        position = position_of.get(row.pair_id)
        if position is None:
            position_of[row.pair_id] = table.append_row(row)
            continue
        first = table.first_row(position, paths_as_text=isinstance(row.before, str))  # compared like for like
        conflict = image_conflict(first, row)
        if conflict:
            merge_problems.append((row.record, conflict))
            continue
        split = table.given_split(position)
        conflict = split_conflict(first, split, row)
        if conflict:
            merge_problems.append((row.record, conflict))
        if split is None and row.split:
            table.set_given_split(position, row.split)
        table.add_captions(position, row.captions)
    del position_of
    for record, message in merge_problems:
        problems.add(record, message)
    return table
