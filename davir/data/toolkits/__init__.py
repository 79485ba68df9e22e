"""Datasets for the fine-tuning toolkits, both ways: `python -m davir.data export --to llamafactory|swift|trl` and
`python -m davir.data import --from …` (docs/toolkits.md).

    export_toolkit("trl", "clevr_change", root, ["train", "val", "test"], "out/trl", prompt_for=lambda pair: "…")
    toolkit_manifest("trl", "out/trl", "folder/pairs.jsonl")    # back to a davir folder manifest

What a toolkit module declares: docs/toolkits.md, "Adding a toolkit".
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from davir.data.formats import read_dataset
from davir.data.records import ChangePair
from davir.data.toolkits.shared import (
    EXPORT_RECORD,
    SPLITS,
    FolderGuard,
    ImportOptions,
    Skipped,
    check_replaceable,
    conversations,
    manifest_rows,
    write_jsonl,
    write_rows,
)
from davir.errors import DataError, check_output_dir
from davir.io import atomic_path

TOOLKIT_MODULES = {
    "llamafactory": "davir.data.toolkits.llamafactory",
    "swift": "davir.data.toolkits.swift",
    "trl": "davir.data.toolkits.trl",
}
TOOLKITS = tuple(TOOLKIT_MODULES)


def toolkit_module(name: str):
    if name not in TOOLKIT_MODULES:
        raise DataError(f"unknown toolkit {name!r}; choose one of {', '.join(TOOLKITS)}")
    return importlib.import_module(TOOLKIT_MODULES[name])


def export_toolkit(
    toolkit: str,
    format: str,
    root: str | Path,
    splits: Sequence[str],
    out: str | Path,
    *,
    prompt_for: Callable[[ChangePair], str],
    name: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Write each split of a dataset as ``out/<split>.jsonl`` in the toolkit's format (plus its extra files);
    returns the summary (also written to ``out/davir_export.json``).

    Nothing in ``out`` changes until everything is checked: the splits, the extra files (LLaMA-Factory's
    dataset_info.json), that no file is replaced that an earlier export did not write or that changed since
    (``--overwrite`` replaces them), and every pair's prompt (the entity cache), met while the files are written
    as temporaries; those are renamed together at the end, so a failure leaves ``out`` as it was."""
    module = toolkit_module(toolkit)
    out = check_output_dir(Path(out), what="--out")
    name = name or Path(root).resolve().name
    unknown = [split for split in splits if split not in SPLITS]
    if unknown:
        raise DataError(f"export writes the splits {', '.join(SPLITS)}; not {', '.join(map(repr, unknown))}")
    pairs = {split: read_dataset(format, root, split).pairs for split in dict.fromkeys(splits)}
    pairs = {split: found for split, found in pairs.items() if found}
    if not pairs:
        raise DataError(f"{format} {', '.join(splits)} at {root} has no pairs to export")
    files = {split: f"{split}.jsonl" for split in pairs}
    extras = module.extras(out, files, name, overwrite=overwrite) if hasattr(module, "extras") else {}
    written = check_replaceable(out, files.values(), overwrite=overwrite)  # and davir_export.json: ours or refused
    counts, hashes = {}, {k: v for k, v in written.items() if k not in files and (out / k).is_file()}
    with contextlib.ExitStack() as stack:  # every temporary renamed only once all are whole
        for split, file_name in files.items():
            tmp = stack.enter_context(atomic_path(out / file_name))
            samples, hashes[file_name] = write_rows(
                tmp, (module.encode(talk) for talk in conversations(pairs[split], prompt_for))
            )
            counts[split] = {"pairs": len(pairs[split]), "samples": samples}
        for file_name, content in extras.items():
            write_text(stack.enter_context(atomic_path(out / file_name)), json.dumps(content, indent=2) + "\n")
        summary = {
            "toolkit": toolkit,
            "format": format,
            "root": str(Path(root).resolve()),
            "name": name,
            "files": [*files.values(), *extras],
            "splits": counts,
            "sha256": hashes,
        }
        write_text(stack.enter_context(atomic_path(out / EXPORT_RECORD)), json.dumps(summary, indent=2) + "\n")
    if not hasattr(module, "extras"):
        summary["files"] += module.write_extras(out, files, name)
    return summary


def write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def toolkit_manifest(
    toolkit: str, source: str | Path, manifest: str | Path, options: ImportOptions = ImportOptions()
) -> tuple[Path, list[str]]:
    """A toolkit dataset (an export folder or one split file) as a folder-format ``pairs.jsonl`` at ``manifest``:
    one row per pair id, its captions in order, its split from the file name (train/val/test.jsonl), else
    ``options.split`` or the dataset's declared split. Returns (manifest, skipped): every row that is no pair
    davir can import (a wrong shape, a wrong count of images or turns, an image outside the dataset folder
    without ``options.allow_outside``) is left out and named with its reason; the others are imported."""
    source = Path(source)
    module = toolkit_module(toolkit)
    takes_options = len(inspect.signature(module.read).parameters) > 1
    guard = FolderGuard(source if source.is_dir() else source.parent)
    skipped: list[str] = []

    def conversations_read():
        for record, talk in module.read(source, options) if takes_options else module.read(source):
            refused = (
                talk if isinstance(talk, Skipped) else None if options.allow_outside else guard.refuse(record, talk)
            )
            if refused is not None:
                skipped.append(refused.reason)
            elif talk.split not in SPLITS:  # a reader that took the split from a file name that is not one
                yield record, replace(talk, split=options.split or "")
            else:
                yield record, talk

    rows = manifest_rows(conversations_read())
    if not rows:
        more = f"; {len(skipped)} row(s) skipped, the first: {skipped[0]}" if skipped else ""
        raise DataError(f"{source}: the {toolkit} dataset holds no samples davir can import{more}")
    manifest = Path(manifest)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(manifest, rows)
    return manifest, skipped


__all__ = ["TOOLKITS", "ImportOptions", "export_toolkit", "toolkit_manifest", "toolkit_module"]
