"""The lightweight change captioners on one ResNet-101 front-end and one decoder (docs/methods/).

    config = LightweightConfig(method="scorer", vocab_size=76, max_len=24)   # a ScorerSettings
    model = build_lightweight_model(config)
    out = model(feat_before, feat_after, captions_in, captions_target)   # {"loss", "caption_loss", "cv_loss", ...}
    ids = model.generate(feat_before, feat_after, max_len=24, beam_size=1)
    save_lightweight_model(model, "model.safetensors"); load_lightweight_model("model.safetensors")

| method        | encoder                               | decoder              | auxiliary losses (weights)           |
|---------------|---------------------------------------|----------------------|--------------------------------------|
| `subtraction` | X_aft − X_bef                         | standard             | —                                    |
| `scorer`      | cross-view reconstruction + MTM       | standard / SCORER code | λ_v L_cv + λ_r L_cbr               |
| `dirl`        | MLP + cross-correlation; F − MHCA     | standard             | λ_d L_dirl + λ_c L_ccr               |
| `rdd`         | GDE + object/action distilling + MF   | learned positions    | λ_1 L_N2O + λ_2 L_V2A                |
| `cheer`       | CRE/DRE HRD layers (+ entities)       | gated dual cross-attn| λ_v (L_C + L_D) + λ_m L_I            |

Each method is one module that owns all of itself: its settings dataclass (the common `LightweightConfig` fields +
its own), its per-dataset paper rows (`PAPER_ROWS`), the printed values of its switches (`SWITCHES`), its
captioner and, where its batches carry more than features and captions, its `inputs` class (inputs.py: CHEER's
entities, RDD's caption segments) — registered together in `METHODS` (registry.py); importing this package
registers all five.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from davir.errors import DataError
from davir.io import atomic_path
from davir.models.lightweight.base import Encoded, LightweightCaptioner, clevr_pair_loss
from davir.models.lightweight.config import LightweightConfig, TextTowerSettings, paper_settings
from davir.models.lightweight.registry import METHODS, LightweightMethod, get_method, method_names

# isort: off
# Registration order = this import order (METHODS lists the methods in it: tables, sweeps, --help)
from davir.models.lightweight.subtraction import SubtractionCaptioner, SubtractionSettings
from davir.models.lightweight.scorer import ScorerCaptioner, ScorerSettings
from davir.models.lightweight.dirl import DirlCaptioner, DirlSettings
from davir.models.lightweight.rdd import RddCaptioner, RddSettings, prompt_texts
from davir.models.lightweight.cheer import CheerCaptioner, CheerSettings
# isort: on


METHOD_NAMES = method_names()  # the registry's names, for callers of the former constant

CONFIG_METADATA_KEY = "davir.lightweight_config"


def build_lightweight_model(config: LightweightConfig, **kwargs) -> LightweightCaptioner:
    """The model of `config.method`; extra keyword arguments go to its class (RDD: `text_tower=`)."""
    method = get_method(config.method)
    if type(config) is not method.settings:
        raise TypeError(f"{config.method} is built from {method.settings.__name__}, got {type(config).__name__}")
    return method.captioner(config, **kwargs)


def save_lightweight_model(model: LightweightCaptioner, path: str | Path) -> None:
    """Write the state dict as safetensors with the config in the metadata (atomic rename)."""
    tensors = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    with atomic_path(Path(path)) as tmp:
        save_file(tensors, str(tmp), metadata={CONFIG_METADATA_KEY: json.dumps(model.config.to_dict())})


def load_lightweight_model(
    path: str | Path, *, device: str | torch.device = "cpu", drop_foreign_keys: bool = False, **kwargs
) -> LightweightCaptioner:
    """Rebuild a model saved by `save_lightweight_model` (config from the file's metadata).

    Files of earlier versions hold every method's keys and load as they are; `drop_foreign_keys` also
    accepts another config that names keys of other methods (to convert it: load, then save again).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise DataError(f"model file is missing: {path}")
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if CONFIG_METADATA_KEY not in metadata:
        raise DataError(f"{path}: no {CONFIG_METADATA_KEY!r} metadata; not a davir lightweight model file")
    try:
        values = json.loads(metadata[CONFIG_METADATA_KEY])
        if not isinstance(values, dict):
            raise ValueError(f"expected an object, got {type(values).__name__}")
        config = LightweightConfig.from_dict(values, drop_foreign_keys=drop_foreign_keys)
    except (ValueError, TypeError) as error:  # malformed JSON, an unknown key, a value of the wrong type or range
        raise DataError(
            f"{path}: metadata {CONFIG_METADATA_KEY!r} is not a lightweight model config ({error})"
        ) from None
    model = build_lightweight_model(config, **kwargs)
    try:
        model.load_state_dict(load_file(str(path), device=str(device)))
    except ValueError as error:  # a layout this version refuses, with its reason (e.g. RDD's post-LN encoder)
        raise DataError(f"{path}: {error}") from None
    return model.to(device)


__all__ = [
    "METHODS",
    "METHOD_NAMES",
    "CheerCaptioner",
    "CheerSettings",
    "DirlCaptioner",
    "DirlSettings",
    "Encoded",
    "LightweightCaptioner",
    "LightweightConfig",
    "LightweightMethod",
    "RddCaptioner",
    "RddSettings",
    "ScorerCaptioner",
    "ScorerSettings",
    "SubtractionCaptioner",
    "SubtractionSettings",
    "TextTowerSettings",
    "build_lightweight_model",
    "clevr_pair_loss",
    "get_method",
    "load_lightweight_model",
    "method_names",
    "paper_settings",
    "prompt_texts",
    "save_lightweight_model",
]
