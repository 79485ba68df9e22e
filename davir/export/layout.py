"""What an exported model folder holds, and its marker file `davir_export.json`, read with its keys checked.

The files of an adapter, a merged and a lightweight export: docs/sharing.md, "What the folder holds".
`davir.runs.paths.RunPaths` reads such a folder as a run whose recorded paths are its own files, and
`davir.inference.engines.DavirEngine` loads a DAVIR export with `davir.export.loading`.
"""

from __future__ import annotations

from pathlib import Path

from davir.errors import DataError
from davir.io import read_json

EXPORT_FILE = "davir_export.json"
FORMAT = "davir-export"
FORMAT_VERSION = 1
CARD_FILE = "README.md"
RUN_CONFIG = "config.yaml"
MASKS_DIR = "preprocessing/masks"
ENTITIES_DIR = "preprocessing/entities"
METRICS_DIR = "eval"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
EXTRA_WEIGHTS = "trainable_extra.safetensors"  # LoRA mode: trained parts that are not LoRA (DavirModel names)
DAVIR_EXTRA = "davir_extra.safetensors"  # merged: DavirModel weights outside the core (segment embeddings)
HF_WEIGHTS = "model.safetensors"

WEIGHT_KINDS = ("adapter", "merged", "lightweight")
BASE_FLAG = "--base-model PATH (base_model= in Python)"


def is_export(folder: str | Path) -> bool:
    return (Path(folder) / EXPORT_FILE).is_file()


def read_export_info(folder: str | Path) -> dict:
    """davir_export.json of an exported folder, its keys checked (a DataError naming the file and the key)."""
    path = Path(folder) / EXPORT_FILE
    info = read_json(path)
    if not isinstance(info, dict):
        raise DataError(f"{path}: expected an object of keys, got {type(info).__name__}")
    if info.get("format") != FORMAT:
        raise DataError(f"{path}: key 'format' is {info.get('format')!r}, not {FORMAT!r}")
    if info.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{path}: key 'format_version' is {info.get('format_version')!r}; this version reads {FORMAT_VERSION}"
        )
    if info.get("weights") not in WEIGHT_KINDS:
        raise DataError(f"{path}: key 'weights' is {info.get('weights')!r}, not one of {list(WEIGHT_KINDS)}")
    base = info.get("base_model")
    if base is not None and not (isinstance(base, dict) and isinstance(base.get("name"), str)):
        raise DataError(f"{path}: key 'base_model' must be an object with a 'name', got {base!r}")
    if info["weights"] == "adapter" and base is None:
        raise DataError(f"{path}: an adapter export needs key 'base_model'")
    return info
