"""LoRA as in App. B: which modules are adapted (PEFT target regexes) and with which rank — InstructBLIP's here,
a chat family's from the patterns its family module names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from peft import LoraConfig

# PEFT target regexes (module names inside InstructBlipForConditionalGeneration, transformers 5.x).
VISION_QKV_PATTERN = r"vision_model\.encoder\.layers\.\d+\.self_attn\.qkv"
QFORMER_QKV_PATTERN = r"qformer\.encoder\.layer\.\d+\.(?:attention|crossattention)\.attention\.(?:query|key|value)"
LLM_ATTENTION_PATTERN = r"language_model\.(?:model\.)?layers\.\d+\.self_attn\.(?:{targets})"
LLM_ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass
class LoraSettings:
    """LoRA as in App. B: r=4 on the ViT's fused qkv and the Q-Former's query/key/value (self- and
    cross-attention), r=8 on the LLM attention projections; alpha = ``alpha_ratio`` · r, dropout 0.05 [D].
    A rank of 0 leaves that part without LoRA (frozen)."""

    vision_rank: int = 4
    qformer_rank: int = 4
    llm_rank: int = 8
    alpha_ratio: float = 2.0
    dropout: float = 0.05
    llm_targets: tuple[str, ...] = LLM_ATTENTION_PROJECTIONS

    def __post_init__(self) -> None:
        self.llm_targets = tuple(self.llm_targets)
        if min(self.vision_rank, self.qformer_rank, self.llm_rank) < 0:
            raise ValueError("LoRA ranks must be >= 0")
        unknown = sorted(set(self.llm_targets) - set(LLM_ATTENTION_PROJECTIONS))
        if unknown:
            raise ValueError(f"lora.llm_targets {unknown} are not LLM projections {LLM_ATTENTION_PROJECTIONS}")


def make_lora_config(settings: LoraSettings) -> LoraConfig:
    """One PEFT ``LoraConfig``: a full-match regex over the three parts, per-part ranks via ``rank_pattern``."""
    parts = []
    if settings.vision_rank > 0:
        parts.append((VISION_QKV_PATTERN, settings.vision_rank))
    if settings.qformer_rank > 0:
        parts.append((QFORMER_QKV_PATTERN, settings.qformer_rank))
    if settings.llm_rank > 0 and settings.llm_targets:
        parts.append((LLM_ATTENTION_PATTERN.format(targets="|".join(settings.llm_targets)), settings.llm_rank))
    return _lora_config(parts, settings)


def _lora_config(parts: list[tuple[str, int]], settings: LoraSettings) -> LoraConfig:
    """One ``LoraConfig``: a full-match regex over the parts, per-part ranks via ``rank_pattern``."""
    if not parts:
        raise ValueError("LoRA mode with every rank 0 trains nothing; set a rank or use train_mode='full'")
    from peft import LoraConfig  # here: peft imports most of transformers (~3 s), which a config alone does not need

    default_rank = parts[-1][1]
    return LoraConfig(
        r=default_rank,
        lora_alpha=settings.alpha_ratio * default_rank,
        lora_dropout=settings.dropout,
        target_modules="|".join(f"(?:{pattern})" for pattern, _ in parts),
        rank_pattern={pattern: rank for pattern, rank in parts},
        alpha_pattern={pattern: settings.alpha_ratio * rank for pattern, rank in parts},
        bias="none",
    )


def make_family_lora_config(family, settings: LoraSettings) -> LoraConfig:
    """A chat family's ``LoraConfig``, mapped as App. B maps InstructBLIP's: ``vision_rank`` on the vision
    encoder's attention, ``qformer_rank`` on the projector between vision and language (where InstructBLIP
    has its Q-Former) [D], ``llm_rank`` on the LLM attention projections (``llm_targets``)."""
    parts = []
    if settings.vision_rank > 0:
        parts.append((family.vision_lora_pattern, settings.vision_rank))
    if settings.qformer_rank > 0 and family.projector_lora_pattern:
        parts.append((family.projector_lora_pattern, settings.qformer_rank))
    if settings.llm_rank > 0 and settings.llm_targets:
        parts.append((family.llm_lora_pattern.format(targets="|".join(settings.llm_targets)), settings.llm_rank))
    return _lora_config(parts, settings)


def merge_lora_for_inference(model) -> bool:
    """Fold the LoRA deltas into the base weights (PEFT ``merge_adapter``, W ← W + s·B·A) of a model that will only
    caption: each adapted layer then runs one matrix product instead of three (measured in bench/generate.py:
    InstructBLIP-7B at batch 64, 55 → 83 pairs/s on an H200). Returns whether anything was merged (a model without
    adapters, or already merged, is left alone). The saved files are untouched; ``unmerge_adapter`` reverts it."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    wrapped = model.wrapped()
    layers = [m for m in wrapped.modules() if isinstance(m, BaseTunerLayer)] if isinstance(wrapped, PeftModel) else []
    if not layers or all(layer.merged for layer in layers):
        return False
    wrapped.merge_adapter()
    return True
