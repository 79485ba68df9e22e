"""Model families: which vision-language model DAVIR's FAC and EPC are applied to (``model.family``).

One module per family, in the shape of segment-anything's ``sam_model_registry``: the module says — and only
it says — how the model and its processor load from a local folder, which random-weight presets of the same
classes exist, how the two images enter the model, where LoRA goes and where FAC reads the attention — and
which DAVIR model wraps it (its ``davir_class``, a :class:`davir.models.vlm.base.DavirVLM`).

    family = FAMILIES["qwen2_5_vl"]      # the entry its module registered (imported on first use)

``instructblip`` (the paper's model, the default) is a Q-Former family (:class:`InstructBlipFamily`, wrapped by
:class:`davir.models.vlm.instructblip.DavirModel`); the chat models (``qwen2_5_vl``, ``llava_onevision``,
``smolvlm``) share :class:`davir.models.vlm.chat.ChatDavirModel` and differ only in their
:class:`davir.models.families.base.ChatFamily`. A family is one module that ends with
``FAMILIES.register("name", MyFamily())``: a built-in one is also named in ``lazy`` below, a user's own module is
named in a config's ``imports:`` (docs/architecture.md, "Add a model family").
"""

from __future__ import annotations

from typing import Any

from davir.registry import Registry

# name → module registering it; imported only when the family is used (each pulls its transformers classes).
# Names are read live (FAMILIES.names()), so a family a user's module registers later is valid everywhere.
FAMILIES: Registry[Any] = Registry(
    "model family",
    error=ValueError,
    lazy={
        "instructblip": "davir.models.families.instructblip",
        "qwen2_5_vl": "davir.models.families.qwen2_5_vl",
        "llava_onevision": "davir.models.families.llava_onevision",
        "smolvlm": "davir.models.families.smolvlm",
        "qwen3_vl": "davir.models.families.qwen3_vl",
        "internvl": "davir.models.families.internvl",
        "gemma3": "davir.models.families.gemma3",
    },
)
DEFAULT_FAMILY = "instructblip"


def get_family(name: str) -> Any:
    """The entry of a registered family (ValueError naming the choices for another name)."""
    return FAMILIES[FAMILIES.check(name, key="model.family")]
