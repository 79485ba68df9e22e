"""TRL: a conversational vision dataset of the prompt-completion type, two image parts before the prompt's text.

    dataset = load_dataset("json", data_files={"train": "DIR/train.jsonl"})["train"]
    dataset = dataset.cast_column("images", Sequence(Image()))      # paths → images, decoded when read

The record, and why prompt-completion rather than `messages`: docs/toolkits.md, "TRL".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from davir.data.toolkits.shared import ID_KEY, Conversation, FolderGuard, Skipped, read_values, split_files
from davir.errors import DataError

NAME = "trl"


def encode(talk: Conversation) -> dict:
    return {
        ID_KEY: talk.pair_id,
        "images": [talk.before, talk.after],
        "prompt": [
            {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": talk.prompt}]}
        ],
        "completion": [{"role": "assistant", "content": [{"type": "text", "text": talk.answer}]}],
    }


def write_extras(out: Path, files: dict[str, str], name: str) -> list[str]:
    return []


def resolve_inside(root: Path, value: str, allow_outside: bool, what: str) -> str:
    """An image path of a downloaded dataset as an absolute path (a relative one from ``root``; symlinks kept),
    refused (DataError naming ``what``) when ``..``, an absolute path or a symlink leads it out of ``root`` and
    ``allow_outside`` is off (``shared.FolderGuard``, as for every toolkit reader)."""
    path = os.path.abspath(Path(root) / value)  # an absolute value stays itself
    real = None if allow_outside else FolderGuard(root).leaves(path)
    if real is not None:
        through = f" (through a symlink, to {real})" if real != path else ""
        raise DataError(
            f"{what} {path} lies outside the dataset folder {root}{through}; pass --allow-outside to "
            "read images outside it (davir's own export names absolute paths)"
        )
    return path


def _turns(row: dict, record: str) -> tuple[dict, dict]:
    """The user turn and the answer of a row: ``prompt`` + ``completion`` (what davir writes) or ``messages``; a
    leading system turn is allowed. Anything else is a DataError naming the key."""
    if "prompt" in row or "completion" in row:
        keys = ("prompt", "completion")
        turns = [turn for key in keys for turn in _list(row.get(key), record, key)]
    else:
        keys = ("messages",)
        turns = _list(row.get("messages"), record, "messages")
    key = "/".join(map(repr, keys))
    for number, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(
                f"{record}: {key} turn {number} must be a JSON object with 'role' and 'content', got "
                f"{type(turn).__name__}"
            )
    turns = turns[1:] if turns and turns[0].get("role") == "system" else turns
    roles = [turn.get("role") for turn in turns]
    if roles != ["user", "assistant"]:
        raise DataError(
            f"{record}: {key} holds the turns {roles}; davir imports one 'user' turn then one "
            "'assistant' turn (a pair and its caption)"
        )
    return turns[0], turns[1]


def _list(value, record: str, key: str) -> list:
    if not isinstance(value, list):
        raise DataError(f"{record}: {key!r} must be a list of turns, got {type(value).__name__}")
    return value


def _text(content, record: str, which: str) -> str:
    """A turn's text: a string, or the text parts of a list of typed parts (image parts carry none)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise DataError(
            f"{record}: the {which} turn's 'content' must be text or a list of parts, got {type(content).__name__}"
        )
    texts = []
    for number, part in enumerate(content):
        if not isinstance(part, dict):
            raise DataError(
                f"{record}: the {which} turn's content part {number} must be a JSON object, got {type(part).__name__}"
            )
        if part.get("type") == "text":
            if not isinstance(part.get("text"), str):
                raise DataError(
                    f"{record}: the {which} turn's content part {number}: 'text' must be a string, got "
                    f"{type(part.get('text')).__name__}"
                )
            texts.append(part["text"])
    return "".join(texts)


def _decode(row, record: str, number: int, *, split: str, base: Path, allow_outside: bool) -> Conversation:
    if not isinstance(row, dict):
        raise DataError(f"{record}: expected a JSON object, got {type(row).__name__}")
    user, assistant = _turns(row, record)
    prompt = _text(user.get("content"), record, "user")
    parts = user.get("content") if isinstance(user.get("content"), list) else []
    if sum(part.get("type") == "image" for part in parts) != 2:
        raise DataError(f"{record}: the user turn must hold two image parts (before, after)")
    images = row.get("images")
    if not isinstance(images, list) or len(images) != 2:
        count = len(images) if isinstance(images, list) else "no list"
        raise DataError(f"{record}: 'images' must list two images, before then after ({count} given)")
    paths = []
    for role, value in zip(("before", "after"), images):
        value = value.get("path") if isinstance(value, dict) else value  # datasets.Image's {"path", "bytes"}
        if not isinstance(value, str) or not value:
            raise DataError(f"{record}: 'images': the {role} image must be a path, got {value!r}")
        paths.append(resolve_inside(base, value, allow_outside, f"{record}: the {role} image"))
    return Conversation(
        str(row.get(ID_KEY) or f"{split}-{number}"),
        split,
        *paths,
        prompt.strip(),
        _text(assistant.get("content"), record, "assistant"),
    )


def read(source: Path, options=None) -> Iterator[tuple[str, Conversation | Skipped]]:
    """(record, Conversation) of every row of a TRL dataset (an export folder or one file), relative image paths
    from the file's folder. With the import's ``options``: a row that is no pair is (record, Skipped) naming the
    row and key, the others go on, and images (and split files) must stay inside the dataset folder unless
    ``options.allow_outside``. Without: the first such row is a DataError (a caller that counts no skips), and
    paths are not confined."""
    allow_outside = options is None or bool(getattr(options, "allow_outside", False))
    for split, path in split_files(Path(source), allow_outside=allow_outside):
        for number, (record, row) in enumerate(read_values(path)):
            try:
                yield record, _decode(row, record, number, split=split, base=path.parent, allow_outside=allow_outside)
            except DataError as error:
                if options is None:
                    raise
                yield record, Skipped(str(error))
