"""TRL: a conversational vision dataset of the **prompt-completion** type — the user turn under ``prompt``, the
answer under ``completion``, typed content parts, two image parts before the prompt's text part, and the ``images``
column the parts are filled from in order (TRL's dataset formats page, "Vision datasets";
``trl.data_utils.prepare_multimodal_messages``)::

    {"id": "...", "images": ["/abs/before.png", "/abs/after.png"],
     "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                             {"type": "text", "text": "Describe the difference ..."}]}],
     "completion": [{"role": "assistant", "content": [{"type": "text", "text": "the red cube moved"}]}]}

    dataset = load_dataset("json", data_files={"train": "DIR/train.jsonl"})["train"]
    dataset = dataset.cast_column("images", Sequence(Image()))      # paths → images, decoded when read

Prompt-completion, not ``messages``: TRL's ``SFTTrainer`` then sets ``completion_only_loss`` and its vision collator
(``DataCollatorForVisionLanguageModeling._collate_prompt_completion``) puts only the completion — the caption and
the template's end of turn — in the loss, as davir's own training does; with ``messages`` every token is scored,
the image placeholders included. ``import --from trl`` reads both forms.

Image parts carry no ``text`` key; loading through ``datasets`` gives them ``"text": None`` (one Arrow schema
for all parts), which the chat templates ignore.
"""

from __future__ import annotations

from pathlib import Path

from davir.data.toolkits.shared import ID_KEY, Conversation, read_rows, split_files, two_images
from davir.errors import DataError

NAME = "trl"


def encode(talk: Conversation) -> dict:
    return {ID_KEY: talk.pair_id, "images": [talk.before, talk.after],
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                    {"type": "text", "text": talk.prompt}]}],
            "completion": [{"role": "assistant", "content": [{"type": "text", "text": talk.answer}]}]}


def write_extras(out: Path, files: dict[str, str], name: str) -> list[str]:
    return []


def _text(content, record: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DataError(f"{record}: a message's content must be text or a list of parts")
    return "".join(part.get("text") or "" for part in content if isinstance(part, dict) and part.get("type") == "text")


def _turns(row: dict, record: str) -> list:
    """The conversation of a row: ``prompt`` + ``completion`` (what davir writes) or ``messages``."""
    if "prompt" in row or "completion" in row:
        prompt, completion = row.get("prompt"), row.get("completion")
        if not isinstance(prompt, list) or not isinstance(completion, list):
            raise DataError(f"{record}: 'prompt' and 'completion' must each be a list of messages")
        return prompt + completion
    return row.get("messages")


def read(source: Path):
    for split, path in split_files(source):
        for number, (record, row) in enumerate(read_rows(path)):
            messages = _turns(row, record)
            if not isinstance(messages, list) or [m.get("role") for m in messages if isinstance(m, dict)
                                                  and m.get("role") != "system"] != ["user", "assistant"]:
                raise DataError(f"{record}: 'messages' must hold a user turn then an assistant turn")
            user, assistant = [m for m in messages if m.get("role") != "system"]
            parts = user.get("content")
            images = [p for p in parts if isinstance(p, dict) and p.get("type") == "image"] \
                if isinstance(parts, list) else []
            if len(images) != 2:
                raise DataError(f"{record}: the user turn must hold two image parts (before, after)")
            before, after = two_images(row, "images", path.parent, record)
            yield record, Conversation(str(row.get(ID_KEY) or f"{split}-{number}"), split, before, after,
                                       _text(parts, record).strip(), _text(assistant.get("content"), record))
