"""The one shape of DAVIR's vision-language models: :class:`DavirVLM`, the base of InstructBLIP's
:class:`davir.models.vlm.instructblip.DavirModel` and the chat families' :class:`davir.models.vlm.chat.ChatDavirModel`.

Training, validation, evaluation, captioning, export and the TRL trainer use only what this base declares; a
model family says which subclass wraps its core (``davir_class`` of its entry in ``davir.models.families``).
"""

from __future__ import annotations

import contextlib
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

import torch
from peft import PeftModel, get_peft_model
from PIL import Image
from torch import nn

from davir.models.losses import FacConfig
from davir.models.vlm.checkpoint import DavirCheckpointMixin
from davir.models.vlm.config import DavirModelConfig
from davir.models.vlm.epc import entity_prompts
from davir.models.vlm.output import DavirOutput


class DavirVLM(DavirCheckpointMixin, nn.Module, ABC):
    """A vision-language model with two images, an entity prompt (EPC) and attention control (FAC).

    A subclass is built as ``cls(config, core, processor)`` (``core``: the family's transformers model,
    ``processor``: its processor) and keeps the model the optimizer sees under ``wrapped_attribute`` (the
    saved weights' names start with it)."""

    wrapped_attribute: ClassVar[str]
    config: DavirModelConfig
    image_size: int
    patch_grid: tuple[int, int]

    # ----------------------------------------------------------------------------------------------- properties
    def wrapped(self) -> nn.Module:
        """The model the optimizer sees: PEFT's wrapper in LoRA mode, else the core itself."""
        return getattr(self, self.wrapped_attribute)

    @property
    def core(self) -> nn.Module:
        """The bare transformers model inside :meth:`wrapped`."""
        wrapped = self.wrapped()
        return wrapped.get_base_model() if isinstance(wrapped, PeftModel) else wrapped

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where the model's weights are (inputs are moved there)."""

    @property
    def fac_config(self) -> FacConfig:
        return self.config.fac

    @property
    @abstractmethod
    def end_token_id(self) -> int:
        """The token that ends a caption (labelled after it in training, stops generation)."""

    # ------------------------------------------------------------------------------------------- preprocessing
    @abstractmethod
    def image_processor(self, images: Image.Image | Sequence[Image.Image]) -> torch.Tensor:
        """PIL images → (N, …) pixel tensors the model takes, one per picture."""

    def build_prompts(self, entities: Sequence[Sequence[str]] | None, *, batch_size: int | None = None) -> list[str]:
        """Eq. 10 prompts for a batch (see :func:`davir.models.vlm.epc.entity_prompts`), with ``config.epc``."""
        return entity_prompts(self.config.epc, entities, batch_size=batch_size)

    def caption_lengths(self, captions: Sequence[str]) -> list[int]:
        """Tokens of each caption before `_caption_ids` cuts it to max_caption_tokens - 1 (+ the end token)."""
        encoded = self.tokenizer([c.strip() for c in captions], add_special_tokens=False, verbose=False)
        return [len(ids) for ids in encoded["input_ids"]]

    def _caption_ids(self, captions: Sequence[str]) -> list[list[int]]:
        encoded = self.tokenizer(
            [c.strip() for c in captions],
            add_special_tokens=False,
            truncation=True,
            max_length=self.config.max_caption_tokens - 1,
        )
        return [list(ids) + [self.end_token_id] for ids in encoded["input_ids"]]

    # ------------------------------------------------------------------------------------------ forward, generate
    @abstractmethod
    def forward(
        self,
        pixel_before: torch.Tensor,
        pixel_after: torch.Tensor,
        prompts: Sequence[str],
        captions: Sequence[str] | None = None,
        masks_before: torch.Tensor | None = None,
        masks_after: torch.Tensor | None = None,
        mask_valid: torch.Tensor | None = None,
    ) -> DavirOutput:
        """Teacher-forced pass: ``DavirOutput`` with the caption loss, FAC's loss (Eq. 7) and their sum (Eq. 12)."""

    @abstractmethod
    def generate(
        self,
        pixel_before: torch.Tensor,
        pixel_after: torch.Tensor,
        prompts: Sequence[str],
        *,
        max_new_tokens: int = 30,
        num_beams: int = 1,
        return_attention: bool = False,
        pad_length_to: int = 1,
        **generate_kwargs: Any,
    ) -> list[str] | tuple[list[str], torch.Tensor, torch.Tensor]:
        """Captions of a batch (deterministic), with the attention maps of both images on request."""

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        """Eval mode for the block, the previous mode restored after it (``Module.train()`` walks every
        submodule: ~40 ms a call on the 7B tree, so only when it changes something)."""
        was_training = self.training
        if was_training:
            self.eval()
        try:
            yield
        finally:
            if was_training:
                self.train()

    # ----------------------------------------------------------------------------------------- trainable parts
    def _wrap_core(self, core: nn.Module, lora_config: Any, full_parts: Iterable[str]) -> nn.Module:
        """``core`` as the optimizer sees it: all of it trained (``train_mode: full``), or frozen under PEFT's
        LoRA (``lora_config``) with the modules at ``full_parts`` (``extra_trainable``: attribute paths inside
        the core, found after PEFT wrapped its layers) trained in full."""
        if self.config.train_mode == "full":
            core.requires_grad_(True)
            return core
        core.requires_grad_(False)
        with warnings.catch_warnings():  # peft 0.21 calls a transformers 5 method deprecated in favour of another
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            wrapped = get_peft_model(core, lora_config)
        for path in full_parts:
            module = core
            for name in path.split("."):
                module = getattr(module, name)
            module.requires_grad_(True)
        return wrapped

    @abstractmethod
    def part_of(self, name: str) -> str:
        """The part (vision, language_model, …) a parameter of the core belongs to (its name inside the core)."""

    def trainable_parameter_summary(self) -> dict[str, tuple[int, int]]:
        """Per part (:meth:`part_of`, and ``all``): (number of trainable parameters, number of parameters)."""
        summary: dict[str, list[int]] = {}
        prefixes = (f"{self.wrapped_attribute}.base_model.model.", f"{self.wrapped_attribute}.")
        for name, parameter in self.named_parameters():
            for prefix in prefixes:
                if name.startswith(prefix):
                    name = name[len(prefix) :]
                    break
            counts = summary.setdefault(self.part_of(name), [0, 0])
            counts[1] += parameter.numel()
            if parameter.requires_grad:
                counts[0] += parameter.numel()
        result = {part: (c[0], c[1]) for part, c in summary.items()}
        result["all"] = (sum(c[0] for c in summary.values()), sum(c[1] for c in summary.values()))
        return result
