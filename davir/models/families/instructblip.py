"""The paper's model: InstructBLIP (EVA ViT + Q-Former + LLaMA/Vicuna), :class:`davir.models.davir.DavirModel`.

Both images pass the shared ViT and Q-Former; their query tokens are placed before the prompt in the LLM's
``inputs_embeds``; FAC supervises the last ViT layer's [CLS]→patch attention (Eq. 5). Presets ``tiny`` and
``vicuna7b`` (``davir.models.presets``); LoRA as App. B (``davir.models.davir_lora``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import InstructBlipConfig, InstructBlipForConditionalGeneration, InstructBlipProcessor

from davir.models import davir_core


class InstructBlipFamily:
    name = "instructblip"
    model_type = "instructblip"
    davir_class_path = "davir.models.davir:DavirModel"
    model_class = InstructBlipForConditionalGeneration
    processor_class = InstructBlipProcessor
    fac_reads = "the last ViT layer's [CLS]→patch attention (Eq. 5), 16×16 patches at 224 px"

    def load_processor(self, path: Path) -> InstructBlipProcessor:
        return InstructBlipProcessor.from_pretrained(str(path), local_files_only=True)

    def load_architecture(self, path: Path) -> InstructBlipConfig:
        return InstructBlipConfig.from_pretrained(str(path), local_files_only=True)

    def load_core(self, config, device: torch.device):
        return davir_core.load_pretrained_core(config, device)

    def random_core(self, architecture, config, device: torch.device):
        return davir_core.random_core(architecture, config, device)

    def build_core(self, config, captions_for_tokenizer, device: torch.device):
        return davir_core.build_core(config, captions_for_tokenizer, device)


FAMILY = InstructBlipFamily()
