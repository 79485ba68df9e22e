"""Model families: which vision-language model DAVIR's FAC and EPC are applied to (``model.family``).

One module per family, in the shape of segment-anything's ``sam_model_registry``: the module says — and only
it says — how the model and its processor load from a local folder, which random-weight presets of the same
classes exist, how the two images enter the model, where LoRA goes and where FAC reads the attention.

    family = get_family("qwen2_5_vl")     # the module's FAMILY object

``instructblip`` (the paper's model, the default) is :class:`davir.models.davir.DavirModel`; the chat models
(``qwen2_5_vl``, ``llava_onevision``, ``smolvlm``) share :class:`davir.models.chat_model.ChatDavirModel` and
differ only in their :class:`davir.models.families.base.ChatFamily`. To add a family, copy
``davir/models/families/qwen2_5_vl.py`` and add its name here (docs/architecture.md, "Add a model family").
"""

from __future__ import annotations

import importlib
from typing import Any

# name → module holding its FAMILY; imported only when the family is used (each pulls its transformers classes)
FAMILY_MODULES: dict[str, str] = {
    "instructblip": "davir.models.families.instructblip",
    "qwen2_5_vl": "davir.models.families.qwen2_5_vl",
    "llava_onevision": "davir.models.families.llava_onevision",
    "smolvlm": "davir.models.families.smolvlm",
    "gemma3": "davir.models.families.gemma3",
}
FAMILY_NAMES = tuple(FAMILY_MODULES)
DEFAULT_FAMILY = "instructblip"


def check_family_name(name: str, *, key: str = "model.family") -> str:
    if name not in FAMILY_MODULES:
        raise ValueError(f"{key}={name!r} is not a model family; choose one of {list(FAMILY_NAMES)}")
    return name


def get_family(name: str) -> Any:
    """The ``FAMILY`` object of a registered family (ValueError naming the choices for another name)."""
    check_family_name(name)
    return importlib.import_module(FAMILY_MODULES[name]).FAMILY
