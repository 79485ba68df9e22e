"""The rows of a user's folder of pairs, before they become `ChangePair` records.

Every layout of the `folder` format (a pairs.csv / pairs.jsonl manifest, before/ + after/ folders,
NAME_before / NAME_after files) is read into `FolderRow`s; rows that repeat an id are merged into
`FolderPair`s (captions concatenated in file order), then split and filtered by `folder.py`.

Problems go to a `Problems` collector: the reader raises at the first one (DataError naming the file
and row), `python -m davir.data import` collects them all in one pass.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from davir.data.images import resolve_user_path
from davir.data.records import ChangePair
from davir.errors import DataError
from davir.io import read_json

# Manifest columns davir reads; any other column is reported once (DatasetIndex.notes) and kept in meta.
COLUMNS = ("id", "before", "after", "caption", "captions", "split", "mask", "mask_before")
SPLITS = ("train", "val", "test")
SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val", "test": "test"}


class Problems:
    """Where row problems go: `strict` raises the first as a DataError, otherwise they are collected."""

    def __init__(self, source: str, strict: bool = True):
        self.source = source
        self.strict = strict
        self.items: list[tuple[str, str]] = []  # (record, message)

    def add(self, record: str, message: str) -> None:
        if self.strict:
            raise DataError(f"{self.source}: {record}: {message}")
        self.items.append((record, message))

    def lines(self) -> list[str]:
        return [f"{self.source}: {record}: {message}" for record, message in self.items]


@dataclass(slots=True)  # a 1,000,000-row manifest holds a million of them: no per-object __dict__
class FolderRow:
    """One row of a manifest (or one matched file pair) with its paths resolved (`str`s, not Paths, for a
    compact table: `iter_manifest_rows(…, paths_as_text=True)`)."""

    record: str  # "line 7" (CSV, the header is line 1), "row 3" (JSONL), or a file name
    pair_id: str
    before: Path
    after: Path
    captions: list[str] = field(default_factory=list)
    split: str | None = None
    mask: Path | None = None
    mask_before: Path | None = None
    empty_caption: bool = False  # a caption cell was present but blank
    explicit_id: bool = True
    meta: dict | None = None  # the row's other columns; None when it has none (most rows: no dict each)


@dataclass(slots=True)
class FolderPair:
    """The merged rows of one id."""

    first: FolderRow
    records: list[str]
    captions: list[str]
    split: str | None
    empty_caption_records: list[str] = field(default_factory=list)  # rows whose caption cell was blank

    @property
    def pair_id(self) -> str:
        return self.first.pair_id


def to_change_pair(pair: FolderPair, split: str) -> ChangePair:
    first = pair.first
    mask_before = first.mask_before or first.mask
    return ChangePair(
        pair_id=pair.pair_id,
        before=first.before,
        after=first.after,
        captions=tuple(pair.captions),
        split=split,
        gt_mask_before=mask_before,
        gt_mask_after=first.mask,
        meta=dict(first.meta or {}),
    )


def normalise_split(value: Any, *, record: str, problems: Problems) -> str | None:
    """ "train"/"val"/"test" (also "valid", "validation", "dev", any case); blank = unassigned (None)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    name = SPLIT_NAMES.get(str(value).strip().lower())
    if name is None:
        problems.add(record, f"split {value!r} is not one of train, val, test")
    return name


def caption_list(value: Any, *, record: str, field_name: str, problems: Problems) -> tuple[list[str], bool]:
    """(captions, had_blank): a `caption` string, or a `captions` list (in CSV, a JSON list in the cell)."""
    if value is None:
        return [], False
    if field_name == "captions" and isinstance(value, str):
        if not value.strip():
            return [], True
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            problems.add(record, f'\'captions\' must be a JSON list of strings, e.g. ["a", "b"]; got {value[:60]!r}')
            return [], False
    values = value if isinstance(value, list) else [value]
    captions, blank = [], False
    for number, sentence in enumerate(values):
        if not isinstance(sentence, str):
            problems.add(
                record, f"{field_name}[{number}] must be a string, got {type(sentence).__name__} {sentence!r:.40}"
            )
            continue
        if sentence.strip():
            captions.append(" ".join(sentence.split()))
        else:
            blank = True
    return captions, blank


def _csv_rows(path: Path, problems: Problems, encoding: str | None, columns: list[str]) -> Iterator[tuple[str, dict]]:
    """(record, row) per data line, streamed (a manifest of a million rows is never held as dicts); `columns`
    is filled from the header."""
    with open(path, newline="", encoding=encoding or "utf-8-sig") as handle:  # -sig: Excel writes a BOM
        # strict: a quote left open is an error, not the rest of the file read into one caption
        reader = _rows_with_lines(csv.reader(handle, strict=True), path)
        header = next(reader, (None, None))[1]
        if header is None:
            raise DataError(
                f"{path}: the manifest is empty; it needs a header naming the columns before,after[,id,caption,split,mask]"
            )
        columns.extend(name.strip().lower() for name in header)
        if "before" not in columns or "after" not in columns:
            raise DataError(
                f"{path}: the header must name the columns before,after[,id,caption,split,mask]; got {header}"
            )
        duplicated = sorted({name for name in columns if columns.count(name) > 1 and name})
        if duplicated:
            raise DataError(f"{path}: the header names the column(s) {', '.join(duplicated)} more than once")
        for number, cells in reader:
            if not any(cell.strip() for cell in cells):
                continue
            if len(cells) > len(columns):
                problems.add(
                    f"line {number}",
                    f"{len(cells)} values but the header names {len(columns)} columns "
                    f"(extra: {cells[len(columns) :]!r:.60}); quote a caption that contains a comma",
                )
                cells = cells[: len(columns)]
            yield f"line {number}", {name: cell for name, cell in zip(columns, cells) if name}


def _rows_with_lines(reader, path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each CSV row, the line it ends on (header = line 1); a malformed quote is a DataError
    naming the line its row starts on (csv's own position is where it gave up: for an open quote, the end)."""
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            if "unexpected end of data" in str(error):
                problem = 'a quoted value is not closed before the end of the file; close it with a "'
            elif "expected after" in str(error):
                problem = f"a quoted value goes on after its closing quote ({error})"
            else:
                raise
            raise DataError(
                f'{path}: line {start}: {problem} (a quote inside a quoted value is written twice: "the 5"" screen")'
            ) from None
        yield reader.line_num, cells


def _jsonl_rows(path: Path, problems: Problems, encoding: str | None, columns: list[str]) -> Iterator[tuple[str, dict]]:
    """(record, row) per line, streamed; `columns` collects the keys in order of first appearance."""
    known: set[str] = set()
    with open(path, encoding=encoding or "utf-8-sig") as handle:  # -sig: as for CSV, a Windows editor's BOM
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                problems.add(f"line {number}", f"malformed JSON: {error.msg}")
                continue
            if not isinstance(row, dict):
                problems.add(f"line {number}", f'expected an object with "before" and "after", got {row!r:.60}')
                continue
            for key in row:
                if key not in known:
                    known.add(key)
                    columns.append(key)
            yield f"line {number}", row


def manifest_rows(
    path: Path, problems: Problems, encoding: str | None = None
) -> tuple[list[FolderRow], list[str], list[str]]:
    """The rows of a pairs.csv / pairs.jsonl, the columns davir does not use, and all columns.

    `encoding`: the file's text encoding when it is not UTF-8 (`davir.data import --encoding latin-1`)."""
    columns: list[str] = []
    rows = list(iter_manifest_rows(path, problems, encoding, columns))
    unused = [name for name in columns if name not in COLUMNS]
    return rows, unused, columns


def iter_manifest_rows(
    path: Path,
    problems: Problems,
    encoding: str | None = None,
    columns: list[str] | None = None,
    *,
    paths_as_text: bool = False,
) -> Iterator[FolderRow]:
    """The rows of a pairs.csv / pairs.jsonl one at a time (`manifest_rows` without the list: a reader that
    keeps each row compactly never holds a million `FolderRow`s); `columns` is filled with every column.
    `paths_as_text`: the rows' paths are the `str` of the Paths they would be (`resolve_user_text`)."""
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise DataError(f"{path}: a pair manifest must be a .csv or .jsonl file")
    kind = "CSV" if suffix == ".csv" else "JSON-lines"
    base, count = path.parent, 0
    columns = [] if columns is None else columns
    try:
        for record, row in (_csv_rows if suffix == ".csv" else _jsonl_rows)(path, problems, encoding, columns):
            count += 1
            parsed = _manifest_row(row, record, base, str(path), problems, paths_as_text)
            if parsed is not None:
                parsed.meta = {
                    name: value for name, value in row.items() if name not in COLUMNS and value not in (None, "")
                } or None
                yield parsed
    except LookupError as error:
        raise DataError(f"--encoding {encoding}: unknown encoding (e.g. utf-8, latin-1, cp1252)") from error
    except UnicodeDecodeError as error:  # a binary or mis-encoded file
        raise DataError(_undecodable(path, kind, encoding or "utf-8")) from error
    except csv.Error as error:
        raise DataError(f"{path}: not a UTF-8 {kind} file ({error})") from error
    if not count and not problems.items:
        raise DataError(f"{path}: the manifest lists no pairs (a header and no rows); add one row per pair")


def _undecodable(path: Path, kind: str, encoding: str) -> str:
    """Where a manifest stops decoding (line and column; the decoder's own position is within a buffer),
    and how to make it UTF-8: most often a spreadsheet saved it as Latin-1 / Windows-1252."""
    data = path.read_bytes()
    try:
        data.decode(encoding)
        offset = 0
    except UnicodeDecodeError as error:
        offset = error.start
    line_start = data.rfind(b"\n", 0, offset) + 1
    line = data.count(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode(encoding, errors="replace")) + 1
    name = "UTF-8" if encoding.replace("_", "-").lower() in ("utf-8", "utf8") else encoding
    converted = path.with_name(f"{path.stem}-utf8{path.suffix}")
    return (
        f"{path}: line {line}, column {column}: not a {name} {kind} file (byte 0x{data[offset]:02x}); a spreadsheet "
        f"may have saved it as Latin-1 or Windows-1252: convert it with `iconv -f latin1 -t utf-8 {path} > "
        f"{converted}` (-f cp1252 for Windows), or import it with `python -m davir.data import {path} "
        "--encoding latin-1 --out DIR`, which writes a UTF-8 pairs.jsonl"
    )


def resolve_user_text(base: Path, value: str, *, source: str, record: str) -> str:
    """`resolve_user_path` as the text of the path it returns, without making the Path (a table of a million rows
    makes two million of them otherwise): `str(resolve_user_path(…))` — normpath's result is what pathlib prints."""
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{source}: {record}: image path is empty or not a string: {value!r}")
    text = os.path.expanduser(value.strip())
    return os.path.normpath(text if os.path.isabs(text) else os.path.join(base, text))


def _manifest_row(
    row: dict, record: str, base: Path, source: str, problems: Problems, as_text: bool = False
) -> FolderRow | None:
    paths = {}
    resolve = resolve_user_text if as_text else resolve_user_path
    for column in ("before", "after", "mask", "mask_before"):
        value = row.get(column)
        if value in (None, ""):
            if column in ("before", "after"):
                problems.add(record, f"the {column!r} path is missing or empty")
                return None
            continue
        if not isinstance(value, str):
            problems.add(record, f"the {column!r} path must be a string, got {value!r:.40}")
            return None
        paths[column] = resolve(base, value, source=source, record=record)
    if "mask_before" in paths and "mask" not in paths:
        problems.add(record, "'mask_before' is given without 'mask' (the change mask in the after image)")
    raw_id = row.get("id")
    if raw_id in (None, ""):
        pair_id, explicit = Path(str(row["before"]).strip()).stem, False
        if not pair_id:
            problems.add(record, f"no id, and the before path {row['before']!r} has no file name to take one from")
            return None
    elif isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)) or not str(raw_id).strip():
        problems.add(record, f"'id' must be a non-empty string, got {raw_id!r}")
        return None
    else:
        pair_id, explicit = str(raw_id).strip(), True
    captions, blank = caption_list(row.get("caption"), record=record, field_name="caption", problems=problems)
    more, blank_more = caption_list(row.get("captions"), record=record, field_name="captions", problems=problems)
    return FolderRow(
        record=record,
        pair_id=pair_id,
        before=paths["before"],
        after=paths["after"],
        captions=captions + more,
        split=normalise_split(row.get("split"), record=record, problems=problems),
        mask=paths.get("mask"),
        mask_before=paths.get("mask_before"),
        empty_caption=(blank or blank_more) and not (captions or more),
        explicit_id=explicit,
    )


def read_caption_file(path: Path, names: set[str], problems: Problems) -> tuple[dict[str, list[str]], list[str]]:
    """A `captions.json` beside before/ and after/: {name: [captions] or "caption"}; (captions by name, unknown keys).

    A key may be the pair name or a before file's name ("0001" or "0001.png")."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected an object mapping pair names to caption lists, got {type(data).__name__}")
    found, unknown = {}, []
    for key, value in data.items():
        name = key if key in names else Path(key).stem
        if name not in names:
            unknown.append(key)
            continue
        captions, _ = caption_list(
            value,
            record=f"key {key!r}",
            field_name="captions" if isinstance(value, list) else "caption",
            problems=problems,
        )
        found.setdefault(name, []).extend(captions)
    return found, unknown


IMAGE_COLUMNS = ("before", "after", "mask", "mask_before")


def image_conflict(first: FolderRow, row: FolderRow) -> str | None:
    """Why `row` cannot merge into the pair `first` began (it repeats the id with other images), or None."""
    for name in IMAGE_COLUMNS:
        if getattr(first, name) != getattr(row, name):
            how = "" if row.explicit_id else " (the id is the before file's name; add an id column)"
            return (
                f"repeats the id {row.pair_id!r} of {first.record}{how} but with a different "
                f"{name} image: {getattr(row, name)} vs {getattr(first, name)}"
            )
    return None


def split_conflict(first: FolderRow, split: str | None, row: FolderRow) -> str | None:
    """Why `row` contradicts the split its pair has so far (`split`), or None."""
    if row.split and split and row.split != split:
        return f"puts id {row.pair_id!r} in split {row.split!r} but {first.record} put it in {split!r}"
    return None


def merge_rows(rows: list[FolderRow], problems: Problems) -> list[FolderPair]:
    """One FolderPair per id, in first-appearance order; a repeated id must repeat the same images."""
    merged: dict[str, FolderPair] = {}
    for row in rows:
        pair = merged.get(row.pair_id)
        if pair is None:
            # the row's own caption list (made for it alone) grows with the id's later rows: no copy per pair
            merged[row.pair_id] = FolderPair(
                row, [row.record], row.captions, row.split, [row.record] if row.empty_caption else []
            )
            continue
        conflict = image_conflict(pair.first, row)
        if conflict:
            problems.add(row.record, conflict)
            continue
        conflict = split_conflict(pair.first, pair.split, row)
        if conflict:
            problems.add(row.record, conflict)
        pair.split = pair.split or row.split
        pair.captions.extend(row.captions)
        pair.records.append(row.record)
        if row.empty_caption:
            pair.empty_caption_records.append(row.record)
    return list(merged.values())
