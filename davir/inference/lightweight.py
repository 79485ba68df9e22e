"""A saved lightweight model (subtraction, SCORER, DIRL, RDD, CHEER) with what captioning needs beside its weights.

    bundle = load_lightweight("runs/scorer_demo/best", device="cpu")

The model folder is what `LightweightTask.save_pretrained` writes: lightweight_config.json,
model.safetensors (the config also in its metadata), vocab.json and, for CHEER, entity_phrases.json.
Captioning with it: `davir.inference.engines.LightweightEngine` (features from davir.inference.sources).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from davir.errors import DataError
from davir.io import read_json
from davir.models.lightweight import LightweightCaptioner, load_lightweight_model
from davir.runs.files import LIGHTWEIGHT_CONFIG, read_lightweight_info
from davir.text.vocab import Vocabulary


@dataclass
class LightweightBundle:
    """A loaded lightweight model with what captioning needs beside the weights."""

    model: LightweightCaptioner
    vocab: Vocabulary
    info: dict
    model_dir: Path
    entity_phrases: list[str] | None = None
    entity_index: dict[str, int] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return self.info["method"]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load_lightweight(model_dir: str | Path, device: str | torch.device | None = None) -> LightweightBundle:
    """Load a folder written by `LightweightTask.save_pretrained` (eval mode)."""
    model_dir = Path(model_dir)
    config_path = model_dir / LIGHTWEIGHT_CONFIG
    if not config_path.is_file():
        raise DataError(f"{model_dir} is not a saved lightweight model (no {LIGHTWEIGHT_CONFIG})")
    info = read_lightweight_info(model_dir)  # each key checked: a damaged file is named with its key
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_lightweight_model(model_dir / info.get("weights", "model.safetensors"), device=device).eval()
    vocab = Vocabulary.load(model_dir / info.get("vocabulary", "vocab.json"))
    if len(vocab) != model.config.vocab_size:
        raise DataError(
            f"{model_dir}: vocab.json has {len(vocab)} words but the model was built for {model.config.vocab_size}"
        )
    bundle = LightweightBundle(model, vocab, info, model_dir)
    if info.get("entity_phrases"):
        phrases = read_json(model_dir / info["entity_phrases"])
        if not isinstance(phrases, list) or not all(isinstance(phrase, str) for phrase in phrases):
            raise DataError(
                f"{model_dir / info['entity_phrases']}: expected a JSON list of entity phrases "
                f"(named by key 'entity_phrases' of {config_path})"
            )
        bundle.entity_phrases = list(phrases)
        bundle.entity_index = {phrase: i for i, phrase in enumerate(phrases)}
    return bundle
