"""DAVIR: InstructBLIP + LoRA + fine-grained attention control (FAC) + entity prompt (EPC).

Data flow of one batch (paper §3, Eqs. 4-12)::

    before, after (B,3,S,S) ──cat──► shared ViT (2B images) ──► shared Q-Former (+ prompt P, Eq. 10/11)
        │                                  │                         │ language_projection
        │   hook on last layer's qkv ──► [CLS]→patch attention      ▼
        │   (Eq. 5) A_bef, A_aft (B,Hp,Wp)            visual tokens: [before Q | after Q]  (B, 2Q, D)
        ▼                                                            │ (+ optional segment embeddings)
    FAC: KL(A, M^) per image (Eqs. 6-7)          inputs_embeds = [visual | prompt P | caption] ──► LLM
                                                                     │
    L_total = L_caption (token CE on the caption only) + λ L_attn  (Eq. 12)

``inputs_embeds`` is built explicitly (no image-placeholder scatter), so the same code runs on a real
``instructblip-vicuna-7b`` folder and on the random-weight presets of ``davir.models.presets``.

This module holds the model and its builder; its parts live beside it: ``davir_config`` (the typed
config), ``davir_lora`` (LoRA targets, App. B), ``epc`` (Eq. 10 prompts), ``davir_core`` (the InstructBLIP
inside, pretrained or preset) and ``davir_checkpoint`` (the saved folder).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Sequence

from typing import Any

import torch
from PIL import Image
from peft import PeftModel, get_peft_model
from torch import nn
from transformers import InstructBlipForConditionalGeneration, InstructBlipProcessor

from davir.models.losses import IGNORE_INDEX, FacConfig
from davir.models.attention import ClsAttentionHook, cls_to_patch_map, last_layer_attention_module
from davir.models.davir_checkpoint import DavirCheckpointMixin
from davir.models.davir_config import DavirModelConfig
from davir.models.davir_output import DavirOutput, davir_output
from davir.models.families import get_family
from davir.models.davir_lora import LoraSettings, make_lora_config
from davir.models.epc import EpcConfig, entity_prompts


# ---------------------------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------------------------


class DavirModel(DavirCheckpointMixin, nn.Module):
    """InstructBLIP with two images, an entity prompt and FAC. Build with :func:`build_davir_model` or
    :meth:`from_pretrained`; ``self.blip`` is the InstructBLIP (wrapped by PEFT in LoRA mode) and
    ``self.core`` the bare ``InstructBlipForConditionalGeneration`` inside it."""

    def __init__(
        self, config: DavirModelConfig, core: InstructBlipForConditionalGeneration, processor: InstructBlipProcessor
    ) -> None:
        super().__init__()
        self.config = config
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.qformer_tokenizer = processor.qformer_tokenizer
        if self.tokenizer.pad_token_id is None:  # LLaMA tokenizers may ship without one; pads are masked anyway
            self.tokenizer.pad_token = self.tokenizer.unk_token or self.tokenizer.eos_token
        self.qformer_tokenizer.padding_side = "right"
        # The HF InstructBLIP folders ship truncation_side="left": an over-long caption would lose its beginning
        # (the words that name the change) and an over-long prompt its instruction. Cut at the end, as LAVIS does.
        self.tokenizer.truncation_side = "right"
        self.qformer_tokenizer.truncation_side = "right"

        vision = core.config.vision_config
        self.patch_grid = (vision.image_size // vision.patch_size, vision.image_size // vision.patch_size)
        self.image_size = vision.image_size
        self.num_query_tokens = core.config.num_query_tokens
        text_hidden = core.config.text_config.hidden_size
        if config.segment_embeddings:
            # Zero start: the pretrained model's behaviour is unchanged until training moves them. Float32 like
            # PEFT's adapters, so the optimizer never updates a bf16 copy; cast where added.
            self.segment_embeddings = nn.Parameter(torch.zeros(2, text_hidden, dtype=torch.float32))
        else:
            self.segment_embeddings = None

        if config.train_mode == "full":
            core.requires_grad_(True)
            self.blip: nn.Module = core
        else:
            core.requires_grad_(False)
            with warnings.catch_warnings():  # peft 0.21 calls a transformers 5 method deprecated in favour of another
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                self.blip = get_peft_model(core, make_lora_config(config.lora))
            for part in config.extra_trainable:
                getattr(core, part).requires_grad_(True)
        if config.gradient_checkpointing:
            # Non-reentrant checkpointing; only the LLM, so the ViT's last layer (and the FAC hook) runs once.
            core.language_model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False}
            )
            if config.train_mode == "lora":
                core.language_model.enable_input_require_grads()
        # Attach after PEFT so the hook sits on the LoRA-wrapped qkv and sees the adapted projection.
        self.attention_hook = ClsAttentionHook(last_layer_attention_module(core.vision_model)).attach()

    # ----------------------------------------------------------------------------------------------- properties
    def wrapped(self) -> nn.Module:
        """The model the optimizer sees: PEFT's wrapper in LoRA mode, else the core itself."""
        return self.blip

    @property
    def core(self) -> InstructBlipForConditionalGeneration:
        return self.blip.get_base_model() if isinstance(self.blip, PeftModel) else self.blip

    @property
    def device(self) -> torch.device:
        return self.core.language_projection.weight.device

    @property
    def fac_config(self) -> FacConfig:
        return self.config.fac

    # ------------------------------------------------------------------------------------------- preprocessing
    def image_processor(self, images: Image.Image | Sequence[Image.Image]) -> torch.Tensor:
        """PIL images → (N, 3, S, S) float pixel values: resize to S×S (bicubic) + CLIP mean/std (the saved
        ``InstructBlipProcessor``'s image processor, i.e. the real folder's own for a pretrained model)."""
        if isinstance(images, Image.Image):
            images = [images]
        if len(images) == 0:
            raise ValueError("image_processor got no images")
        return self.processor.image_processor(list(images), return_tensors="pt")["pixel_values"]

    def build_prompts(self, entities: Sequence[Sequence[str]] | None, *, batch_size: int | None = None) -> list[str]:
        """Eq. 10 prompts for a batch (see :func:`entity_prompts`), with this model's ``config.epc``."""
        return entity_prompts(self.config.epc, entities, batch_size=batch_size)

    def _prompt_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        # With special tokens: LLaMA (and the word-level tokenizer) put a BOS in front, as InstructBLIP does.
        encoded = self.tokenizer(
            list(prompts), add_special_tokens=True, truncation=True, max_length=self.config.max_prompt_tokens
        )
        return [list(ids) for ids in encoded["input_ids"]]

    def caption_lengths(self, captions: Sequence[str]) -> list[int]:
        """Tokens of each caption before `_caption_ids` cuts it to max_caption_tokens - 1 (+ EOS)."""
        encoded = self.tokenizer([c.strip() for c in captions], add_special_tokens=False, verbose=False)
        return [len(ids) for ids in encoded["input_ids"]]

    def _caption_ids(self, captions: Sequence[str]) -> list[list[int]]:
        encoded = self.tokenizer(
            [c.strip() for c in captions],
            add_special_tokens=False,
            truncation=True,
            max_length=self.config.max_caption_tokens - 1,
        )
        return [list(ids) + [self.tokenizer.eos_token_id] for ids in encoded["input_ids"]]

    # ---------------------------------------------------------------------------------------------- encoding
    def encode_images(
        self, pixel_before: torch.Tensor, pixel_after: torch.Tensor, prompts: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Eqs. 4, 5, 11: both images through the shared ViT and Q-Former (one batch of 2B), the prompt as
        Q-Former instruction. Returns visual tokens (B, 2Q, D_llm) = [before queries | after queries] and the
        [CLS]→patch attention maps (B, Hp, Wp) of each image."""
        batch = pixel_before.shape[0]
        if pixel_before.shape != pixel_after.shape or pixel_before.dim() != 4:
            raise ValueError(
                f"pixel_before {tuple(pixel_before.shape)} and pixel_after {tuple(pixel_after.shape)} "
                "must both be (B, 3, S, S)"
            )
        if tuple(pixel_before.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"images are {tuple(pixel_before.shape[-2:])}, the model takes {self.image_size}×{self.image_size}"
            )
        if len(prompts) != batch:
            raise ValueError(f"{len(prompts)} prompts for a batch of {batch} image pairs")
        device = self.device
        qformer_text = self.qformer_tokenizer(
            list(prompts), padding=True, truncation=True, max_length=self.config.max_prompt_tokens, return_tensors="pt"
        )
        qformer_ids = qformer_text["input_ids"].to(device).repeat(2, 1)
        qformer_mask = qformer_text["attention_mask"].to(device).repeat(2, 1)
        vision_dtype = self.core.vision_model.embeddings.patch_embedding.weight.dtype
        pixels = torch.cat([pixel_before, pixel_after]).to(device=device, dtype=vision_dtype)
        features = self.core.get_image_features(
            pixels, qformer_input_ids=qformer_ids, qformer_attention_mask=qformer_mask, return_dict=True
        )
        maps = cls_to_patch_map(self.attention_hook.pop(), self.patch_grid)
        tokens = features.pooler_output  # language-projected query outputs, (2B, Q, D_llm)
        before, after = tokens[:batch], tokens[batch:]
        if self.segment_embeddings is not None:
            before = before + self.segment_embeddings[0].to(before.dtype)
            after = after + self.segment_embeddings[1].to(after.dtype)
        return torch.cat([before, after], dim=1), maps[:batch], maps[batch:]

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.core.get_input_embeddings()(ids)

    # ----------------------------------------------------------------------------------------------- forward
    def language_pass(self, visual: torch.Tensor, prompts: Sequence[str], captions: Sequence[str] | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """[visual | prompt | caption + EOS] through the LLM, packed per row and padded on the right (LAVIS
        concat_text_input_output). Returns ``logits`` (B, V + L, vocab) and ``labels`` (-100 except on the
        caption + EOS tokens; all -100 without captions)."""
        batch, device = visual.shape[0], visual.device
        prompt_ids = self._prompt_ids(prompts)
        caption_ids = self._caption_ids(captions) if captions is not None else [[] for _ in range(batch)]
        length = max(len(p) + len(c) for p, c in zip(prompt_ids, caption_ids))
        input_ids = torch.full((batch, length), self.tokenizer.pad_token_id, dtype=torch.long)
        text_mask = torch.zeros((batch, length), dtype=torch.long)
        text_labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)
        for row, (p, c) in enumerate(zip(prompt_ids, caption_ids)):
            input_ids[row, : len(p) + len(c)] = torch.tensor(p + c)
            text_mask[row, : len(p) + len(c)] = 1
            if c:
                text_labels[row, len(p) : len(p) + len(c)] = torch.tensor(c)
        input_ids, text_mask, text_labels = input_ids.to(device), text_mask.to(device), text_labels.to(device)
        text_embeds = self._embed(input_ids)
        inputs_embeds = torch.cat([visual.to(text_embeds.dtype), text_embeds], dim=1)
        visual_len = visual.shape[1]
        attention_mask = torch.cat([torch.ones((batch, visual_len), dtype=torch.long, device=device), text_mask], dim=1)
        visual_labels = torch.full((batch, visual_len), IGNORE_INDEX, dtype=torch.long, device=device)
        labels = torch.cat([visual_labels, text_labels], dim=1)
        lm_out = self.core.language_model(inputs_embeds=inputs_embeds, attention_mask=attention_mask, use_cache=False)
        return lm_out.logits, labels

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
        """Teacher-forced pass.

        Args: ``pixel_before``/``pixel_after`` (B, 3, S, S) from :meth:`image_processor`; ``prompts`` B strings
        (:meth:`build_prompts`); ``captions`` B target strings or None (then only logits); ``masks_*`` (B, H, W)
        float change masks in [0, 1] at any resolution, or None; ``mask_valid`` (B,) bool, False where a pair
        has no mask (its FAC terms are skipped).

        Returns ``DavirOutput``: ``logits`` (B, 2Q + L, V) over [visual | prompt | caption] positions,
        ``caption_loss`` (token CE on the caption + EOS only), ``attn_loss`` (Eq. 7, None without masks or with
        λ = 0), ``loss`` (Eq. 12), ``attention_before``/``after`` (B, Hp, Wp) [CLS]→patch maps (differentiable).
        """
        visual, attention_before, attention_after = self.encode_images(pixel_before, pixel_after, prompts)
        if captions is not None and len(captions) != visual.shape[0]:
            raise ValueError(f"{len(captions)} captions for a batch of {visual.shape[0]} image pairs")
        logits, labels = self.language_pass(visual, prompts, captions)

        return davir_output(logits, labels if captions is not None else None, attention_before, attention_after,
                            self.config.fac, masks_before, masks_after, mask_valid)

    # ---------------------------------------------------------------------------------------------- generate
    @torch.no_grad()
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
        """Caption a batch: the LLM's ``generate`` on ``inputs_embeds`` = [left pad | visual | prompt], KV cache on.
        ``pad_length_to``: the input's length rounded up to a multiple of it (fewer shapes for a static cache).

        Deterministic (greedy, or beam search with ``num_beams`` > 1; extra ``generate_kwargs`` such as
        ``length_penalty`` or ``repetition_penalty`` pass through). Runs in eval mode and restores the
        previous mode. Returns the B captions (prompt excluded, special tokens dropped, stripped), or
        ``(captions, attention_before, attention_after)`` with ``return_attention``.
        """
        was_training = self.training
        if was_training:  # Module.train() walks every submodule: ~40 ms a call on the 7B tree (3,384 modules)
            self.eval()
        try:
            visual, attention_before, attention_after = self.encode_images(pixel_before, pixel_after, prompts)
            batch, device = visual.shape[0], visual.device
            prompt_ids = self._prompt_ids(prompts)
            visual_len = visual.shape[1]
            length = -(-(visual_len + max(len(p) for p in prompt_ids)) // pad_length_to) * pad_length_to  # round up
            # Left padding so every row's last position is its prompt's end; generate derives the position
            # ids from the attention mask, so the visual tokens start at position 0 as in training.
            input_ids = torch.full((batch, length), self.tokenizer.pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((batch, length), dtype=torch.long)
            for row, p in enumerate(prompt_ids):
                input_ids[row, length - len(p) :] = torch.tensor(p)
                attention_mask[row, length - len(p) - visual_len :] = 1
            input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
            inputs_embeds = self._embed(input_ids)
            for row, p in enumerate(prompt_ids):
                start = length - len(p) - visual_len
                inputs_embeds[row, start : start + visual_len] = visual[row].to(inputs_embeds.dtype)
            settings = dict(
                max_new_tokens=max_new_tokens,
                num_beams=num_beams,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
            )
            settings.update(generate_kwargs)
            output = self.core.language_model.generate(
                inputs_embeds=inputs_embeds, attention_mask=attention_mask, **settings
            )
            captions = [text.strip() for text in self.tokenizer.batch_decode(output, skip_special_tokens=True)]
        finally:
            if was_training:
                self.train()
        if return_attention:
            return captions, attention_before, attention_after
        return captions

    # ----------------------------------------------------------------------------------------------- summary
    def trainable_parameter_summary(self) -> dict[str, tuple[int, int]]:
        """Per part (vision, qformer, query_tokens, language_projection, language_model, segment_embeddings,
        and ``all``): (number of trainable parameters, number of parameters)."""
        summary: dict[str, list[int]] = {}
        for name, parameter in self.named_parameters():
            part = _part_of(name)
            counts = summary.setdefault(part, [0, 0])
            counts[1] += parameter.numel()
            if parameter.requires_grad:
                counts[0] += parameter.numel()
        total = [sum(c[0] for c in summary.values()), sum(c[1] for c in summary.values())]
        result = {part: (c[0], c[1]) for part, c in summary.items()}
        result["all"] = (total[0], total[1])
        return result


def _part_of(name: str) -> str:
    for prefix in ("blip.base_model.model.", "blip."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    head = name.split(".", 1)[0]
    return {"vision_model": "vision", "qformer": "qformer"}.get(head, head)


# ---------------------------------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------------------------------


def build_davir_model(
    config: DavirModelConfig,
    *,
    captions_for_tokenizer: Sequence[str] | None = None,
    device: str | torch.device | None = None,
) -> nn.Module:
    """Build the DAVIR model of ``config.family`` from ``config``.

    * ``config.pretrained`` set: load that local folder of the family and its processor.
    * otherwise: the family's preset ``config.preset`` with random weights (seeded by ``config.seed``) and the
      word-level tokenizer learned from ``captions_for_tokenizer`` (the training captions; the prompt
      words are added).
    ``device``: where to build (default CPU); large presets are created directly on it. InstructBLIP gives a
    :class:`DavirModel`, a chat family a :class:`davir.models.chat_model.ChatDavirModel`.
    """
    target = torch.device(device) if device is not None else torch.device("cpu")
    family = get_family(config.family)
    core, processor = family.build_core(config, captions_for_tokenizer, target)
    model_class = davir_class(config.family)
    with torch.random.fork_rng(devices=[target] if target.type == "cuda" else []):
        torch.manual_seed(config.seed)  # LoRA's random A matrices
        model = model_class(config, core, processor)
    return model.to(target)


def davir_class(family_name: str) -> type:
    """The davir model class around a family's core (by the path its family module names)."""
    module, name = get_family(family_name).davir_class_path.split(":")
    return getattr(importlib.import_module(module), name)


def load_davir_model(directory, *, device: str | torch.device | None = None, pretrained=None) -> nn.Module:
    """A saved DAVIR model folder of any family (``save_pretrained``), with the class its config records."""
    from davir.models.davir_checkpoint import read_davir_config

    return davir_class(read_davir_config(directory).family).from_pretrained(
        directory, device=device, pretrained=pretrained)


__all__ = [
    "DavirModel",
    "DavirModelConfig",
    "DavirOutput",
    "EpcConfig",
    "LoraSettings",
    "build_davir_model",
    "load_davir_model",
    "entity_prompts",
    "make_lora_config",
]
