"""LLaMA-Factory: ShareGPT-style records in OpenAI roles with an ``images`` list and one ``<image>`` per image,
plus the ``dataset_info.json`` entry that names the file, as LLaMA-Factory's own multimodal demo
(``data/mllm_demo.json``) is declared::

    {"id": "...", "messages": [{"role": "user", "content": "<image><image>Describe the difference ..."},
                               {"role": "assistant", "content": "the red cube moved"}],
     "images": ["/abs/before.png", "/abs/after.png"]}

    dataset_info.json: {"davir_NAME_train": {"file_name": "train.jsonl", "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}

LLaMA-Factory checks that the ``<image>`` count equals the number of images (``mm_plugin._validate_input``) and
reads relative image paths from ``media_dir`` (by default the dataset folder). ``dataset_dir=DIR`` and
``dataset: davir_NAME_train`` in its YAML train on the export.
"""

from __future__ import annotations

from pathlib import Path

from davir.data.toolkits.shared import ID_KEY, Conversation, read_rows, split_files, two_images
from davir.errors import DataError
from davir.io import read_json

NAME = "llamafactory"
IMAGE_TOKEN = "<image>"
DATASET_INFO = "dataset_info.json"


def encode(talk: Conversation) -> dict:
    return {ID_KEY: talk.pair_id,
            "messages": [{"role": "user", "content": IMAGE_TOKEN * 2 + talk.prompt},
                         {"role": "assistant", "content": talk.answer}],
            "images": [talk.before, talk.after]}


def dataset_entry(file_name: str) -> dict:
    return {"file_name": file_name, "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}


def extras(out: Path, files: dict[str, str], name: str, *, overwrite: bool = False) -> dict[str, dict]:
    """dataset_info.json with one entry per split file, beside the entries of other datasets already in it; an
    entry of the same name that names something else is refused unless ``overwrite``."""
    path = out / DATASET_INFO
    info = read_json(path) if path.exists() else {}
    if not isinstance(info, dict):
        raise DataError(f"{path} is not a JSON object of datasets; write the export into another folder")
    for split, file_name in files.items():
        key, entry = f"davir_{name}_{split}", dataset_entry(file_name)
        if info.get(key, entry) != entry and not overwrite:
            raise DataError(f"{path}: entry {key!r} already names another dataset; pass --overwrite to replace it, "
                            "or choose another --name")
        info[key] = entry
    return {DATASET_INFO: info}


def _columns(entry: dict) -> tuple[str, str, dict]:
    columns, tags = entry.get("columns") or {}, entry.get("tags") or {}
    return columns.get("messages", "conversations"), columns.get("images", "images"), {
        "role": tags.get("role_tag", "from"), "content": tags.get("content_tag", "value"),
        "user": tags.get("user_tag", "human"), "assistant": tags.get("assistant_tag", "gpt")}


def files_to_read(source: Path) -> list[tuple[str, Path, dict]]:
    """(split, file, dataset_info entry) of a folder with dataset_info.json, else of train/val/test files."""
    info_path = (source if source.is_dir() else source.parent) / DATASET_INFO
    info = read_json(info_path) if info_path.is_file() else {}
    by_file = {entry.get("file_name"): entry for entry in info.values() if isinstance(entry, dict)} \
        if isinstance(info, dict) else {}
    if source.is_dir() and by_file:
        found = []
        for file_name, entry in by_file.items():
            if entry.get("formatting") != "sharegpt":
                raise DataError(f"{info_path}: {file_name}: formatting {entry.get('formatting')!r}; davir reads the "
                                "sharegpt formatting it writes")
            found.append((Path(file_name).stem, source / file_name, entry))
        return found
    return [(split, path, by_file.get(path.name, dataset_entry(path.name))) for split, path in split_files(source)]


def read(source: Path):
    """(record, Conversation) of every sample of an export folder or file."""
    for split, path, entry in files_to_read(source):
        messages_key, images_key, tags = _columns(entry)
        for number, (record, row) in enumerate(read_rows(path)):
            messages = row.get(messages_key)
            if not isinstance(messages, list) or len(messages) != 2:
                raise DataError(f"{record}: {messages_key!r} must hold a user turn and an assistant turn")
            user, assistant = messages
            if user.get(tags["role"]) != tags["user"] or assistant.get(tags["role"]) != tags["assistant"]:
                raise DataError(f"{record}: expected roles {tags['user']!r} then {tags['assistant']!r}")
            content = user.get(tags["content"])
            if not isinstance(content, str) or content.count(IMAGE_TOKEN) != 2:
                raise DataError(f"{record}: the user turn must hold two {IMAGE_TOKEN} tokens (before, after)")
            before, after = two_images(row, images_key, path.parent, record)
            answer = assistant.get(tags["content"]) or ""
            yield record, Conversation(str(row.get(ID_KEY) or f"{split}-{number}"), split, before, after,
                                       content.replace(IMAGE_TOKEN, "").strip(), answer)

