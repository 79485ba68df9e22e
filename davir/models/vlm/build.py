"""Building and loading a DAVIR model of any family: the class its family entry names around the core the
family builds or loads."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from davir.models.families import get_family
from davir.models.vlm.base import DavirVLM
from davir.models.vlm.config import DavirModelConfig
from davir.models.vlm.one_build import MODEL_BUILD_LOCK


def build_davir_model(
    config: DavirModelConfig,
    *,
    captions_for_tokenizer: Sequence[str] | None = None,
    device: str | torch.device | None = None,
    imports: Sequence[str] = (),
) -> DavirVLM:
    """Build the DAVIR model of ``config.family`` from ``config``.

    * ``config.pretrained`` set: load that local folder of the family and its processor.
    * otherwise: the family's preset ``config.preset`` with random weights (seeded by ``config.seed``) and the
      word-level tokenizer learned from ``captions_for_tokenizer`` (the training captions; the prompt
      words are added).
    ``device``: where to build (default CPU); large presets are created directly on it. The class is the
    family's ``davir_class``: :class:`davir.models.vlm.instructblip.DavirModel` for a Q-Former family,
    :class:`davir.models.vlm.chat.ChatDavirModel` for a chat family. ``imports``: the config's user modules,
    recorded by ``save_pretrained`` so that loading the folder imports them first.
    """
    target = torch.device(device) if device is not None else torch.device("cpu")
    family = get_family(config.family)
    with MODEL_BUILD_LOCK:  # transformers' process-wide switches and the seeded global generator (one_build.py)
        core, processor = family.build_core(config, captions_for_tokenizer, target)
        model_class = davir_class(config.family)
        with torch.random.fork_rng(devices=[target] if target.type == "cuda" else []):
            torch.manual_seed(config.seed)  # LoRA's random A matrices
            model = model_class(config, core, processor)
    model.imports = tuple(imports)
    return model.to(target)


def davir_class(family_name: str) -> type[DavirVLM]:
    """The DAVIR model class around a family's core (its entry's ``davir_class``)."""
    return get_family(family_name).davir_class


def load_davir_model(directory, *, device: str | torch.device | None = None, pretrained=None) -> DavirVLM:
    """A saved DAVIR model folder of any family (``save_pretrained``), with the class its family names."""
    from davir.models.vlm.checkpoint import read_davir_config

    return davir_class(read_davir_config(directory).family).from_pretrained(
        directory, device=device, pretrained=pretrained
    )
