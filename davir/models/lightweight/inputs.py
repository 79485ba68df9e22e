"""What a lightweight method's batches carry beside the grid features and captions: the one hook the task asks.

LightweightTask (davir.training.lightweight_task) knows the features, the captions, CLEVR-Change scenes and the
frozen text tower. A method that reads anything else (CHEER's retrieved entities and their bank, RDD's caption
segments, a user's own input) says so with its captioner's `inputs` class, a `MethodInputs` subclass in its own
module; the task never names a method:

    inputs = captioner.inputs(context)              # once per run; context: an InputContext
    settings = inputs.prepare(settings)             # per-dataset preparation (caches checked, sizes fixed)
    inputs.model_built(model)                       # after the model is built (CHEER: its entity bank)
    fields = inputs.fields(distractor_ids=…)        # dataset fields its batches need (None: plain pairs)
    model(…, **inputs.model_inputs(batch, device))  # keyword arguments of the captioner's forward / generate
    entries = inputs.save(directory)                # files written beside the model, named in lightweight_config.json

The keyword arguments reach `LightweightCaptioner.forward` (and `generate`): `entities` and `attributes` by name,
any other one through to the method's `encode`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from davir.data.records import ChangePair

Pair = Literal["semantic", "distractor", "generate"]


@dataclass
class InputContext:
    """What the task hands a method's inputs."""

    data: Any  # the run config's `data:` section (roots, caches, splits)
    train_pairs: Sequence[ChangePair]
    val_pairs: Sequence[ChangePair]
    # `python -m preprocess {cmd} --format … --root … --split {split} --out {out}`: the command that makes a cache
    command: str
    note: Callable[[str], None]  # a fact about the run that its log and the saved model state
    text_encoder: Any = None  # the frozen text tower of a TextTowerSettings method (davir.training.lightweight_task)
    # davir.preprocessing.profiles.check_cache_profiles (a layer above the models): refuses a cache of another profile
    check_profiles: Callable[..., Any] | None = None


class MethodInputs:
    """No inputs beyond the features and captions (subtraction, SCORER, DIRL): every hook does nothing."""

    def __init__(self, context: InputContext):
        self.context = context

    def prepare(self, settings):
        """The settings to build the model from, after this run's data is read (called once, before the model)."""
        return settings

    def model_built(self, model: torch.nn.Module) -> None:
        """The model is built and on its device."""

    def fields(self, *, distractor_ids: dict[str, str] | None = None) -> list:
        """Dataset fields (davir.data.dataset) the batches need; `distractor_ids` (scene_id → the distractor pair's
        id) for CLEVR-Change scene batches, whose distractor pair needs its own."""
        return []

    def model_inputs(self, batch: dict[str, Any], device: torch.device, *, pair: Pair = "semantic") -> dict[str, Any]:
        """Keyword arguments of the captioner for a batch: of its pairs ("semantic"), of its scenes' distractor
        pairs ("distractor"), or for generation ("generate")."""
        return {}

    def save(self, directory: Path) -> dict[str, Any]:
        """Write what the saved model needs beside its weights; the entries lightweight_config.json names them by."""
        return {}
