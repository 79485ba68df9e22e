"""Image Editing Request (Tan et al., ACL'19), airsplay's `dataset/adobe` layout (docs/datasets.md, IER).

    root/{train,valid,test}.json  [{"img0": str, "img1": str, "sents": [str], "uid": str}, ...]
    root/images/<img0>, root/images/<img1>   one flat folder of JPGs (before/after sizes differ)

Split names are train / val / test; "val" reads valid.json. pair_id is the uid (the id FINER-MLLM's
evaluation references use). Image names come from the annotations, so they are joined with
`resolve_in_root`: an absolute name or one escaping images/ is a DataError.
"""

from __future__ import annotations

from pathlib import Path

from davir.data.formats._common import PairMerger, clean_captions, read_record_list, require_id, require_keys
from davir.data.formats.registry import register_format
from davir.data.images import resolve_in_root
from davir.data.records import ChangePair, DatasetIndex, SkippedRecord

SPLITS = ("train", "val", "test")
SPLIT_FILES = {"train": "train.json", "val": "valid.json", "test": "test.json"}


@register_format("ier", splits=SPLITS)
def read_ier(root: Path, split: str) -> DatasetIndex:
    """One IER split in file order; a repeated uid merges when its images agree, else DataError."""
    root = Path(root)
    path = root / SPLIT_FILES[split]
    records = read_record_list(path, ("img0", "img1", "sents", "uid"))
    images = root / "images"
    merger = PairMerger(str(path))
    skipped: list[SkippedRecord] = []
    for number, entry in enumerate(records):
        record = f"record {number}"
        require_keys(entry, ("img0", "img1", "sents", "uid"), source=str(path), record=record)
        uid = require_id(entry["uid"], source=str(path), record=record, field="uid")
        record = f"record {number} (uid {uid!r})"
        captions, empty = clean_captions(entry["sents"], source=str(path), record=record, field="sents")
        skipped.extend(empty)
        merger.add(
            ChangePair(
                pair_id=uid,
                # resolve_in_root names the record itself ("record 'uid'").
                before=resolve_in_root(images, entry["img0"], source=str(path), record=uid),
                after=resolve_in_root(images, entry["img1"], source=str(path), record=uid),
                captions=captions,
                split=split,
                source_captions=tuple(entry["sents"]),
            ),
            record,
        )
    return DatasetIndex("ier", root, split, merger.pairs(), skipped)
