"""DAVIR's FAC and EPC on a chat vision-language model (Qwen2.5-VL, LLaVA-OneVision, SmolVLM).

One user turn holds both images and the Eq. 10 prompt, through the processor's own chat template::

    <user> [before image] [after image] "Describe the difference … Entity: small red cube." <assistant> caption <end>

The image placeholders are expanded exactly as the family's processor expands them (``replace_image_token``
of one S×S picture: one grid per run, ``davir.models.families.base``), the caption and its end-of-turn token
are the only labelled positions, and the model's own forward merges the image features into the sequence.
FAC reads the attention of the vision layer the family names through a hook that leaves the fast attention
kernel in place (``davir.models.vlm.received_attention``), so Eqs. 6-7 and 12 apply unchanged::

    L_total = L_caption + λ · L_attn(A_before, A_after; masks)          (Eq. 12)

Everything the run needs — training, resume, evaluation, captioning, the saved folder — is the same as for
InstructBLIP's :class:`davir.models.vlm.instructblip.DavirModel`: both are a :class:`davir.models.vlm.base.DavirVLM`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from PIL import Image
from torch import nn

from davir.models.families import get_family
from davir.models.losses import IGNORE_INDEX
from davir.models.vlm.base import DavirVLM
from davir.models.vlm.chat_turn import cut_prompt, encode_turns, turn_text
from davir.models.vlm.config import DavirModelConfig
from davir.models.vlm.lora import make_family_lora_config
from davir.models.vlm.output import DavirOutput, davir_output


class ChatDavirModel(DavirVLM):
    """A chat VLM of a registered family with two images, an entity prompt and FAC. Build with
    :func:`davir.models.build_davir_model`; ``self.vlm`` is the model (PEFT-wrapped in LoRA mode), ``self.core``
    the bare ``*ForConditionalGeneration`` inside it."""

    wrapped_attribute = "vlm"

    def __init__(self, config: DavirModelConfig, core: nn.Module, processor: Any) -> None:
        super().__init__()
        self.family = get_family(config.family)
        self.config = config
        self.processor = processor
        self.tokenizer = processor.tokenizer
        if self.tokenizer.pad_token_id is None:  # pads are masked; any id will do
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.tokenizer.truncation_side = "right"
        self.image_size = self.family.input_size(config, core.config)
        self.patch_grid = self.family.patch_grid(self.image_size, core.config)
        # The per-run constants of one S×S picture (grid sizes), and the text that stands for one image.
        self._one_image = dict(self.family.process_images(processor, [Image.new("RGB", (8, 8))], self.image_size))
        self.image_text = processor.replace_image_token(self._one_image, 0)
        self._pixel_shape = tuple(self.family.per_image_pixels(self._one_image, 1).shape[1:])
        self._end_token_id = self.tokenizer.convert_tokens_to_ids(self.family.end_of_turn)
        if self._end_token_id is None or self._end_token_id == self.tokenizer.unk_token_id:
            raise ValueError(f"the {config.family} tokenizer has no {self.family.end_of_turn!r} token (end of turn)")

        self.vlm: nn.Module = self._wrap_core(
            core,
            make_family_lora_config(self.family, config.lora),
            [self.family.trainable_parts[part] for part in config.extra_trainable],
        )
        if config.gradient_checkpointing:
            core.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if config.train_mode == "lora":
                core.enable_input_require_grads()
        # After PEFT, so the hook sees the LoRA-adapted projections.
        self.attention_hook = self.family.attention_hook(core).attach()

    # ----------------------------------------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.core.get_input_embeddings().weight.device

    @property
    def end_token_id(self) -> int:
        """The family's end-of-turn token (the caption's EOS)."""
        return self._end_token_id

    # ------------------------------------------------------------------------------------------- preprocessing
    def image_processor(self, images: Image.Image | Sequence[Image.Image]) -> torch.Tensor:
        """PIL images → (N, …) the family processor's pixels of each picture resized to S×S."""
        if isinstance(images, Image.Image):
            images = [images]
        if len(images) == 0:
            raise ValueError("image_processor got no images")
        processed = self.family.process_images(self.processor, list(images), self.image_size)
        return self.family.per_image_pixels(processed, len(images))

    def chat_text(self, prompt: str, images: int = 2) -> str:
        """The user turn (before image, after image, the prompt) and the assistant's opening, image
        placeholders expanded as the processor expands them. ``images=1``: one picture before the prompt
        (the single-image description stage of ``davir.pretrain_tiny``)."""
        prompt = cut_prompt(self.tokenizer, prompt, self.config.max_prompt_tokens)
        text = turn_text(self.processor, self.config.family, prompt, images)
        return text.replace(self.processor.image_token, self.image_text)

    def _prompt_ids(self, prompts: Sequence[str], images: int = 2) -> list[list[int]]:
        return encode_turns(self.tokenizer, [self.chat_text(p, images) for p in prompts])

    def _token_types(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        if not getattr(self.processor, "return_mm_token_type_ids", False):
            return {}
        types = self.processor.create_mm_token_type_ids(input_ids.tolist())
        return {self.family.token_type_key: torch.tensor(types, dtype=torch.long, device=input_ids.device)}

    def _pixel_inputs(self, *images: torch.Tensor) -> dict[str, torch.Tensor]:
        """The model's image arguments for B rows of K pictures (``images``: K tensors of (B, …), in text order)."""
        if any(pixels.shape != images[0].shape for pixels in images[1:]):
            raise ValueError("the images of a turn differ in shape: " + ", ".join(str(tuple(p.shape)) for p in images))
        expected = self._pixel_shape
        if tuple(images[0].shape[1:]) != expected:
            raise ValueError(
                f"pixels of shape {tuple(images[0].shape[1:])} per image, the model takes {expected} "
                f"(pictures through this model's image_processor at {self.image_size}×{self.image_size})"
            )
        dtype = self.family.vision_tower(self.core).dtype
        device = self.device
        one = {key: value.to(device) for key, value in self._one_image.items() if torch.is_tensor(value)}
        inputs = self.family.pixel_inputs(torch.stack(images, dim=1).to(device), one)
        inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
        return inputs

    # ----------------------------------------------------------------------------------------------- forward
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
        """Teacher-forced pass; arguments and result as :meth:`davir.models.vlm.instructblip.DavirModel.forward`
        (``logits`` over the whole chat sequence, labels only on the caption and its end-of-turn token)."""
        batch = pixel_before.shape[0]
        if len(prompts) != batch:
            raise ValueError(f"{len(prompts)} prompts for a batch of {batch} image pairs")
        if captions is not None and len(captions) != batch:
            raise ValueError(f"{len(captions)} captions for a batch of {batch} image pairs")
        logits, labels = self.teacher_forced([pixel_before, pixel_after], prompts, captions)
        maps = self.family.attention_maps(self.attention_hook.pop(), 2 * batch, self.patch_grid)
        attention_before, attention_after = maps[0::2], maps[1::2]

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

    def teacher_forced(
        self, images: Sequence[torch.Tensor], prompts: Sequence[str], captions: Sequence[str] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, labels) of one chat turn per row holding ``images`` (K tensors of (B, …), in text order)
        and its prompt, the caption teacher-forced after it (labels only on the caption and its end of turn;
        all ``IGNORE_INDEX`` without captions). The FAC hook keeps the vision pass's attention for ``pop()``."""
        batch = len(prompts)
        pixels = self._pixel_inputs(*images)
        prompt_ids = self._prompt_ids(prompts, len(images))
        caption_ids = self._caption_ids(captions) if captions is not None else [[] for _ in range(batch)]
        length = max(len(p) + len(c) for p, c in zip(prompt_ids, caption_ids))
        input_ids = torch.full((batch, length), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, length), dtype=torch.long)
        labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)
        for row, (p, c) in enumerate(zip(prompt_ids, caption_ids)):
            input_ids[row, : len(p) + len(c)] = torch.tensor(p + c)
            attention_mask[row, : len(p) + len(c)] = 1
            if c:
                labels[row, len(p) : len(p) + len(c)] = torch.tensor(c)
        device = self.device
        input_ids, attention_mask, labels = input_ids.to(device), attention_mask.to(device), labels.to(device)
        output = self.vlm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            use_cache=False,
            **pixels,
            **self._token_types(input_ids),
        )
        return output.logits, labels

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
        """Caption a batch with the model's own ``generate`` (left padding, KV cache, greedy or beam search);
        returns as :meth:`davir.models.vlm.instructblip.DavirModel.generate` (``pad_length_to`` likewise)."""
        with self._eval_mode():
            batch = pixel_before.shape[0]
            if len(prompts) != batch:
                raise ValueError(f"{len(prompts)} prompts for a batch of {batch} image pairs")
            pixels = self._pixel_inputs(pixel_before, pixel_after)
            captions = self._generate_from_pixels(
                pixels,
                prompts,
                2,
                max_new_tokens=max_new_tokens,
                num_beams=num_beams,
                pad_length_to=pad_length_to,
                **generate_kwargs,
            )
            if return_attention:
                # One vision pass of the B pairs, in the order the text holds them.
                self.family.encode_images(self.core, pixels)
                maps = self.family.attention_maps(self.attention_hook.pop(), 2 * batch, self.patch_grid)
        if return_attention:
            return captions, maps[0::2], maps[1::2]
        return captions

    @torch.no_grad()
    def generate_turns(
        self, images: Sequence[torch.Tensor], prompts: Sequence[str], **generate_kwargs: Any
    ) -> list[str]:
        """Greedy/beam answers to one chat turn per row holding ``images`` (K tensors of (B, …), in text order)
        and its prompt, with the model's own ``generate`` (left padding, KV cache)."""
        return self._generate_from_pixels(self._pixel_inputs(*images), prompts, len(images), **generate_kwargs)

    def _generate_from_pixels(
        self,
        pixels: dict[str, torch.Tensor],
        prompts: Sequence[str],
        images: int,
        pad_length_to: int = 1,
        **generate_kwargs: Any,
    ) -> list[str]:
        """:meth:`generate_turns` on the turn's :meth:`_pixel_inputs` (``generate`` reuses them for its attention
        pass); ``images``: pictures per turn."""
        prompt_ids = self._prompt_ids(prompts, images)
        batch, length = len(prompt_ids), -(-max(len(p) for p in prompt_ids) // pad_length_to) * pad_length_to
        input_ids = torch.full((batch, length), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, length), dtype=torch.long)
        for row, p in enumerate(prompt_ids):
            input_ids[row, length - len(p) :] = torch.tensor(p)
            attention_mask[row, length - len(p) :] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        settings = dict(do_sample=False, pad_token_id=self.tokenizer.pad_token_id, eos_token_id=self.end_token_id)
        settings.update(generate_kwargs)
        with self._attention_hook_off():
            output = self.core.generate(
                input_ids=input_ids, attention_mask=attention_mask, **pixels, **self._token_types(input_ids), **settings
            )
        return [text.strip() for text in self.tokenizer.batch_decode(output[:, length:], skip_special_tokens=True)]

    @contextlib.contextmanager
    def _attention_hook_off(self) -> Iterator[None]:
        """The FAC hook detached: the prefill's (beam-expanded) images need no map, and the received attention
        of a patch grid is a T×T matrix per head and image (Qwen2.5-VL-7B at 448 px: 64 MiB an image in float32,
        24 GiB for 64 pairs × 3 beams)."""
        self.attention_hook.detach()
        try:
            yield
        finally:
            self.attention_hook.attach()

    # ----------------------------------------------------------------------------------------------- summary
    def part_of(self, name: str) -> str:
        """The family's part (vision, projector, language_model, lm_head)."""
        return self.family.part_of(name)
