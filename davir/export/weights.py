"""The weights of an exported model: a DAVIR model's PEFT adapter as it was saved, or the LoRA merged into the
full weights of its family's model; a lightweight model's folder as it was saved.

What each file holds, and why a merged folder is what vLLM or SGLang serve: docs/sharing.md, "What the folder
holds".
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from peft import PeftModel
from safetensors import SafetensorError
from safetensors.torch import save_file

from davir.errors import DataError
from davir.export.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS, DAVIR_EXTRA, EXTRA_WEIGHTS
from davir.io import file_sha256, read_json, write_json_atomic
from davir.runtime.devices import check_device as runtime_check_device

BASE_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def describe_base(path: Path, name: str | None, out: Path) -> dict:
    """What an export records of its base model folder: a name, its path relative to the export `out` (no
    absolute path of this machine), model type, weight files' hashes."""
    files = sorted({*(p for p in path.glob("*.safetensors")), *(path / n for n in BASE_FILES if (path / n).is_file())})
    config = read_json(path / "config.json") if (path / "config.json").is_file() else {}
    where = os.path.relpath(path.resolve(), Path(out).resolve())
    return {
        "name": name or path.name,
        "path_at_export": where,
        "model_type": config.get("model_type"),
        "files": {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in files},
    }


def write_davir_config(model_dir: Path, out: Path, pretrained: str | None) -> dict:
    """davir_config.json of the model, `pretrained` naming the base model instead of its path here."""
    meta = read_json(model_dir / "davir_config.json")
    meta["config"]["pretrained"] = pretrained
    write_json_atomic(out / "davir_config.json", meta)
    return meta["config"]


def copy_processor(model_dir: Path, out: Path) -> None:
    """The saved processor's files (tokenizers, image processor, chat template) at the top of `out`."""
    source = model_dir / "processor"
    if not source.is_dir():
        raise DataError(f"{model_dir}: missing processor/ (tokenizers and image processor)")
    shutil.copytree(source, out, dirs_exist_ok=True)
    for path in out.rglob("tokenizer.json"):
        clear_call_settings(path)


def clear_call_settings(path: Path) -> None:
    """A fast tokenizer saves the truncation and padding of its last call (training's caption cut: 47 tokens);
    loaded elsewhere they would cut every prompt, image placeholders included. The export's are none, as
    davir's own prompts are (it cuts the prompt's text itself)."""
    saved = read_json(path)
    if isinstance(saved, dict) and (saved.get("truncation") is not None or saved.get("padding") is not None):
        saved["truncation"], saved["padding"] = None, None
        path.write_text(json.dumps(saved, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def write_adapter(model_dir: Path, out: Path, base_name: str) -> list[str]:
    """The run's PEFT adapter and extra trained weights, as saved; returns the files written."""
    adapter = model_dir / "adapter"
    if not (adapter / ADAPTER_WEIGHTS).is_file() or not (adapter / ADAPTER_CONFIG).is_file():
        raise DataError(
            f"{model_dir}: no adapter/{ADAPTER_WEIGHTS} + {ADAPTER_CONFIG} (not a LoRA model); export it with --merge"
        )
    shutil.copy2(adapter / ADAPTER_WEIGHTS, out / ADAPTER_WEIGHTS)
    adapter_config = read_json(adapter / ADAPTER_CONFIG)
    adapter_config["base_model_name_or_path"] = base_name
    (out / ADAPTER_CONFIG).write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    written = [ADAPTER_WEIGHTS, ADAPTER_CONFIG]
    if (model_dir / EXTRA_WEIGHTS).is_file():
        shutil.copy2(model_dir / EXTRA_WEIGHTS, out / EXTRA_WEIGHTS)
        written.append(EXTRA_WEIGHTS)
    return written


def merged_core(model) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """(the core with every LoRA update merged into its weights, the model's weights outside the core).

    Merges in place: `model` is not usable afterwards."""
    inside = {id(parameter) for parameter in model.core.parameters()}
    outside = {
        name: parameter.detach().contiguous().cpu().clone()
        for name, parameter in model.named_parameters()
        if id(parameter) not in inside and "lora_" not in name
    }
    wrapped = model.wrapped()
    core = wrapped.merge_and_unload(progressbar=False, safe_merge=True) if isinstance(wrapped, PeftModel) else wrapped
    leftover = [name for name, _ in core.named_parameters() if "lora_" in name]
    if leftover:
        raise RuntimeError(f"LoRA weights left after merging: {leftover[:3]}")
    return core, outside


def check_device(device: str) -> torch.device:
    """The torch device `--device` names, checked before any work (davir.runtime.devices)."""
    return runtime_check_device(device, who="davir-export merges")


def safetensors_os_error(error: SafetensorError, path: Path) -> OSError | None:
    """The OSError inside a SafetensorError of a failed write (a full disk: `I/O error: No space left on
    device (os error 28)`), naming `path`; None when it is not an OS error."""
    found = re.search(r"\(os error (\d+)\)|Os \{ code: (\d+)", str(error))
    if found is None:
        return None
    code = int(found.group(1) or found.group(2))
    return OSError(code, os.strerror(code), str(path))


def _saving(path: Path, save) -> None:
    """Run `save` (a safetensors write to `path`); its OS errors come out as OSErrors naming `path`."""
    try:
        save()
    except SafetensorError as error:
        os_error = safetensors_os_error(error, path)
        if os_error is None:
            raise DataError(f"{path}: could not be written ({error})") from error
        raise os_error from error


def write_merged(model_dir: Path, out: Path, base: Path | None, device: str = "cpu") -> int:
    """The model's LoRA merged into the full weights of its family's model (`save_pretrained`); returns the
    picture size S×S the model takes."""
    from davir.models.vlm.build import load_davir_model
    from davir.models.vlm.chat import ChatDavirModel

    model = load_davir_model(model_dir, device=device, pretrained=base).eval()
    core, outside = merged_core(model)
    _saving(out / "model.safetensors", lambda: core.save_pretrained(str(out), safe_serialization=True))
    if outside:
        _saving(out / DAVIR_EXTRA, lambda: save_file(outside, str(out / DAVIR_EXTRA)))
    if isinstance(model, ChatDavirModel):  # a Q-Former family's processor takes any picture size
        write_image_settings(out, model)
    return int(model.image_size)


def write_image_settings(out: Path, model) -> None:
    """The image processor's settings davir captions with (one S×S picture, no tiles) in the saved
    processor_config.json, so a plain `AutoProcessor` given S×S pictures makes davir's image tokens."""
    path = out / "processor_config.json"
    if not path.is_file():
        return
    saved = read_json(path)
    settings = saved.get("image_processor") if isinstance(saved, dict) else None
    if not isinstance(settings, dict):
        return
    settings.update(model.family.image_kwargs)
    if model.config.family == "smolvlm":  # as SmolVLM's process_images calls it: the picture is one S-px tile
        settings["size"] = settings["max_image_size"] = {"longest_edge": model.image_size}
    write_json_atomic(path, saved)
