"""`datasets.Dataset` view of reader output (paths as strings; images stay on disk).

ds = to_hf_dataset(read_dataset("ier", root, "val"))
ds.filter(lambda row: row["split"] == "val")
pairs = from_hf_dataset(ds)            # back to ChangePair records
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import datasets

from davir.data.records import ChangePair, DatasetIndex

# Explicit types so that a column that is None for every row (e.g. change_type outside CLEVR)
# stays a string column instead of failing type inference.
FEATURES = datasets.Features(
    {
        "pair_id": datasets.Value("string"),
        "before": datasets.Value("string"),
        "after": datasets.Value("string"),
        "captions": datasets.Sequence(datasets.Value("string")),
        "split": datasets.Value("string"),
        "change_type": datasets.Value("string"),
        "distractor": datasets.Value("string"),
        "gt_mask_before": datasets.Value("string"),
        "gt_mask_after": datasets.Value("string"),
        "scene_id": datasets.Value("string"),
    }
)


def _pairs(source: DatasetIndex | Iterable[ChangePair] | Iterable[DatasetIndex]) -> Iterable[ChangePair]:
    """Flatten one index, several indexes (e.g. train + val) or plain pairs."""
    if isinstance(source, DatasetIndex):
        yield from source.pairs
        return
    for item in source:
        if isinstance(item, DatasetIndex):
            yield from item.pairs
        elif isinstance(item, ChangePair):
            yield item
        else:
            raise TypeError(f"to_hf_dataset takes DatasetIndex or ChangePair items, got {type(item).__name__}")


def to_hf_dataset(index_or_pairs: DatasetIndex | Iterable[ChangePair] | Iterable[DatasetIndex]) -> datasets.Dataset:
    """One row per pair with the columns of `ChangePair.to_dict` (meta is not carried)."""
    rows = [pair.to_dict() for pair in _pairs(index_or_pairs)]
    if not rows:
        return datasets.Dataset.from_dict({name: [] for name in FEATURES}, features=FEATURES)
    return datasets.Dataset.from_list(rows, features=FEATURES)


def from_hf_dataset(dataset: datasets.Dataset) -> list[ChangePair]:
    """The inverse of `to_hf_dataset` (paths back to `Path`, captions to a tuple)."""
    optional = lambda value: None if value is None else Path(value)  # noqa: E731
    return [
        ChangePair(
            pair_id=row["pair_id"],
            before=Path(row["before"]),
            after=Path(row["after"]),
            captions=tuple(row["captions"]),
            split=row["split"],
            change_type=row["change_type"],
            distractor=optional(row["distractor"]),
            gt_mask_before=optional(row["gt_mask_before"]),
            gt_mask_after=optional(row["gt_mask_after"]),
            scene_id=row["scene_id"],
        )
        for row in dataset
    ]
