"""What the three toolkit formats share: one conversation per (pair, reference caption), one JSONL file per split.

A pair with k reference captions is k conversations with the same ``id`` (the toolkits train on one answer per
sample); a pair without a caption (a test pair of a user's folder) is one conversation with an empty answer.
Every conversation names the before image first, then the after image, then the prompt. Image paths are written
absolute; reading back, a relative path is taken from the export folder (LLaMA-Factory's ``media_dir`` default).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from davir.data.records import ChangePair
from davir.errors import DataError
from davir.io import atomic_path, file_sha256, iter_jsonl, read_json

SPLITS = ("train", "val", "test")
ID_KEY = "id"  # the pair id, kept in every record: the toolkits' loaders drop columns they do not read


@dataclass(frozen=True)
class Conversation:
    """One sample of a toolkit dataset: a pair's two images, its prompt and one answer."""

    pair_id: str
    split: str
    before: str
    after: str
    prompt: str
    answer: str


def conversations(pairs: Iterable[ChangePair], prompt_for: Callable[[ChangePair], str]) -> Iterator[Conversation]:
    """One conversation per reference caption of each pair (one with an empty answer for a pair without any)."""
    for pair in pairs:
        prompt = prompt_for(pair)
        if not prompt or not prompt.strip():
            raise DataError(f"pair {pair.pair_id!r}: the prompt is empty")
        before, after = str(Path(pair.before).resolve()), str(Path(pair.after).resolve())
        for caption in pair.captions or ("",):
            yield Conversation(pair.pair_id, pair.split, before, after, prompt, caption)


def write_rows(path: Path, rows: Iterable[dict]) -> tuple[int, str]:
    """Rows as JSON lines into `path` (a temporary the caller renames); returns (count, sha256 of the file)."""
    count, digest = 0, hashlib.sha256()
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            line = json.dumps(row, ensure_ascii=False) + "\n"
            handle.write(line)
            digest.update(line.encode("utf-8"))
            count += 1
        handle.flush()
        os.fsync(handle.fileno())
    return count, digest.hexdigest()


def write_jsonl(path: Path, rows: Iterable[dict]) -> int:
    """Rows as JSON lines, written through a temporary file (atomic); returns the count."""
    with atomic_path(path) as tmp:
        return write_rows(tmp, rows)[0]


EXPORT_RECORD = "davir_export.json"


def written_files(out: Path) -> dict[str, str]:
    """{file name: sha256} of the files an earlier export wrote into `out` (its davir_export.json), {} if none."""
    record = out / EXPORT_RECORD
    if not record.exists():
        return {}
    data = read_json(record)
    if not isinstance(data, dict) or "toolkit" not in data:
        raise DataError(
            f"{record} was not written by `python -m davir.data export`; pass --overwrite to replace "
            "it, or choose another --out"
        )
    hashes = data.get("sha256")
    return {k: v for k, v in hashes.items() if isinstance(v, str)} if isinstance(hashes, dict) else {}


def check_replaceable(out: Path, names: Iterable[str], *, overwrite: bool) -> dict[str, str]:
    """Refuse (DataError) to replace a file of `out` that no earlier export wrote, or that changed since it did
    (its sha256 in davir_export.json), unless `overwrite`; returns the earlier export's {name: sha256}."""
    try:
        written = written_files(out)
    except DataError:
        if not overwrite:
            raise
        written = {}
    for name in [] if overwrite else names:
        path = out / name
        if not (path.exists() or path.is_symlink()):
            continue
        if not path.is_file():
            raise DataError(f"{path} is not a file; choose another --out")
        if written.get(name) != file_sha256(path):
            raise DataError(
                f"{path} exists and was not written by `python -m davir.data export` (or was changed "
                "since); pass --overwrite to replace it, or choose another --out"
            )
    return written


@dataclass(frozen=True)
class ImportOptions:
    """What the user said about a toolkit dataset: images outside its folder may be read (``--allow-outside``), the
    split of a file whose name is not one (``--split``), the LLaMA-Factory datasets to read (``--dataset``)."""

    allow_outside: bool = False
    split: str | None = None
    datasets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Skipped:
    """A row that is no pair davir can import: ``reason`` names the file, the row and the key."""

    reason: str


class FolderGuard:
    """Does a path stay inside a downloaded dataset's folder once ``..`` and every symlink are followed?
    (the toolkit formats' counterpart of ``davir.data.formats._common.links_leaving``). Each folder is resolved
    once; a file costs one lstat (and a realpath when it is a link). Used by every toolkit reader, TRL's too:
    ``guard.leaves(path)`` is the real path when it leads out, else None."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.real = os.path.realpath(folder)
        self._folders: dict[str, str] = {}

    def leaves(self, path: str | Path) -> str | None:
        parent, name = os.path.split(os.path.join(self.folder, path))
        real_parent = self._folders.get(parent)
        if real_parent is None:
            real_parent = self._folders[parent] = os.path.realpath(parent)
        joined = os.path.join(real_parent, name)
        real = os.path.realpath(joined) if name in ("", ".", "..") or os.path.islink(joined) else joined
        return None if os.path.commonpath([self.real, real]) == self.real else real

    def check_file(self, path: Path, what: str) -> Path:
        """A file a dataset's own files name (dataset_info.json's ``file_name``, a split file): DataError when it
        leads out of the folder (the caller skips this check under ``--allow-outside``)."""
        real = self.leaves(path)
        if real is not None:
            raise DataError(
                f"{what} leads out of the dataset folder {self.folder} (to {real}); a downloaded dataset "
                "is read only inside its folder: pass --allow-outside if you trust it"
            )
        return path

    def refuse(self, record: str, talk: Conversation) -> Skipped | None:
        """Why a conversation's images lead out of the folder (a Skipped naming the row), or None."""
        for role, path in (("before", talk.before), ("after", talk.after)):
            real = self.leaves(path)
            if real is not None:
                through = f" (through a symlink, to {real})" if real != os.path.normpath(path) else ""
                return Skipped(
                    f"{record}: the {role} image {path} lies outside the dataset folder {self.folder}"
                    f"{through}; pass --allow-outside to read images outside it (davir's own export "
                    "names absolute paths)"
                )
        return None


def split_of(stem: str, options: ImportOptions, declared: str | None = None) -> str:
    """The split of a file: its name when that is a split (train.jsonl), else ``--split``, else the split its
    dataset declares (LLaMA-Factory's dataset_info ``split``), else "" (the import's seeded split decides)."""
    if stem in SPLITS:
        return stem
    if options.split:
        return options.split
    declared = {"validation": "val", "dev": "val"}.get(declared, declared) if isinstance(declared, str) else None
    return declared if declared in SPLITS else ""


def read_values(path: Path) -> Iterator[tuple[str, object]]:
    """(record name "file: line N", value) of a .jsonl file, or of a .json file holding a list of records."""
    if not path.is_file():
        raise DataError(f"toolkit dataset file is missing: {path}")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise DataError(f"{path}: not valid JSON ({error})") from None
        except UnicodeDecodeError as error:
            raise DataError(f"{path}: not UTF-8 text ({error})") from None
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
        yield from ((f"{path}: record {number}", row) for number, row in enumerate(data))
        return
    yield from ((f"{path}: line {number}", row) for number, row in iter_jsonl(path))


def read_rows(path: Path) -> Iterator[tuple[str, dict]]:
    """(record name, row) of every row; a row that is not a JSON object is a DataError."""
    for record, row in read_values(path):
        if not isinstance(row, dict):
            raise DataError(f"{record}: expected a JSON object, got {type(row).__name__}")
        yield record, row


def read_samples(
    path: Path, decode: Callable[[dict, str, int], Conversation]
) -> Iterator[tuple[str, Conversation | Skipped]]:
    """(record, conversation) of each row ``decode(row, record, number)`` accepts, (record, Skipped) of each it
    refuses with a DataError: one malformed row never stops the others (file-level problems still do)."""
    for number, (record, row) in enumerate(read_values(path)):
        if not isinstance(row, dict):
            yield record, Skipped(f"{record}: expected a JSON object, got {type(row).__name__}")
            continue
        try:
            yield record, decode(row, record, number)
        except DataError as error:
            yield record, Skipped(str(error))


def turn_text(turn: dict, key: str, record: str, which: str) -> str:
    """A turn's text under ``key`` (missing or null: ""); anything but a string is a DataError naming the key."""
    value = turn.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{record}: the {which} turn's {key!r} must be text, got {type(value).__name__}")
    return value


def user_and_answer(
    messages,
    record: str,
    key: str,
    *,
    role: str = "role",
    user: str = "user",
    assistant: str = "assistant",
    system: str = "system",
) -> tuple[dict, dict]:
    """The user turn and the assistant turn of a one-question conversation (a leading system turn is allowed);
    any other shape is a DataError naming the key."""
    if not isinstance(messages, list):
        raise DataError(f"{record}: {key!r} must be a list of turns, got {type(messages).__name__}")
    for number, turn in enumerate(messages):
        if not isinstance(turn, dict):
            raise DataError(f"{record}: {key!r} turn {number} must be a JSON object, got {type(turn).__name__}")
    turns = messages[1:] if messages and messages[0].get(role) == system else messages
    roles = [turn.get(role) for turn in turns]
    if roles != [user, assistant]:
        raise DataError(
            f"{record}: {key!r} holds the turns {roles}; davir imports one {user!r} turn then one "
            f"{assistant!r} turn (a pair and its caption)"
        )
    return turns[0], turns[1]


def split_files(
    source: Path, *, suffixes: tuple[str, ...] = (".jsonl", ".json"), allow_outside: bool = False
) -> list[tuple[str, Path]]:
    """(split, file) to read: a file alone (its name is its split: train.jsonl), or a folder's train/val/test files
    (a split file that is a symlink leading out of the folder is refused unless ``allow_outside``)."""
    source = Path(source)
    if source.is_file():
        return [(source.stem, source)]
    if not source.is_dir():
        raise DataError(f"{source}: no such toolkit dataset file or folder")
    guard = FolderGuard(source)
    found = []
    for split in SPLITS:
        files = [source / f"{split}{suffix}" for suffix in suffixes if (source / f"{split}{suffix}").is_file()]
        if len(files) > 1:  # reading both would double every caption
            raise DataError(
                f"{source}: both {' and '.join(f.name for f in files)} hold split {split!r}; davir reads "
                "one file per split: remove or rename one (or import one file: import FILE --from …)"
            )
        found += [(split, path if allow_outside else guard.check_file(path, str(path))) for path in files]
    if not found:
        raise DataError(f"{source}: no {'/'.join(SPLITS)}.jsonl files (what `python -m davir.data export` writes)")
    return found


def image_path(value, base: Path, record: str) -> str:
    """An image entry as an absolute path (relative ones from ``base``, symlinks kept: the import resolves them once
    ``FolderGuard`` has checked where they lead); a non-string entry is a DataError."""
    if isinstance(value, dict):  # {"path": ...} as datasets.Image stores a file it has not decoded
        value = value.get("path")
    if not isinstance(value, str) or not value:
        raise DataError(f"{record}: an image entry must be a path, got {value!r}")
    path = Path(value)
    return str(path if path.is_absolute() else os.path.abspath(base / path))


def two_images(row: dict, key: str, base: Path, record: str) -> tuple[str, str]:
    images = row.get(key)
    if not isinstance(images, list) or len(images) != 2:
        count = len(images) if isinstance(images, list) else "no list"
        raise DataError(f"{record}: {key!r} must list two images, before then after ({count} given)")
    return image_path(images[0], base, record), image_path(images[1], base, record)


def manifest_rows(read: Iterable[tuple[str, Conversation]]) -> list[dict]:
    """Folder-manifest rows (davir/data/formats/folder.py) from conversations: one per pair id, captions in order,
    the split only where the conversation has one (else the import's seeded split decides). A pair whose
    conversations disagree on its images or split is a DataError naming both records."""
    rows: dict[str, dict] = {}
    first: dict[str, str] = {}
    for record, talk in read:
        row = rows.get(talk.pair_id)
        if row is None:
            rows[talk.pair_id] = {
                "id": talk.pair_id,
                "before": talk.before,
                "after": talk.after,
                "captions": [talk.answer] if talk.answer.strip() else [],
                **({"split": talk.split} if talk.split else {}),
            }
            first[talk.pair_id] = record
            continue
        if (row["before"], row["after"], row.get("split", "")) != (talk.before, talk.after, talk.split):
            raise DataError(
                f"{record}: pair {talk.pair_id!r} has other images or another split than in {first[talk.pair_id]}"
            )
        if talk.answer.strip():
            row["captions"].append(talk.answer)
    return list(rows.values())
