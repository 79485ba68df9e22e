"""ms-swift: its standard ``messages`` format with an ``images`` list, one ``<image>`` tag per image in the user
turn (ms-swift's "Custom Dataset" documentation, multimodal example)::

    {"id": "...", "messages": [{"role": "user", "content": "<image><image>Describe the difference ..."},
                               {"role": "assistant", "content": "the red cube moved"}],
     "images": ["/abs/before.png", "/abs/after.png"]}

``swift sft --dataset DIR/train.jsonl --val_dataset DIR/val.jsonl`` reads it; its preprocessor keeps the standard
keys (``messages``, ``images``) and drops ``id``.
"""

from __future__ import annotations

from pathlib import Path

from davir.data.toolkits.shared import ID_KEY, Conversation, read_rows, split_files, two_images
from davir.errors import DataError

NAME = "swift"
IMAGE_TAG = "<image>"


def encode(talk: Conversation) -> dict:
    return {ID_KEY: talk.pair_id,
            "messages": [{"role": "user", "content": IMAGE_TAG * 2 + talk.prompt},
                         {"role": "assistant", "content": talk.answer}],
            "images": [talk.before, talk.after]}


def extras(out: Path, files: dict[str, str], name: str, *, overwrite: bool = False) -> dict[str, dict]:
    return {}


def read(source: Path):
    for split, path in split_files(source):
        for number, (record, row) in enumerate(read_rows(path)):
            messages = row.get("messages")
            if not isinstance(messages, list):
                raise DataError(f"{record}: no 'messages' list")
            turns = [m for m in messages if isinstance(m, dict) and m.get("role") != "system"]
            if [m.get("role") for m in turns] != ["user", "assistant"]:
                raise DataError(f"{record}: expected a user turn then an assistant turn")
            content = turns[0].get("content")
            if not isinstance(content, str) or content.count(IMAGE_TAG) != 2:
                raise DataError(f"{record}: the user turn must hold two {IMAGE_TAG} tags (before, after)")
            before, after = two_images(row, "images", path.parent, record)
            yield record, Conversation(str(row.get(ID_KEY) or f"{split}-{number}"), split, before, after,
                                       content.replace(IMAGE_TAG, "").strip(), turns[1].get("content") or "")
