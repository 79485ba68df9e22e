"""Load a DAVIR model from an exported folder (`davir-export`): the adapter over its base model, or the merged
full weights. `DavirEngine.load` calls this for a folder holding davir_export.json.

    model = load_exported_model("exports/demo", device="cpu", base_model="assets/tiny_instructblip")

Where an adapter's base is found: docs/sharing.md, "Captioning with the exported folder".
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from davir.errors import DataError
from davir.export.layout import ADAPTER_WEIGHTS, BASE_FLAG, DAVIR_EXTRA, EXTRA_WEIGHTS, read_export_info
from davir.models.vlm.checkpoint import load_adapter_weights, load_extra_weights, trained_outside_lora
from davir.models.vlm.one_build import MODEL_BUILD_LOCK


def base_model_folder(folder: Path, info: dict, base_model: str | Path | None) -> Path:
    """The base model folder an adapter export runs on: `base_model`, else the one it was exported from."""
    base = info["base_model"]
    if base_model is not None:
        path = Path(base_model).expanduser()
        if not path.is_dir():
            raise DataError(
                f"--base-model {base_model}: no such folder (the {base['name']} model folder this "
                f"adapter was trained on)"
            )
        check_base(path, base)
        return path.resolve()
    recorded = base.get("path_at_export")  # relative to the export folder (absolute in earlier exports)
    if recorded and (folder / recorded).is_dir():
        return (folder / recorded).resolve()
    where = f" (it was at {recorded}, seen from the export folder, when exported)" if recorded else ""
    raise DataError(
        f"{folder} is a LoRA adapter over the base model {base['name']!r}{where}, which is not found: "
        f"pass {BASE_FLAG}, a local folder of that model; or export the run with --merge for a folder "
        "that needs no base"
    )


def check_base(path: Path, base: dict) -> None:
    """The given base is of the recorded model type; differing weight files are noted (other dtype, or another
    model: the adapter's shapes are checked when loading)."""
    from davir.io import read_json

    config = path / "config.json"
    if base.get("model_type") and config.is_file():
        found = read_json(config).get("model_type")
        if found != base["model_type"]:
            raise DataError(
                f"--base-model {path} holds a {found!r} model; this adapter was trained on "
                f"{base['name']!r}, a {base['model_type']!r} model"
            )
    sizes = {name: entry.get("size") for name, entry in (base.get("files") or {}).items()}
    differing = [
        name for name, size in sizes.items() if not (path / name).is_file() or (path / name).stat().st_size != size
    ]
    if differing:
        print(
            f"note: --base-model {path}: {differing[:3]} differ from the files of {base['name']!r} the adapter was "
            "exported with (sizes in davir_export.json); captions may differ",
            file=sys.stderr,
        )


def load_exported_model(
    folder: str | Path, *, device: str | torch.device | None = None, base_model: str | Path | None = None
):
    """The DavirModel/ChatDavirModel of an exported folder on `device` (eval mode)."""
    from davir.models.families import get_family
    from davir.models.vlm.build import davir_class
    from davir.models.vlm.checkpoint import _load_weights, read_davir_config

    folder = Path(folder)
    info = read_export_info(folder)
    if info["weights"] == "lightweight":
        raise DataError(f"{folder} holds a lightweight model: load it with davir.inference.load_lightweight")
    config = read_davir_config(folder)
    family = get_family(config.family)
    target = torch.device(device) if device is not None else torch.device("cpu")
    if target.type == "cpu":
        target = torch.device("cpu")
    merged = info["weights"] == "merged"
    if merged:
        # The folder is the model of its family with every trained weight in place: no LoRA to add.
        config.pretrained, config.train_mode = str(folder), "full"
    else:
        config.pretrained = str(base_model_folder(folder, info, base_model))
    processor = _load_weights(folder, lambda: family.load_processor(folder), what="the tokenizers and image processor")
    with MODEL_BUILD_LOCK:  # transformers' process-wide switches and the seeded global generator (one_build.py)
        core = family.load_core(config, target)
        with torch.random.fork_rng(devices=[target] if target.type == "cuda" else []):
            torch.manual_seed(config.seed)
            model = davir_class(config.family)(config, core, processor).to(target)
    if merged:
        _load_extra(model, folder / DAVIR_EXTRA, required=_outside_core(model), target=target)
        return model.eval()
    adapter = folder / ADAPTER_WEIGHTS
    if not adapter.is_file():
        raise DataError(f"{folder}: missing {ADAPTER_WEIGHTS} (an adapter export)")
    load_adapter_weights(model, adapter, target)
    _load_extra(model, folder / EXTRA_WEIGHTS, required=trained_outside_lora(model), target=target)
    return model.eval()


def _outside_core(model) -> set[str]:
    """Names of the DavirModel's parameters that are not the core's (segment embeddings)."""
    inside = {id(parameter) for parameter in model.core.parameters()}
    return {name for name, parameter in model.named_parameters() if id(parameter) not in inside}


def _load_extra(model, path: Path, *, required: set[str], target: torch.device) -> None:
    if not path.is_file():
        if required:
            raise DataError(f"{path}: missing — the model needs {sorted(required)[:3]} from it")
        return
    load_extra_weights(model, path, required, target)
