"""Data layer: one record type (`ChangePair`), readers of the real formats, the synthetic set."""

from davir.data.formats import FORMATS, read_dataset
from davir.data.images import load_mask, load_pair, load_rgb
from davir.data.records import CHANGE_TYPES, DISTRACTOR, ChangePair, DatasetIndex, SkippedRecord
from davir.errors import DataError

__all__ = [
    "CHANGE_TYPES",
    "DISTRACTOR",
    "FORMATS",
    "ChangePair",
    "DataError",
    "DatasetIndex",
    "SkippedRecord",
    "load_mask",
    "load_pair",
    "load_rgb",
    "read_dataset",
]
