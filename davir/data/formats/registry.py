"""The registry of dataset readers: `@register_format(name, splits)` on a reader function `(root, split)`."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from davir.data.records import DatasetIndex

Reader = Callable[[Path, str], DatasetIndex]

# name -> reader(root, split); filled by the @register_format decorators of the modules below.
FORMATS: dict[str, Reader] = {}
# name -> the split names the reader accepts (canonical names first).
FORMAT_SPLITS: dict[str, tuple[str, ...]] = {}


def register_format(name: str, splits: tuple[str, ...] = ("train", "val", "test")):
    def decorator(reader: Reader) -> Reader:
        FORMATS[name] = reader
        FORMAT_SPLITS[name] = splits
        return reader

    return decorator
