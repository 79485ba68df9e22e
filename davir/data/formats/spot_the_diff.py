"""Spot-the-Diff (Jhamtani & Berg-Kirkpatrick, EMNLP'18), harsh19's raw layout (docs/datasets.md, Spot-the-Diff).

    root/annotations/{train,val,test}.json   [{"img_id": "256", "sentences": [str, ...]}, ...]
    root/resized_images/<img_id>.png         before
    root/resized_images/<img_id>_2.png       after

An img_id repeats across records (one per annotator): the records are merged into one pair with the
sentences concatenated in file order, as every downstream repository does (val 1,634 records ->
1,493 pairs, train 9,524 -> 8,566, test 1,404 -> 1,270). pair_id is the img_id, no extension.

Empty sentences are a documented, counted skip (SkippedRecord): the raw files hold 6 in val and 53
in train. A pair whose every sentence is empty is kept without references (val ids 8069, 13818,
13882, 14542), so the pair count stays the official one; FINER-MLLM's "filtered" val refs drop
exactly those 4 ids (1,489). The sentences as the file has them (empty ones too) stay in
`ChangePair.source_captions`: the official test references keep them (davir.metrics.protocols).
"""

from __future__ import annotations

from pathlib import Path

from davir.data.formats.registry import register_format
from davir.data.formats._common import (
    PairMerger, clean_captions, plain_file_name, read_record_list, require_id, require_keys,
)
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
        merger.add(ChangePair(
            pair_id=img_id,
            before=images / f"{img_id}.png",
            after=images / f"{img_id}_2.png",
            captions=captions,
            split=split,
            scene_id=img_id,
            source_captions=tuple(entry["sentences"]),
        ), record)
    return DatasetIndex("spot_the_diff", root, split, merger.pairs(), skipped)
