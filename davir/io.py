"""Atomic file writes and strict JSON reading, used by every job that writes or reads files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from davir.errors import DataError


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:  # a failed rename (a folder at `path`, a full disk) leaves no stray temporary
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any, *, indent: int | None = 2) -> None:
    write_text_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def append_jsonl(path: Path, row: Any) -> None:
    """Append one JSON line and flush it to disk (a log that survives a kill up to its last line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_json(path: Path) -> Any:
    """Read JSON with a clear error naming the file (missing or malformed) instead of a traceback."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"annotation file is missing: {path}")
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}: malformed JSON at line {error.lineno} column {error.colno}: {error.msg}") from error
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error})") from error


def read_jsonl(path: Path) -> list[Any]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"file is missing: {path}")
    rows = []
    with open(path, encoding="utf-8") as handle:
        number = 0
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}: malformed JSON on line {number}: {error.msg}") from error
        except UnicodeDecodeError as error:
            raise DataError(f"{path}: not UTF-8 text after line {number} ({error})") from error
    return rows
