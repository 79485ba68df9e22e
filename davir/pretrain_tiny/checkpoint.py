"""The folder pretraining writes: the HF model + processor and pretrain_info.json."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch

from davir.io import write_json_atomic
from davir.models.vlm.instructblip import DavirModel

INFO_FILE = "pretrain_info.json"
# The final step's weights, beside the best ones: a stage still improving when it ends continues from here (--init).
LAST_FOLDER = "last"


def save_checkpoint(model: DavirModel, out: str | Path, info: dict[str, Any]) -> None:
    """Write the HF folder (model safetensors + processor) and ``pretrain_info.json`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.core.save_pretrained(str(out), safe_serialization=True)
    model.processor.save_pretrained(str(out))
    write_json_atomic(out / INFO_FILE, info)


def package_versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
