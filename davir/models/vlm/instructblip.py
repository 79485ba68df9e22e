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

This module holds the model (a :class:`davir.models.vlm.base.DavirVLM`); its parts live beside it: ``config``
(the typed config), ``lora`` (LoRA targets, App. B), ``epc`` (Eq. 10 prompts), ``attention`` (the FAC hook),
``checkpoint`` (the saved folder); how the InstructBLIP inside is loaded or built is its family's
(``davir.models.families.instructblip``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from torch import nn
from transformers import InstructBlipForConditionalGeneration, InstructBlipProcessor

from davir.models.losses import IGNORE_INDEX
from davir.models.vlm.attention import ClsAttentionHook, cls_to_patch_map, last_layer_attention_module
from davir.models.vlm.base import DavirVLM
from davir.models.vlm.config import DavirModelConfig
from davir.models.vlm.lora import make_lora_config
from davir.models.vlm.output import DavirOutput, davir_output

# ---------------------------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------------------------


class DavirModel(DavirVLM):
    """InstructBLIP with two images, an entity prompt and FAC. Build with :func:`build_davir_model` or
    :meth:`from_pretrained`; ``self.blip`` is the InstructBLIP (wrapped by PEFT in LoRA mode) and
    ``self.core`` the bare ``InstructBlipForConditionalGeneration`` inside it."""

    wrapped_attribute = "blip"

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

        self.blip: nn.Module = self._wrap_core(core, make_lora_config(config.lora), config.extra_trainable)
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
    @property
    def core(self) -> InstructBlipForConditionalGeneration:
        return super().core

    @property
    def device(self) -> torch.device:
        return self.core.language_projection.weight.device

    @property
    def end_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    # ------------------------------------------------------------------------------------------- preprocessing
    def image_processor(self, images: Image.Image | Sequence[Image.Image]) -> torch.Tensor:
        """PIL images → (N, 3, S, S) float pixel values: resize to S×S (bicubic) + CLIP mean/std (the saved
        ``InstructBlipProcessor``'s image processor, i.e. the real folder's own for a pretrained model)."""
        if isinstance(images, Image.Image):
            images = [images]
        if len(images) == 0:
            raise ValueError("image_processor got no images")
        return self.processor.image_processor(list(images), return_tensors="pt")["pixel_values"]

    def _prompt_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        # With special tokens: LLaMA (and the word-level tokenizer) put a BOS in front, as InstructBLIP does.
        encoded = self.tokenizer(
            list(prompts), add_special_tokens=True, truncation=True, max_length=self.config.max_prompt_tokens
        )
        return [list(ids) for ids in encoded["input_ids"]]

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
    def language_pass(
        self, visual: torch.Tensor, prompts: Sequence[str], captions: Sequence[str] | None
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

        return davir_output(
            logits,
            labels if captions is not None else None,
            attention_before,
            attention_after,
            self.config.fac,
            masks_before,
            masks_after,
            mask_valid,
        )

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
        with self._eval_mode():
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
        if return_attention:
            return captions, attention_before, attention_after
        return captions

    # ----------------------------------------------------------------------------------------------- summary
    def part_of(self, name: str) -> str:
        """vision, qformer, query_tokens, language_projection, language_model or segment_embeddings."""
        head = name.split(".", 1)[0]
        return {"vision_model": "vision", "qformer": "qformer"}.get(head, head)
