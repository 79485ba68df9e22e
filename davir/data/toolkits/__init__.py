"""Datasets for the fine-tuning toolkits, both ways: `python -m davir.data export --to llamafactory|swift|trl` and
`python -m davir.data import --from …` (docs/toolkits.md).

    export_toolkit("trl", "clevr_change", root, ["train", "val", "test"], "out/trl", prompt_for=lambda pair: "…")
    toolkit_manifest("trl", "out/trl", "folder/pairs.jsonl")    # back to a davir folder manifest

One module per toolkit (``llamafactory``, ``swift``, ``trl``): ``encode`` (a conversation → the toolkit's
record), ``read`` (an export → conversations) and ``write_extras`` (files beside the splits, e.g. LLaMA-Factory's
dataset_info.json). The prompt of each pair is the caller's (``davir.integrations.prompts.epc_prompt_for``
gives the DAVIR prompt with its EPC entity phrase): the data layer knows no model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path

from davir.data.formats import read_dataset
from davir.data.records import ChangePair
from davir.data.toolkits.shared import SPLITS, conversations, manifest_rows, write_jsonl
from davir.errors import DataError
from davir.io import write_json_atomic

TOOLKIT_MODULES = {"llamafactory": "davir.data.toolkits.llamafactory", "swift": "davir.data.toolkits.swift",
                   "trl": "davir.data.toolkits.trl"}
TOOLKITS = tuple(TOOLKIT_MODULES)


def toolkit_module(name: str):
    if name not in TOOLKIT_MODULES:
        raise DataError(f"unknown toolkit {name!r}; choose one of {', '.join(TOOLKITS)}")
    return importlib.import_module(TOOLKIT_MODULES[name])


def export_toolkit(toolkit: str, format: str, root: str | Path, splits: Sequence[str], out: str | Path, *,
                   prompt_for: Callable[[ChangePair], str], name: str | None = None) -> dict:
    """Write each split of a dataset as ``out/<split>.jsonl`` in the toolkit's format (plus its extra files);
    returns the summary (also written to ``out/davir_export.json``)."""
    module = toolkit_module(toolkit)
    out = Path(out)
    name = name or Path(root).resolve().name
    unknown = [split for split in splits if split not in SPLITS]
    if unknown:
        raise DataError(f"export writes the splits {', '.join(SPLITS)}; not {', '.join(map(repr, unknown))}")
    out.mkdir(parents=True, exist_ok=True)
    counts, files = {}, {}
    for split in dict.fromkeys(splits):
        pairs = read_dataset(format, root, split).pairs
        if not pairs:
            continue
        files[split] = f"{split}.jsonl"
        samples = write_jsonl(out / files[split], (module.encode(talk) for talk in conversations(pairs, prompt_for)))
        counts[split] = {"pairs": len(pairs), "samples": samples}
    if not files:
        raise DataError(f"{format} {', '.join(splits)} at {root} has no pairs to export")
    extras = module.write_extras(out, files, name)
    summary = {"toolkit": toolkit, "format": format, "root": str(Path(root).resolve()), "name": name,
               "files": [*files.values(), *extras], "splits": counts}
    write_json_atomic(out / "davir_export.json", summary)
    return summary


def toolkit_manifest(toolkit: str, source: str | Path, manifest: str | Path) -> Path:
    """A toolkit dataset (an export folder or one split file) as a folder-format ``pairs.jsonl`` at ``manifest``:
    one row per pair id, its captions in order, its split from the file name (train/val/test.jsonl)."""
    rows = manifest_rows(toolkit_module(toolkit).read(Path(source)))
    if not rows:
        raise DataError(f"{source}: the {toolkit} dataset holds no samples")
    manifest = Path(manifest)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(manifest, rows)
    return manifest


__all__ = ["TOOLKITS", "export_toolkit", "toolkit_manifest", "toolkit_module"]
