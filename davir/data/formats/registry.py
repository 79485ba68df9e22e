"""The registry of dataset readers: `@register_format(name, splits)` on a reader function `(root, split)`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from davir.data.records import DatasetIndex
from davir.registry import Registry

Reader = Callable[[Path, str], DatasetIndex]


@dataclass(frozen=True)
class DatasetFormat:
    """One on-disk format: its reader and the split names it accepts (canonical names first)."""

    name: str
    read: Reader
    splits: tuple[str, ...]


# name → DatasetFormat; filled by the @register_format decorators of the reader modules.
FORMATS: Registry[DatasetFormat] = Registry("dataset format")


def register_format(name: str, splits: tuple[str, ...] = ("train", "val", "test")):
    def decorator(reader: Reader) -> Reader:
        FORMATS.register(name, DatasetFormat(name, reader, tuple(splits)))
        return reader

    return decorator
