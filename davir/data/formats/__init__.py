"""Readers of the real on-disk dataset formats, one module per format, behind one registry.

    index = read_dataset("spot_the_diff", root, "val")   # -> DatasetIndex of ChangePair records

Each reader takes the folder that holds the annotation files as the official repositories lay them
out, and never opens an image (images are checked lazily or by `davir.data stats`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from davir.data.records import DataError, DatasetIndex

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


def read_dataset(format: str, root: str | Path, split: str) -> DatasetIndex:
    """Read one split of a dataset in the named on-disk format."""
    if format not in FORMATS:
        raise DataError(f"unknown dataset format {format!r}; known formats: {', '.join(sorted(FORMATS))}")
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"dataset root {root} does not exist or is not a folder")
    if split not in FORMAT_SPLITS[format]:
        raise DataError(f"format {format!r} has no split {split!r}; choose from {', '.join(FORMAT_SPLITS[format])}")
    return FORMATS[format](root, split)


# Importing the modules registers the readers.
from davir.data.formats import clevr_change, clevr_dc, folder, ier, levir_cc, spot_the_diff  # noqa: E402,F401
