"""`python -m davir.data pairs`: any dataset split(s) as a `folder`-format manifest (pairs.csv).

    python -m davir.data pairs --format clevr_change --root data/synth --split test --num 12 --out pairs.csv
    python -m davir.data pairs --format clevr_change --root data/synth --split train --split val --split test \\
        --num 0 --copy-images --out my_pairs/pairs.csv     # a stand-alone folder with captions, splits, masks

The rows and paths written: docs/recipes.md, "Train DAVIR on your own pairs".
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from pathlib import Path

from davir.data.formats import read_dataset
from davir.data.formats.folder import manifest_of
from davir.data.records import ChangePair
from davir.errors import DataError, refuse_outputs_over_inputs
from davir.io import write_text_atomic


class _Copier:
    """Copy each source image once into `folder/<role>/`, keeping its name unless two sources clash."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.done: dict[tuple[str, Path], Path] = {}
        self.taken: set[Path] = set()

    def __call__(self, source: Path, role: str) -> Path:
        key = (role, Path(source).resolve())
        if key in self.done:
            return self.done[key]
        if not key[1].is_file():
            raise DataError(f"cannot copy a missing image: {source}")
        target = self.folder / role / Path(source).name
        number = 1
        while target in self.taken:
            target = self.folder / role / f"{Path(source).stem}_{number}{Path(source).suffix}"
            number += 1
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(key[1], target)
        self.taken.add(target)
        self.done[key] = target
        return target


def write_pairs_manifest(
    format: str, root: str, splits: list[str] | str, out: str, *, num: int, copy_images: bool = False
) -> str:
    """Write the first `num` pairs (0 = all) of each split as a pairs.csv; returns `out`."""
    splits = [splits] if isinstance(splits, str) else list(splits)
    # a cut or reordered copy of the user's list over the list itself
    refuse_outputs_over_inputs(
        {"--out": out}, {f"the manifest of --root {root}": manifest_of(root) if format == "folder" else None}
    )
    folder = Path(out).resolve().parent
    copier = _Copier(folder) if copy_images else None
    pairs: list[ChangePair] = []
    for split in splits:
        found = read_dataset(format, root, split).pairs
        pairs.extend(found[:num] if num else found)
    if not pairs:
        raise DataError(f"{format} {', '.join(splits)} at {root} has no pairs to write")
    with_captions = any(pair.captions for pair in pairs)
    with_masks = any(pair.has_gt_mask for pair in pairs)
    columns = (
        ["id", "before", "after", "split"]
        + (["caption"] if with_captions else [])
        + (["mask", "mask_before"] if with_masks else [])
    )

    def place(path: Path, role: str) -> str:
        path = copier(path, role) if copier else Path(path).resolve()
        return os.path.relpath(path, folder)

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for pair in pairs:
        row = [pair.pair_id, place(pair.before, "before"), place(pair.after, "after"), pair.split]
        masks = (
            [place(pair.gt_mask_after, "masks"), place(pair.gt_mask_before, "masks_before")]
            if with_masks and pair.has_gt_mask
            else ([""] * 2 if with_masks else [])
        )
        for caption in (pair.captions or ("",)) if with_captions else (None,):
            writer.writerow(row + ([caption] if with_captions else []) + masks)
    write_text_atomic(Path(out), buffer.getvalue())
    return out
