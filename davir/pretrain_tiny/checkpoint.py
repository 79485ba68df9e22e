"""The folder pretraining writes: the HF model + processor and pretrain_info.json."""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from davir.errors import DataError, check_output_dir
from davir.io import follow_umask, write_json_atomic
from davir.models.vlm.instructblip import DavirModel
from davir.runtime.signals import stop_signals_held

INFO_FILE = "pretrain_info.json"
# The final step's weights, beside the best ones: a stage still improving when it ends continues from here (--init).
LAST_FOLDER = "last"
# A key only this command's pretrain_info.json has (davir.pretrain_backbone's has "layout" instead).
INFO_MARK = "describe_prompt"


def written_here(folder: Path) -> bool:
    """Whether `folder` holds a pretrain_info.json of this command (a folder it wrote)."""
    try:
        with open(Path(folder) / INFO_FILE, encoding="utf-8") as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and INFO_MARK in info


def check_out(out: str | Path, init: str | Path | None = None) -> Path:
    """Before any work: `out` can become a folder, is not the `--init` folder being trained from (nor holds it as
    last/), and is new, empty or a folder this command wrote; nothing else in it is ever replaced."""
    out = check_output_dir(out, what="--out")
    if init is not None and os.path.realpath(init) in {os.path.realpath(out), os.path.realpath(out / LAST_FOLDER)}:
        raise DataError(
            f"--out {out} is the --init folder {init} (or holds it as {LAST_FOLDER}/), whose weights the run "
            "would replace while it trains from them; give another --out"
        )
    if init is not None and not written_here(init):  # its pretrain_info.json is read once the model is built
        raise DataError(
            f"--init {init} is not a folder python -m davir.pretrain_tiny wrote (no {INFO_FILE} of its own); "
            "give one it wrote (OUT or OUT/last), or leave --init out to start from random weights"
        )
    if out.is_dir() and any(out.iterdir()) and not written_here(out):
        raise DataError(
            f"--out {out} holds files that python -m davir.pretrain_tiny did not write (no {INFO_FILE} of its "
            "own), which the checkpoint would replace; give a new or empty folder"
        )
    return out


def save_checkpoint(model: DavirModel, out: str | Path, info: dict[str, Any]) -> None:
    """Write the HF folder (model safetensors + processor) and ``pretrain_info.json`` into ``out``: into a
    temporary folder beside it first, then moved in file by file (the info last, Ctrl-C and SIGTERM held for
    the moves), so a kill mid-save leaves the earlier checkpoint whole rather than half a model.safetensors."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".staging", dir=out.parent))
    try:
        model.core.save_pretrained(str(staging), safe_serialization=True)
        model.processor.save_pretrained(str(staging))
        write_json_atomic(staging / INFO_FILE, info)
        follow_umask(staging)  # safetensors writes 0600
        with stop_signals_held():
            for entry in sorted(staging.iterdir(), key=lambda entry: entry.name == INFO_FILE):
                _move_into(entry, out / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into(entry: Path, target: Path) -> None:
    """Rename `entry` onto `target`; a folder in the way (qformer_tokenizer/) is set aside and removed."""
    if target.is_dir() and not target.is_symlink():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        entry.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(entry, target)


def package_versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
