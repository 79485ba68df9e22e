"""Models: DAVIR's vision-language models (``vlm/``: InstructBLIP + LoRA + FAC + EPC, or FAC + EPC on a chat
family, one base), the model families (``families/``), presets, tokenizer, losses and ``lightweight/``.

The DAVIR names are imported lazily, so importing another ``davir.models`` submodule does not pay for
transformers and peft.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "DavirVLM": "davir.models.vlm.base",
    "DavirModel": "davir.models.vlm.instructblip",
    "DavirModelConfig": "davir.models.vlm.config",
    "DavirOutput": "davir.models.vlm.output",
    "EpcConfig": "davir.models.vlm.epc",
    "LoraSettings": "davir.models.vlm.lora",
    "build_davir_model": "davir.models.vlm.build",
    "load_davir_model": "davir.models.vlm.build",
    "ChatDavirModel": "davir.models.vlm.chat",
    "FAMILIES": "davir.models.families",
    "get_family": "davir.models.families",
    "entity_prompts": "davir.models.vlm.epc",
    "preset_registry": "davir.models.presets",
    "build_preset_config": "davir.models.presets",
    "build_word_tokenizer": "davir.models.tokenizer",
    "ClsAttentionHook": "davir.models.vlm.attention",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'davir.models' has no attribute {name!r}")
