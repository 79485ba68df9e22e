"""CLEVR-DC (Kim et al., ICCV'21) in either of its two on-disk layouts, raw or renamed.

    index = read_clevr_dc(Path("data/clevr_dc"), "test")    # pair ids "%06d.png"; change_type left None

The layouts, and why the change type is not guessed: docs/datasets.md, "CLEVR-DC".
"""

from __future__ import annotations

from pathlib import Path

from davir.data.formats._common import clean_captions
from davir.data.formats.clevr_change import ABSENT_CAPTIONS, read_caption_file, read_split_ids
from davir.data.formats.registry import register_format
from davir.data.records import ChangePair, DatasetIndex, SkippedRecord
from davir.errors import DataError

SPLITS = ("train", "val", "test")


def detect_layout(root: Path) -> str:
    """ "dirl" (renamed, zero-padded) or "raw" (hsgkim split.json + bef/aft)."""
    if (root / "splits.json").is_file() or (root / "change_captions.json").is_file() or (root / "sc_images").is_dir():
        return "dirl"
    if (root / "split.json").is_file() or (root / "bef").is_dir():
        return "raw"
    raise DataError(
        f"{root}: not a CLEVR-DC folder: expected split.json (+ captions.json, bef/, aft/) "
        "or splits.json (+ change_captions.json, images/, sc_images/)"
    )


@register_format("clevr_dc", splits=SPLITS)
def read_clevr_dc(root: Path, split: str) -> DatasetIndex:
    """The pairs of one CLEVR-DC split in split-file order."""
    root = Path(root)
    layout = detect_layout(root)
    if layout == "raw":
        split_path, caption_path = root / "split.json", root / "captions.json"
    else:
        split_path, caption_path = root / "splits.json", root / "change_captions.json"
    ids = read_split_ids(split_path, split)
    captions = read_caption_file(caption_path)

    pairs: list[ChangePair] = []
    skipped: list[SkippedRecord] = (
        [] if captions is not None else [SkippedRecord(str(caption_path), "(every pair)", ABSENT_CAPTIONS)]
    )
    seen: set[int] = set()
    for index in ids:
        if index in seen:
            raise DataError(f"{split_path}: split {split!r} lists pair {index} twice")
        seen.add(index)
        name = f"{index:06d}.png"
        if layout == "raw":
            key, before, after = str(index), root / "bef" / f"{index}.png", root / "aft" / f"{index}.png"
        else:
            key, before, after = name, root / "images" / name, root / "sc_images" / name
        kept: tuple[str, ...] = ()
        if captions is not None:
            if key in captions:
                kept, empty = clean_captions(
                    captions[key], source=str(caption_path), record=f"key {key!r}", field="captions"
                )
                skipped.extend(empty)
            else:
                skipped.append(
                    SkippedRecord(str(caption_path), key, "no captions for this pair; pair kept without references")
                )
        pairs.append(
            ChangePair(
                pair_id=name,
                before=before,
                after=after,
                captions=kept,
                split=split,
                scene_id=str(index),
                meta={"layout": layout},
            )
        )
    return DatasetIndex("clevr_dc", root, split, pairs, skipped)
