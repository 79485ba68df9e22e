"""ms-swift: its standard ``messages`` format with an ``images`` list, one ``<image>`` tag per image in the user turn.

``swift sft --dataset DIR/train.jsonl --val_dataset DIR/val.jsonl`` reads it; its preprocessor keeps the standard
keys (``messages``, ``images``) and drops ``id``. The record: docs/toolkits.md, "ms-swift".
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from davir.data.toolkits.shared import (
    ID_KEY,
    Conversation,
    ImportOptions,
    read_samples,
    split_files,
    split_of,
    turn_text,
    two_images,
    user_and_answer,
)
from davir.errors import DataError

NAME = "swift"
IMAGE_TAG = "<image>"


def encode(talk: Conversation) -> dict:
    return {
        ID_KEY: talk.pair_id,
        "messages": [
            {"role": "user", "content": IMAGE_TAG * 2 + talk.prompt},
            {"role": "assistant", "content": talk.answer},
        ],
        "images": [talk.before, talk.after],
    }


def extras(out: Path, files: dict[str, str], name: str, *, overwrite: bool = False) -> dict[str, dict]:
    return {}


def read(source: Path, options: ImportOptions = ImportOptions()):
    """(record, Conversation or Skipped) of every row of an export folder or file; relative image paths are read
    from the file's folder."""
    for split, path in split_files(source, allow_outside=options.allow_outside):
        yield from read_samples(
            path, partial(_decode, split=split_of(split, options), base=path.parent, stem=path.stem)
        )


def _decode(row: dict, record: str, number: int, *, split: str, base: Path, stem: str) -> Conversation:
    user, assistant = user_and_answer(row.get("messages"), record, "messages")
    before, after = two_images(row, "images", base, record)
    content = turn_text(user, "content", record, "user")
    if content.count(IMAGE_TAG) != 2:
        raise DataError(f"{record}: the user turn must hold two {IMAGE_TAG} tags (before, after)")
    answer = turn_text(assistant, "content", record, "assistant")
    return Conversation(
        str(row.get(ID_KEY) or f"{stem}-{number}"), split, before, after, content.replace(IMAGE_TAG, "").strip(), answer
    )
