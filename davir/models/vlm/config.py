"""The typed configuration of a DAVIR model (any family): everything needed to rebuild it, saved as JSON next to its weights."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from davir.models.families import DEFAULT_FAMILY, FAMILIES
from davir.models.losses import FacConfig
from davir.models.vlm.epc import EpcConfig
from davir.models.vlm.lora import LoraSettings

EXTRA_TRAINABLE_PARTS = ("language_projection", "query_tokens")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class DavirModelConfig:
    """Everything needed to rebuild a DavirModel (saved as JSON next to its weights).

    * ``family``: the vision-language model FAC and EPC are applied to (``davir.models.families``):
      ``instructblip`` (the paper's), ``qwen2_5_vl``, ``llava_onevision``, ``smolvlm``. A saved model records
      it; loading it as another family is an error.
    * ``preset``/``pretrained``: a random-weight architecture of the family's presets (InstructBLIP:
      ``presets.preset_registry``), or a local folder of the family (``config.json``, weights, processor
      files); never the hub.
    * ``image_size``/``patch_size``: preset input size (None: the preset's, 64/8 tiny, 224/14 vicuna7b);
      ``preset_overrides``: keyword overrides of the preset builder (e.g. ``{"vision_layers": 2}``).
    * ``train_mode``: ``lora`` (App. B: LoRA trained, everything else frozen) or ``full`` (train every
      weight, no LoRA: for the tiny preset from random weights, where LoRA on random weights learns nothing).
    * ``extra_trainable``: in LoRA mode, small parts trained in full too (``language_projection``,
      ``query_tokens``); the segment embeddings are always trained when enabled.
    * ``segment_embeddings``: learned "before"/"after" vectors added to each image's visual tokens (default
      off: the position of the two token blocks already tells them apart for the causal LLM).
    * ``dtype``: weights' dtype (``bfloat16`` for the 7B model); ``gradient_checkpointing``: on the LLM.
    * ``seed``: random initialisation of presets and LoRA (built under a forked RNG).
    """

    family: str = DEFAULT_FAMILY
    preset: str = "tiny"
    pretrained: str | None = None
    image_size: int | None = None
    patch_size: int | None = None
    preset_overrides: dict[str, Any] = field(default_factory=dict)
    train_mode: Literal["lora", "full"] = "lora"
    lora: LoraSettings = field(default_factory=LoraSettings)
    extra_trainable: tuple[str, ...] = ()
    segment_embeddings: bool = False
    fac: FacConfig = field(default_factory=FacConfig)
    epc: EpcConfig = field(default_factory=EpcConfig)
    max_prompt_tokens: int = 64
    max_caption_tokens: int = 48
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    gradient_checkpointing: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        self.extra_trainable = tuple(self.extra_trainable)
        FAMILIES.check(self.family, key="model.family")
        if self.family != DEFAULT_FAMILY:  # (the default's parts are checked below without importing it)
            self._check_family_parts()
        if self.train_mode not in ("lora", "full"):
            raise ValueError(f"train_mode={self.train_mode!r}; choose 'lora' or 'full'")
        unknown = sorted(set(self.extra_trainable) - set(EXTRA_TRAINABLE_PARTS))
        if unknown and self.family == DEFAULT_FAMILY:
            raise ValueError(f"extra_trainable {unknown} unknown; choose from {EXTRA_TRAINABLE_PARTS}")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation={self.attn_implementation!r}; choose 'sdpa' or 'eager'")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}; choose one of {sorted(DTYPES)}")
        if self.max_prompt_tokens < 1 or self.max_caption_tokens < 2:
            raise ValueError("max_prompt_tokens must be >= 1 and max_caption_tokens >= 2 (a word and the EOS)")

    def _check_family_parts(self) -> None:
        from davir.models.families import get_family

        family = get_family(self.family)
        unknown = sorted(set(self.extra_trainable) - set(family.trainable_parts))
        if unknown:
            raise ValueError(
                f"extra_trainable {unknown} unknown for model.family={self.family}; choose from "
                f"{sorted(family.trainable_parts)}"
            )
        if self.segment_embeddings and not getattr(family, "segment_embeddings", False):
            raise ValueError(
                f"segment_embeddings are InstructBLIP's; model.family={self.family} tells the two "
                "images apart by their places in the chat turn"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "DavirModelConfig") -> DavirModelConfig:
        """Strict inverse of ``to_dict`` (unknown keys and wrong types are errors naming the key)."""
        from davir.config import from_dict

        return from_dict(cls, data, where=where)
