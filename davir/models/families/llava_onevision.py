"""LLaVA-OneVision: a SigLIP vision tower + a 2-layer MLP projector + Qwen2 LLM, one learned ``image_newline``.

* **Images** [D]: every picture is resized to S×S, S the SigLIP input size (384 in the released models, 64 in
  ``tiny``), and both images of a pair go through the processor as *one sample of two images* — the
  processor's own multi-image mode, ``processor(text=[turn], images=[[before, after]])``, which is also what
  ``processor.apply_chat_template(..., tokenize=True)`` does with a turn holding two images, and how
  LLaVA-OneVision was trained on multi-image data. Each image is then one S×S crop (no anyres tiles) and
  ``⌊S/p⌋² + 1`` image tokens, the last one ``image_newline``: 65 in ``tiny`` (8×8 patches), 730 in the 7B
  (27×27). The alternative, a flat ``images=[before, after]``, treats each picture as a single image and
  runs anyres on it: for an S×S picture ``select_best_resolution`` picks the S×S pinpoint, so the image gets
  the base crop plus one tile *with the same pixels*, and ``2·⌊S/p⌋² + ⌊S/p⌋`` tokens (136 tiny, 1485 in the
  7B): twice the vision work and twice the image tokens for no new information, so we do not use it. The
  multi-image mode needs no ``image_grid_pinpoints`` setting, so a real processor works as saved; the
  presets keep the real layout of pinpoints (multiples of S up to 6S × 6S) and ``anyres_max_9``, unused
  here. ``batch_num_images`` (2 per pair) tells the model the mode; ``image_sizes`` is S×S for every image.
* **Chat turn**: the real LLaVA-OneVision (Qwen2 chat) template — images first, one ``<image>\\n`` each, then
  the text: ``<|im_start|>user\\n<image>\\n<image>\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n``.
* **FAC** [D]: SigLIP has no [CLS] token. FAC supervises the *mean attention each patch receives* — over all
  heads and all query patches of the same image (``davir.models.vlm.received_attention``) — in the vision layer
  whose output the projector reads (``vision_feature_layer``: -1, the last of the 26 layers, in the released
  models; -2 or a positive hidden-state index name another layer, a list its deepest layer). That layer's
  attention is the ViT's own summary of where it looks in the features the LLM gets. Each image has one crop,
  the base image (no tiles in multi-image mode), so the map is that crop's ⌊S/p⌋×⌊S/p⌋ patch grid, in raster
  order (SigLIP's patch convolution leaves the last S mod p pixels of a side unread: 6 at 384 px, patch 14).
  The hook recomputes it from the layer's ``q_proj``/``k_proj`` outputs (LoRA included), so SDPA/flash stay in
  place (tests: equal to eager attention).
* **LoRA**: SigLIP attention ``q_proj``/``k_proj``/``v_proj`` (``vision_rank``), the projector's two linears
  (``qformer_rank``), the LLM attention projections (``llm_rank``).

The ``7b`` preset is llava-onevision-qwen2-7b-ov (``llava-hf/llava-onevision-qwen2-7b-ov-hf``); its numbers are
transformers' ``LlavaOnevisionConfig`` defaults (documented as that checkpoint's configuration) and its
conversion script ``convert_llava_onevision_weights_to_hf.py``: SigLIP-so400m-patch14-384 with the last of its
27 layers dropped (26 layers, 1152 wide, 16 heads, MLP 4304, no pooling head), Qwen2-7B (3584 wide, 28 layers,
28 heads / 4 KV, MLP 18944, RoPE θ 1e6), vocabulary 152064 + ``<image>``, ``<video>`` padded to a multiple of
64 (152128), ``vision_feature_layer=-1``, ``"full"`` features, ``anyres_max_9`` and 36 pinpoints (384…2304)².
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from torch import nn
from transformers import (
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessor,
    LlavaOnevisionProcessor,
    LlavaOnevisionVideoProcessor,
)

from davir.models.families import FAMILIES
from davir.models.families.base import ChatFamily, fac_layer_index
from davir.models.vlm.received_attention import QueryKeyHook

# The chat template of the released checkpoints (transformers' convert_llava_onevision_weights_to_hf.py).
LLAVA_ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
REAL_IMAGE_SIZE = 384
REAL_VOCAB = 152128  # Qwen2-7B's 152064 + <image>, <video>, padded to a multiple of 64 by the conversion


def _check_grid(image_size: int, patch_size: int) -> None:
    """SigLIP's patch convolution covers ⌊S/p⌋ patches a side (384 px, patch 14: 27, the last 6 px unread)."""
    if image_size <= 0 or patch_size <= 0 or image_size < patch_size:
        raise ValueError(
            f"image_size ({image_size}) and patch_size ({patch_size}) must be positive, the image at least one patch"
        )


def grid_pinpoints(size: int) -> list[list[int]]:
    """The released models' anyres resolutions (size·i × size·j, i, j = 1…6) for the base size ``size``."""
    return [[size * i, size * j] for i in range(1, 7) for j in range(1, 7)]


def tiny_config(
    *,
    tokenizer,
    image_size: int | None = None,
    patch_size: int | None = None,
    vision_hidden: int = 128,
    vision_layers: int = 3,
    vision_heads: int = 4,
    vision_mlp: int = 256,
    text_hidden: int = 128,
    text_layers: int = 2,
    text_heads: int = 4,
    text_kv_heads: int = 2,
    text_mlp: int = 512,
    max_positions: int = 1024,
    vision_feature_layer: int = -1,
) -> LlavaOnevisionConfig:
    """Toy LLaVA-OneVision: SigLIP 128/3 layers/4 heads/patch 8 at 64 px (8×8 patches → 65 image tokens per
    image with the newline), Qwen2 LLM 128/2 layers/4 heads (2 KV), MLP 512. SigLIP's own initialisation
    (Xavier / LeCun normal) keeps the random vision weights at a trainable scale."""
    image_size = 64 if image_size is None else image_size
    patch_size = 8 if patch_size is None else patch_size
    _check_grid(image_size, patch_size)
    return _config(
        tokenizer,
        image_size=image_size,
        vision_feature_layer=vision_feature_layer,
        vision=dict(
            hidden_size=vision_hidden,
            intermediate_size=vision_mlp,
            num_hidden_layers=vision_layers,
            num_attention_heads=vision_heads,
            patch_size=patch_size,
        ),
        text=dict(
            hidden_size=text_hidden,
            intermediate_size=text_mlp,
            num_hidden_layers=text_layers,
            num_attention_heads=text_heads,
            num_key_value_heads=text_kv_heads,
            max_position_embeddings=max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    )


def onevision7b_config(
    *, tokenizer, image_size: int | None = None, patch_size: int | None = None
) -> LlavaOnevisionConfig:
    """llava-onevision-qwen2-7b-ov: SigLIP-so400m-patch14-384 less its last layer (1152 wide, 26 layers, 16
    heads, MLP 4304, 27×27 patches), Qwen2-7B (3584 wide, 28 layers, 28 heads / 4 KV, MLP 18944, vocab 152128)."""
    image_size = REAL_IMAGE_SIZE if image_size is None else image_size
    patch_size = 14 if patch_size is None else patch_size
    _check_grid(image_size, patch_size)
    return _config(
        tokenizer,
        image_size=image_size,
        vocab=REAL_VOCAB,
        vision_feature_layer=-1,
        vision=dict(
            hidden_size=1152,
            intermediate_size=4304,
            num_hidden_layers=26,
            num_attention_heads=16,
            patch_size=patch_size,
        ),
        text=dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    )


def _config(
    tokenizer, *, image_size: int, vision: dict, text: dict, vision_feature_layer: int, vocab: int = 0
) -> LlavaOnevisionConfig:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return LlavaOnevisionConfig(
        vision_config=dict(model_type="siglip_vision_model", image_size=image_size, vision_use_head=False, **vision),
        text_config=dict(
            model_type="qwen2",
            vocab_size=max(vocab, len(tokenizer)),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=end,
            tie_word_embeddings=False,
            **text,
        ),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        vision_feature_layer=vision_feature_layer,
        vision_feature_select_strategy="full",
        image_grid_pinpoints=grid_pinpoints(image_size),
        vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=False,
    )


class LlavaOnevisionFamily(ChatFamily):
    name = "llava_onevision"
    model_type = "llava_onevision"
    model_class = LlavaOnevisionForConditionalGeneration
    processor_class = LlavaOnevisionProcessor
    config_class = LlavaOnevisionConfig
    presets = {"tiny": tiny_config, "7b": onevision7b_config}
    special_tokens = ("<|im_start|>", "<|im_end|>", "<image>", "<video>")
    chat_template = LLAVA_ONEVISION_CHAT_TEMPLATE
    end_of_turn = "<|im_end|>"
    # SiglipVisionModel holds its encoder directly in transformers 5 (in ``.vision_model`` before)
    vision_lora_pattern = (
        r"model\.vision_tower\.(?:vision_model\.)?encoder\.layers\.\d+\.self_attn\."
        r"(?:q_proj|k_proj|v_proj)"
    )
    projector_lora_pattern = r"model\.multi_modal_projector\.linear_[12]"
    llm_lora_pattern = r"model\.language_model\.layers\.\d+\.self_attn\.(?:{targets})"
    trainable_parts = {"projector": "model.multi_modal_projector"}
    fac_reads = (
        "mean attention each patch receives in the SigLIP layer the projector reads "
        "(vision_feature_layer, the last) [D] (no [CLS]; one base crop per image)"
    )

    def preset_processor(self, tokenizer, architecture: LlavaOnevisionConfig) -> LlavaOnevisionProcessor:
        vision = architecture.vision_config
        size = {"height": vision.image_size, "width": vision.image_size}
        side = vision.image_size // vision.patch_size
        return LlavaOnevisionProcessor(
            image_processor=LlavaOnevisionImageProcessor(
                size=size, image_grid_pinpoints=architecture.image_grid_pinpoints
            ),
            tokenizer=tokenizer,
            video_processor=LlavaOnevisionVideoProcessor(size=size),
            num_image_tokens=side * side,
            vision_feature_select_strategy=architecture.vision_feature_select_strategy,
            vision_aspect_ratio=architecture.vision_aspect_ratio,
            chat_template=self.chat_template,
        )

    # ------------------------------------------------------------------------------------------------- images
    def input_size(self, model_config, architecture: LlavaOnevisionConfig) -> int:
        """S: ``model.image_size``, else the vision tower's input size (384 in the released models). SigLIP's
        position embeddings are fixed, so S must be that size."""
        vision = architecture.vision_config
        size = model_config.image_size or vision.image_size
        if size != vision.image_size:
            raise ValueError(
                f"model.image_size={size}, but this {self.name} vision tower takes "
                f"{vision.image_size}×{vision.image_size} pictures (SigLIP's position embeddings are "
                f"fixed): set model.image_size={vision.image_size} or leave it empty"
            )
        _check_grid(size, vision.patch_size)
        return size

    def patch_grid(self, size: int, architecture: LlavaOnevisionConfig) -> tuple[int, int]:
        side = size // architecture.vision_config.patch_size
        return side, side

    def process_images(self, processor, images: Sequence[Image.Image], size: int) -> dict[str, torch.Tensor]:
        """The image processor's multi-image mode on S×S copies of ``images`` (one sample holding them all):
        one S×S crop per image. A single picture is processed as one of two (every picture here is one of the
        two images of a turn), so ``replace_image_token`` counts its tokens as in the pair."""
        resized = [image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC) for image in images]
        if not resized:
            raise ValueError(f"{self.name}: no images to process")
        kwargs = {**getattr(processor, "images_kwargs", {}), **self.image_kwargs}
        group = resized if len(resized) > 1 else resized * 2
        processed = processor.image_processor(images=[group], return_tensors="pt", **kwargs)
        if len(resized) == 1:
            processed["pixel_values"] = processed["pixel_values"][:1]
            processed["image_sizes"] = processed["image_sizes"][:1]
        return processed

    def per_image_pixels(self, processed: dict[str, torch.Tensor], count: int) -> torch.Tensor:
        """(count, C, S, S): the one crop of each image."""
        pixels = processed["pixel_values"]  # (count, crops = 1, C, S, S)
        if pixels.shape[0] != count or pixels.shape[1] != 1:
            raise ValueError(
                f"{self.name}: the processor gave {tuple(pixels.shape[:2])} (images, crops) for "
                f"{count} images of one crop each"
            )
        return pixels[:, 0]

    def pixel_inputs(self, pixels: torch.Tensor, one_image: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        rows, per_row = pixels.shape[:2]  # (B, K, C, S, S): row by row, in text order
        return {
            "pixel_values": pixels.reshape(rows * per_row, 1, *pixels.shape[2:]),
            "image_sizes": one_image["image_sizes"][:1].repeat(rows * per_row, 1),
            "batch_num_images": torch.full((rows,), per_row, dtype=torch.long, device=pixels.device),
        }

    # -------------------------------------------------------------------------------------------------- FAC
    def fac_attention(self, core: nn.Module) -> nn.Module:
        """The attention module of the SigLIP layer FAC reads (:func:`fac_layer_index`)."""
        tower = core.model.vision_tower  # SiglipVisionModel: its encoder directly (transformers 5), or in .vision_model
        encoder = getattr(tower, "vision_model", tower).encoder
        return encoder.layers[fac_layer_index(core.config)].self_attn

    def attention_hook(self, core: nn.Module) -> QueryKeyHook:
        attention = self.fac_attention(core)
        return QueryKeyHook(attention, heads=attention.num_heads, scale=attention.scale)

    def attention_maps(self, captured: torch.Tensor, images: int, grid: tuple[int, int]) -> torch.Tensor:
        """(images, Hp, Wp): one crop per image (the base image), its patches in raster order."""
        if captured.shape[0] != images:
            raise ValueError(f"the FAC hook saw {captured.shape[0]} crops, expected {images} (one per image)")
        if captured.shape[1] != grid[0] * grid[1]:
            raise ValueError(f"the FAC hook saw {captured.shape[1]} patches per crop, expected {grid[0]}×{grid[1]}")
        return captured.reshape(images, *grid)

    def encode_images(self, core: nn.Module, pixels: dict[str, torch.Tensor]) -> Any:
        return core.model.get_image_features(
            pixel_values=pixels["pixel_values"],
            image_sizes=pixels["image_sizes"],
            batch_num_images=pixels["batch_num_images"],
        )

    def vision_tower(self, core: nn.Module) -> nn.Module:
        return core.model.vision_tower

    # ------------------------------------------------------------------------------------------------- parts
    def part_of(self, name: str) -> str:
        if name.startswith(("model.multi_modal_projector", "model.image_newline")):
            return "projector"
        if name.startswith("model.vision_tower"):
            return "vision"
        if name.startswith("model.language_model"):
            return "language_model"
        return name.split(".", 1)[0]


FAMILY = FAMILIES.register("llava_onevision", LlavaOnevisionFamily())
