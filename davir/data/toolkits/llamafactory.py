"""LLaMA-Factory: ShareGPT-style records in OpenAI roles with an ``images`` list and one ``<image>`` per image,
plus the ``dataset_info.json`` entry that names the file.

``dataset_dir=DIR`` and ``dataset: davir_NAME_train`` in LLaMA-Factory's YAML train on the export. The record
and the entry: docs/toolkits.md, "LLaMA-Factory".
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from davir.data.toolkits.shared import (
    ID_KEY,
    Conversation,
    FolderGuard,
    ImportOptions,
    read_samples,
    split_files,
    split_of,
    turn_text,
    two_images,
    user_and_answer,
)
from davir.errors import DataError
from davir.io import read_json

NAME = "llamafactory"
IMAGE_TOKEN = "<image>"
DATASET_INFO = "dataset_info.json"


def encode(talk: Conversation) -> dict:
    return {
        ID_KEY: talk.pair_id,
        "messages": [
            {"role": "user", "content": IMAGE_TOKEN * 2 + talk.prompt},
            {"role": "assistant", "content": talk.answer},
        ],
        "images": [talk.before, talk.after],
    }


def dataset_entry(file_name: str) -> dict:
    return {
        "file_name": file_name,
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    }


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
            raise DataError(
                f"{path}: entry {key!r} already names another dataset; pass --overwrite to replace it, "
                "or choose another --name"
            )
        info[key] = entry
    return {DATASET_INFO: info}


def _columns(entry: dict) -> tuple[str, str, dict]:
    columns, tags = entry.get("columns") or {}, entry.get("tags") or {}
    return (
        columns.get("messages", "conversations"),
        columns.get("images", "images"),
        {
            "role": tags.get("role_tag", "from"),
            "content": tags.get("content_tag", "value"),
            "user": tags.get("user_tag", "human"),
            "assistant": tags.get("assistant_tag", "gpt"),
            "system": tags.get("system_tag", "system"),
        },
    )


def _unreadable(entry) -> str | None:
    """Why davir cannot read a dataset_info.json entry, or None."""
    if not isinstance(entry, dict):
        return f"not a JSON object ({type(entry).__name__})"
    if not isinstance(entry.get("file_name"), str) or not entry["file_name"]:
        return "no local file_name (a hub or script dataset: download it and name the file)"
    if entry.get("formatting", "alpaca") != "sharegpt":  # LLaMA-Factory's default formatting is alpaca
        return f"formatting {entry.get('formatting', 'alpaca')!r}; davir reads sharegpt (multi-image conversations)"
    if not isinstance(entry.get("columns"), dict) or not entry["columns"].get("images"):
        return "no images column"
    for field in ("columns", "tags"):  # each value is a key of the rows or a role name: a hand edit may break that
        names = entry.get(field) or {}
        if not isinstance(names, dict):
            return f"{field!r} must be a JSON object, got {type(names).__name__}"
        odd = next((key for key, value in names.items() if not isinstance(value, str)), None)
        if odd is not None:
            return f"{field}.{odd} must be a name, got {names[odd]!r:.40}"
    return None


def _declared(folder: Path, info_path: Path, options: ImportOptions) -> list[tuple[str, Path, dict]]:
    """(split, file, entry) of the datasets dataset_info.json declares: those named by --dataset, or all when davir
    can read all of them (else the readable ones are listed for --dataset)."""
    info = read_json(info_path)
    if not isinstance(info, dict):
        raise DataError(f"{info_path}: expected a JSON object of datasets, got {type(info).__name__}")
    unknown = [name for name in options.datasets if name not in info]
    if unknown:
        raise DataError(
            f"{info_path}: no dataset {', '.join(map(repr, unknown))}; it lists "
            f"{', '.join(list(info)[:20])}{' …' if len(info) > 20 else ''}"
        )
    names = list(options.datasets) or list(info)
    why = {name: _unreadable(info[name]) for name in names}
    refused = {name: reason for name, reason in why.items() if reason}
    if refused and options.datasets:
        name, reason = next(iter(refused.items()))
        raise DataError(f"{info_path}: dataset {name!r}: {reason}")
    if refused:
        readable = [name for name in names if name not in refused]
        name, reason = next(iter(refused.items()))
        raise DataError(
            f"{info_path} lists {len(info)} datasets, {len(refused)} of which davir cannot read (e.g. "
            f"{name!r}: {reason}); choose with --dataset NAME: "
            + (", ".join(readable[:20]) if readable else "none is a local sharegpt file with images")
        )
    guard, found, seen = FolderGuard(folder), [], set()
    for name in names:
        entry = info[name]
        path = folder / entry["file_name"]
        if not options.allow_outside:
            guard.check_file(path, f"{info_path}: dataset {name!r}: file_name {entry['file_name']!r}")
        if os.path.realpath(path) not in seen:  # two names for one file: read it once
            seen.add(os.path.realpath(path))
            found.append((split_of(Path(entry["file_name"]).stem, options, entry.get("split")), path, entry))
    return found


def files_to_read(source: Path, options: ImportOptions = ImportOptions()) -> list[tuple[str, Path, dict]]:
    """(split, file, dataset_info entry) of a folder with dataset_info.json, else of train/val/test files, or of
    the one file given (its entry when dataset_info.json beside it names it)."""
    folder = source if source.is_dir() else source.parent
    info_path = folder / DATASET_INFO
    if source.is_dir() and info_path.is_file():
        return _declared(folder, info_path, options)
    by_file = {}
    if info_path.is_file():
        info = read_json(info_path)
        by_file = (
            {
                entry["file_name"]: entry
                for entry in info.values()
                if isinstance(entry, dict) and isinstance(entry.get("file_name"), str) and not _unreadable(entry)
            }
            if isinstance(info, dict)
            else {}
        )
    found = []
    for split, path in split_files(source, allow_outside=options.allow_outside):
        entry = by_file.get(path.name, dataset_entry(path.name))
        found.append((split_of(split, options, entry.get("split")), path, entry))
    return found


def read(source: Path, options: ImportOptions = ImportOptions()):
    """(record, Conversation or Skipped) of every sample of an export folder or file. Relative image paths are read
    from the dataset folder (LLaMA-Factory's ``media_dir`` default)."""
    folder = source if source.is_dir() else source.parent
    for split, path, entry in files_to_read(source, options):
        yield from read_samples(
            path, partial(_decode, split=split, columns=_columns(entry), base=folder, stem=path.stem)
        )


def _decode(row: dict, record: str, number: int, *, split: str, columns: tuple, base: Path, stem: str) -> Conversation:
    messages_key, images_key, tags = columns
    user, assistant = user_and_answer(
        row.get(messages_key),
        record,
        messages_key,
        role=tags["role"],
        user=tags["user"],
        assistant=tags["assistant"],
        system=tags["system"],
    )
    before, after = two_images(row, images_key, base, record)
    content = turn_text(user, tags["content"], record, "user")
    if content.count(IMAGE_TOKEN) != 2:
        raise DataError(
            f"{record}: the user turn must hold two {IMAGE_TOKEN} tokens (before, after), "
            f"found {content.count(IMAGE_TOKEN)}"
        )
    answer = turn_text(assistant, tags["content"], record, "assistant")
    return Conversation(
        str(row.get(ID_KEY) or f"{stem}-{number}"),
        split,
        before,
        after,
        content.replace(IMAGE_TOKEN, "").strip(),
        answer,
    )
