"""Models: DAVIR (InstructBLIP + LoRA + FAC + EPC, or FAC + EPC on a chat family) and its presets, tokenizer and
attention hooks.

The DAVIR names are imported lazily, so importing another ``davir.models`` submodule does not pay for
transformers and peft.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "DavirModel": "davir.models.davir",
    "DavirModelConfig": "davir.models.davir_config",
    "DavirOutput": "davir.models.davir",
    "EpcConfig": "davir.models.epc",
    "LoraSettings": "davir.models.davir_lora",
    "build_davir_model": "davir.models.davir",
    "load_davir_model": "davir.models.davir",
    "ChatDavirModel": "davir.models.chat_model",
    "FAMILY_NAMES": "davir.models.families",
    "get_family": "davir.models.families",
    "entity_prompts": "davir.models.epc",
    "preset_registry": "davir.models.presets",
    "build_preset_config": "davir.models.presets",
    "build_word_tokenizer": "davir.models.tokenizer",
    "ClsAttentionHook": "davir.models.attention",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'davir.models' has no attribute {name!r}")
