"""Spot-the-Diff (Jhamtani & Berg-Kirkpatrick, EMNLP'18), harsh19's raw layout.

    root/annotations/{train,val,test}.json   [{"img_id": "256", "sentences": [str, ...]}, ...]
    root/resized_images/<img_id>.png, <img_id>_2.png      before, after

Records of one img_id are merged into one pair; how empty sentences are counted and kept: docs/datasets.md,
"Spot-the-Diff".
"""

from __future__ import annotations

from pathlib import Path

from davir.data.formats._common import (
    PairMerger,
    clean_captions,
    plain_file_name,
    read_record_list,
    require_id,
    require_keys,
)
from davir.data.formats.registry import register_format
from davir.data.records import ChangePair, DatasetIndex, SkippedRecord

SPLITS = ("train", "val", "test")


@register_format("spot_the_diff", splits=SPLITS)
def read_spot_the_diff(root: Path, split: str) -> DatasetIndex:
    """One split, repeated img_ids merged, pairs in order of first appearance."""
    root = Path(root)
    path = root / "annotations" / f"{split}.json"
    records = read_record_list(path, ("img_id", "sentences"))
    images = root / "resized_images"
    merger = PairMerger(str(path))
    skipped: list[SkippedRecord] = []
    for number, entry in enumerate(records):
        record = f"record {number}"
        require_keys(entry, ("img_id", "sentences"), source=str(path), record=record)
        img_id = require_id(entry["img_id"], source=str(path), record=record, field="img_id")
        # The id becomes a file name: "../x" must not point outside the image folder.
        img_id = plain_file_name(img_id, source=str(path), record=record)
        record = f"record {number} (img_id {img_id!r})"
        captions, empty = clean_captions(entry["sentences"], source=str(path), record=record)
        skipped.extend(empty)
        merger.add(
            ChangePair(
                pair_id=img_id,
                before=images / f"{img_id}.png",
                after=images / f"{img_id}_2.png",
                captions=captions,
                split=split,
                scene_id=img_id,
                source_captions=tuple(entry["sentences"]),
            ),
            record,
        )
    return DatasetIndex("spot_the_diff", root, split, merger.pairs(), skipped)
