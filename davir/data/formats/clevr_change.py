"""CLEVR-Change (Park et al., ICCV'19) in the layout of `clevr_change.tar.gz`.

    index = read_clevr_change(Path("data/clevr_change"), "test")   # "%06d.png" semantic, "%06d.png_n" distractor

Every scene gives two pairs, as every CLEVR-Change evaluation counts them. The layout: docs/datasets.md,
"CLEVR-Change".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from davir.data.formats._common import clean_captions
from davir.data.formats.registry import register_format
from davir.data.records import DISTRACTOR, ChangePair, DatasetIndex, SkippedRecord
from davir.errors import DataError
from davir.io import read_json

SPLITS = ("train", "val", "test")
DISTRACTOR_SUFFIX = "_n"
ABSENT_CAPTIONS = "caption file absent; pairs kept without references"


def read_split_ids(path: Path, split: str) -> list[int]:
    """The integer scene ids of one split from a `{"train": [ints], ...}` file."""
    splits = read_json(path)
    if not isinstance(splits, dict):
        raise DataError(f"{path}: expected an object mapping split names to id lists, got {type(splits).__name__}")
    if split not in splits:
        raise DataError(f"{path}: has no split {split!r} (it has {', '.join(map(repr, splits))})")
    ids = splits[split]
    if not isinstance(ids, list):
        raise DataError(f"{path}: split {split!r} must be a list of integers, got {type(ids).__name__}")
    for position, value in enumerate(ids):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DataError(f"{path}: split {split!r} entry {position} must be a non-negative integer, got {value!r}")
    return ids


def read_type_mapping(path: Path) -> dict[str, str]:
    """`type_mapping.json` inverted: "%06d.png" -> change type."""
    mapping = read_json(path)
    if not isinstance(mapping, dict):
        raise DataError(f"{path}: expected an object mapping change types to id lists")
    by_id: dict[str, str] = {}
    for change_type, ids in mapping.items():
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise DataError(f'{path}: change type {change_type!r} must map to a list of "%06d.png" strings')
        for image_id in ids:
            if image_id in by_id and by_id[image_id] != change_type:
                raise DataError(f"{path}: id {image_id!r} is listed under both {by_id[image_id]!r} and {change_type!r}")
            by_id[image_id] = change_type
    return by_id


def read_caption_file(path: Path) -> dict[str, Any] | None:
    """An optional `{"CLEVR_default_000000.png": [captions]}` file; None when absent."""
    if not path.is_file():
        return None
    captions = read_json(path)
    if not isinstance(captions, dict):
        raise DataError(
            f"{path}: expected an object mapping image names to caption lists, got {type(captions).__name__}"
        )
    return captions


def scene_captions(
    captions: dict[str, Any] | None, path: Path, key: str, skipped: list[SkippedRecord]
) -> tuple[str, ...]:
    """Captions of one scene; a scene missing from a present caption file keeps its pair, counted as a skip."""
    if captions is None:
        return ()
    if key not in captions:
        skipped.append(SkippedRecord(str(path), key, "no captions for this scene; pair kept without references"))
        return ()
    kept, empty = clean_captions(captions[key], source=str(path), record=f"key {key!r}", field="captions")
    skipped.extend(empty)
    return kept


@register_format("clevr_change", splits=SPLITS)
def read_clevr_change(root: Path, split: str) -> DatasetIndex:
    """Both pairs (semantic, distractor) of every scene in `split`, in splits.json order."""
    root = Path(root)
    ids = read_split_ids(root / "splits.json", split)
    type_path = root / "type_mapping.json"
    types = read_type_mapping(type_path) if type_path.is_file() else {}
    change_path, no_change_path = root / "change_captions.json", root / "no_change_captions.json"
    change_captions = read_caption_file(change_path)
    no_change_captions = read_caption_file(no_change_path)
    # Folders joined once: path joins dominate the cost of 67,660 train pairs.
    before_dir, semantic_dir, nonsemantic_dir = root / "images", root / "sc_images", root / "nsc_images"
    masks = root / "gt_masks"
    has_masks = masks.is_dir()
    mask_dirs = {name: masks / name for name in ("before", "after", "before_n", "after_n")}

    pairs: list[ChangePair] = []
    skipped: list[SkippedRecord] = [
        SkippedRecord(str(path), "(every scene)", ABSENT_CAPTIONS)
        for path, captions in ((change_path, change_captions), (no_change_path, no_change_captions))
        if captions is None
    ]
    seen: set[int] = set()
    for index in ids:
        if index in seen:
            raise DataError(f"{root / 'splits.json'}: split {split!r} lists scene {index} twice")
        seen.add(index)
        name = f"{index:06d}.png"
        caption_key = f"CLEVR_default_{index:06d}.png"
        before = before_dir / caption_key
        semantic = semantic_dir / f"CLEVR_semantic_{index:06d}.png"
        nonsemantic = nonsemantic_dir / f"CLEVR_nonsemantic_{index:06d}.png"
        pairs.append(
            ChangePair(
                pair_id=name,
                before=before,
                after=semantic,
                captions=scene_captions(change_captions, change_path, caption_key, skipped),
                split=split,
                change_type=types.get(name),
                distractor=nonsemantic,
                gt_mask_before=mask_dirs["before"] / name if has_masks else None,
                gt_mask_after=mask_dirs["after"] / name if has_masks else None,
                scene_id=f"{index:06d}",
            )
        )
        pairs.append(
            ChangePair(
                pair_id=name + DISTRACTOR_SUFFIX,
                before=before,
                after=nonsemantic,
                captions=scene_captions(no_change_captions, no_change_path, caption_key, skipped),
                split=split,
                change_type=DISTRACTOR,
                distractor=nonsemantic,
                gt_mask_before=mask_dirs["before_n"] / name if has_masks else None,
                gt_mask_after=mask_dirs["after_n"] / name if has_masks else None,
                scene_id=f"{index:06d}",
            )
        )
    return DatasetIndex("clevr_change", root, split, pairs, skipped)
