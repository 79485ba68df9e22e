"""Readers of the real on-disk dataset formats, one module per format, behind one registry.

    index = read_dataset("spot_the_diff", root, "val")   # -> DatasetIndex of ChangePair records

Each reader takes the folder that holds the annotation files as the official repositories lay them
out, and never opens an image (images are checked lazily or by `davir.data stats`).
"""

from __future__ import annotations

from pathlib import Path

from davir.data.formats.registry import FORMATS, DatasetFormat, Reader, register_format
from davir.data.records import DatasetIndex
from davir.errors import DataError


def read_dataset(format: str, root: str | Path, split: str) -> DatasetIndex:
    """Read one split of a dataset in the named on-disk format."""
    reader = FORMATS[format]
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"dataset root {root} does not exist or is not a folder")
    if split not in reader.splits:
        raise DataError(f"format {format!r} has no split {split!r}; choose from {', '.join(reader.splits)}")
    index = reader.read(root, split)
    # A user's own list may name images anywhere; a downloaded benchmark's images stay in its folders.
    return index if format == "folder" else refuse_links_leaving(index)


# Importing the modules registers the readers.
from davir.data.formats import clevr_change, clevr_dc, folder, ier, levir_cc, spot_the_diff  # noqa: E402,F401
from davir.data.formats._common import refuse_links_leaving  # noqa: E402

__all__ = ["FORMATS", "DatasetFormat", "Reader", "read_dataset", "register_format"]
