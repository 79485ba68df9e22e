"""SmolVLM (SmolVLM2): a SigLIP vision encoder, a pixel-shuffle connector and a Llama (SmolLM2) LLM.

* **Images.** SmolVLM's processor resizes the longest edge (4 × 384 px in SmolVLM2) and splits the picture
  into 384-px tiles plus a downscaled global image, so the number of images the vision encoder sees, and of
  ``<image>`` tokens, follows each picture's size. One grid per run [D]: every picture is resized to S×S, with
  S the vision config's ``image_size`` (64 tiny, 384 ``2b``), and the processor runs with
  ``do_image_splitting=False`` — one global image per picture, the processor's documented low-memory mode —
  and ``size`` = ``max_image_size`` = ``{"longest_edge": S}``, so the S×S picture stays S×S (no up-then-down
  resampling through SmolVLM2's default 1536-px longest edge). Each picture is then one S×S image:
  (S // p)² patches, ``scale_factor``² of them shuffled into one token → (S // p)² / scale² ``<image>`` tokens
  (tiny: 8×8 patches → 16; ``2b``: 27×27 → 81; 384 px at patch 14 leaves 6 px uncovered at the right and
  bottom, as in SmolVLM2), written ``<fake_token_around_image><global-img><image>…
  <fake_token_around_image>`` as the processor writes a picture it did not split. S must be the vision config's
  ``image_size``: the processor writes a fixed ``image_seq_len`` of ``<image>`` tokens per picture, computed
  for that size. Both pictures sit in one user turn, before first:
  ``<|im_start|>User:<image><image>prompt<end_of_utterance>\\nAssistant:`` (the processor's chat template).
* **FAC** [D]: SigLIP has no [CLS] token (and SmolVLM uses no pooling head). FAC supervises the *mean
  attention each patch receives* — over all heads and all query patches of the same picture — in the **last
  encoder layer**, whose output (after ``post_layernorm``) is what the connector shuffles into the LLM's image
  tokens: with no [CLS] row, this is the encoder's own summary of where it looks, in the layer closest to what
  the LLM reads. Every layer is full attention over the S/p × S/p patches, in raster order. The hook
  recomputes it from the layer's ``q_proj``/``k_proj`` outputs (LoRA included), so SDPA/flash stay in place
  (tests: equal to eager attention).
* **LoRA**: the encoder's ``q_proj``/``k_proj``/``v_proj`` (``vision_rank``), the connector's linear
  projection (``qformer_rank``), the LLM attention projections (``llm_rank``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from torch import nn
from transformers import (
    SmolVLMConfig,
    SmolVLMForConditionalGeneration,
    SmolVLMImageProcessor,
    SmolVLMProcessor,
    SmolVLMVideoProcessor,
)
from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

from davir.models.families import FAMILIES
from davir.models.families.base import ChatFamily
from davir.models.vlm.received_attention import QueryKeyHook

# The processor's own template (transformers' SmolVLMProcessor, the layout of SmolVLM2's chat_template):
# <|im_start|>User:<image><image>text<end_of_utterance>\nAssistant:
SMOLVLM_CHAT_TEMPLATE = DEFAULT_CHAT_TEMPLATE
# Words of the template the word-level tokenizer of a preset must know ("User:" → "user", ":").
SMOLVLM_CHAT_WORDS = ("User: Assistant:",)


def _check_grid(image_size: int, patch_size: int, scale_factor: int) -> None:
    side = image_size // patch_size if patch_size > 0 else 0
    if side <= 0 or scale_factor <= 0 or side % scale_factor:
        raise ValueError(
            f"image_size // patch_size ({image_size} // {patch_size} = {side}) must be a positive "
            f"multiple of scale_factor ({scale_factor}): the connector shuffles scale_factor × "
            "scale_factor patches into one token"
        )


def image_tokens(image_size: int, patch_size: int, scale_factor: int) -> int:
    """``<image>`` tokens of one S×S picture: (S // p)² patches, scale² of them per token (as the model's
    ``image_seq_len``)."""
    return (image_size // patch_size) ** 2 // scale_factor**2


def tiny_config(
    *,
    tokenizer,
    image_size: int | None = None,
    patch_size: int | None = None,
    vision_hidden: int = 128,
    vision_layers: int = 3,
    vision_heads: int = 4,
    vision_mlp: int = 512,
    scale_factor: int = 2,
    text_hidden: int = 128,
    text_layers: int = 2,
    text_heads: int = 4,
    text_kv_heads: int = 2,
    text_mlp: int = 512,
    max_positions: int = 512,
) -> SmolVLMConfig:
    """Toy SmolVLM: vision encoder 128 wide, 3 layers, 4 heads, patch 8 at 64 px (8×8 patches → 16 image
    tokens after the 2×2 pixel shuffle), Llama LLM 128 wide, 2 layers, 4 heads (2 KV), MLP 512; 1.2 M weights
    plus 256 per word of the vocabulary. Initializer range 0.02 (transformers' default; the tiny model learns)."""
    image_size = 64 if image_size is None else image_size
    patch_size = 8 if patch_size is None else patch_size
    _check_grid(image_size, patch_size, scale_factor)
    return _config(
        tokenizer,
        scale_factor=scale_factor,
        vision=dict(
            hidden_size=vision_hidden,
            intermediate_size=vision_mlp,
            num_hidden_layers=vision_layers,
            num_attention_heads=vision_heads,
            image_size=image_size,
            patch_size=patch_size,
            initializer_range=0.02,
        ),
        text=dict(
            hidden_size=text_hidden,
            intermediate_size=text_mlp,
            num_hidden_layers=text_layers,
            num_attention_heads=text_heads,
            num_key_value_heads=text_kv_heads,
            max_position_embeddings=max_positions,
            initializer_range=0.02,
        ),
    )


def smolvlm2_2b_config(*, tokenizer, image_size: int | None = None, patch_size: int | None = None) -> SmolVLMConfig:
    """SmolVLM2-2.2B-Instruct's architecture (the checkpoint transformers' ``SmolVLMConfig`` documents): the
    SigLIP-so400m-patch14-384 encoder (1152 wide — ``SmolVLMVisionConfig``'s default width and heads — 27 layers,
    16 heads, MLP 4304, patch 14 at 384 px), pixel shuffle ``scale_factor`` 3 (27×27 patches → 81 image
    tokens), SmolLM2-1.7B as LLM (Llama: 2048 wide, 24 layers, 32 heads = 32 KV heads of 64, MLP 8192,
    vocab 49280, RMSNorm eps 1e-5 as ``SmolVLMConfig``'s text default). Where the numbers come from: the
    transformers SmolVLM/Idefics3 configs and docs and the published config.json as mirrored in mlx-vlm's
    tests; the RoPE base and context length are not confirmed here and stay Llama's defaults with 8192
    positions — a real folder (``model.pretrained``) brings its own config.json, which overrides every number."""
    patch_size = 14 if patch_size is None else patch_size
    image_size = 384 if image_size is None else image_size
    _check_grid(image_size, patch_size, 3)
    return _config(
        tokenizer,
        vocab=49280,
        scale_factor=3,
        vision=dict(
            hidden_size=1152,
            intermediate_size=4304,
            num_hidden_layers=27,
            num_attention_heads=16,
            image_size=image_size,
            patch_size=patch_size,
        ),
        text=dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=24,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
        ),
    )


def _config(tokenizer, *, scale_factor: int, vision: dict, text: dict, vocab: int = 0) -> SmolVLMConfig:
    end = tokenizer.convert_tokens_to_ids("<end_of_utterance>")
    return SmolVLMConfig(
        vision_config=vision,
        text_config=dict(
            model_type="llama",
            vocab_size=max(vocab, len(tokenizer)),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=end,
            tie_word_embeddings=False,
            **text,
        ),
        scale_factor=scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


class SmolVLMFamily(ChatFamily):
    name = "smolvlm"
    model_type = "smolvlm"
    model_class = SmolVLMForConditionalGeneration
    processor_class = SmolVLMProcessor
    config_class = SmolVLMConfig
    presets = {"tiny": tiny_config, "2b": smolvlm2_2b_config}
    special_tokens = (
        "<|im_start|>",
        "<fake_token_around_image>",
        "<image>",
        "<global-img>",
        "<end_of_utterance>",
        "<video>",
    )
    chat_template = SMOLVLM_CHAT_TEMPLATE
    end_of_turn = "<end_of_utterance>"
    vision_lora_pattern = r"model\.vision_model\.encoder\.layers\.\d+\.self_attn\.(?:q_proj|k_proj|v_proj)"
    projector_lora_pattern = r"model\.connector\.modality_projection\.proj"
    llm_lora_pattern = r"model\.text_model\.layers\.\d+\.self_attn\.(?:{targets})"
    trainable_parts = {"projector": "model.connector"}
    # One global image per picture, no tiles [D]; the S×S size kwargs are added per call (process_images).
    image_kwargs = {"do_image_splitting": False}
    fac_reads = (
        "mean attention each patch receives in the last SigLIP encoder layer [D] "
        "(no [CLS]; the layer the connector reads)"
    )

    # ------------------------------------------------------------------------------------------------ presets
    def preset_tokenizer(self, texts: Sequence[str]):
        return super().preset_tokenizer([*texts, *SMOLVLM_CHAT_WORDS])

    def preset_processor(self, tokenizer, architecture: SmolVLMConfig) -> SmolVLMProcessor:
        vision = architecture.vision_config
        size = vision.image_size
        sizes = dict(size={"longest_edge": size}, max_image_size={"longest_edge": size})
        return SmolVLMProcessor(
            image_processor=SmolVLMImageProcessor(do_image_splitting=False, **sizes),
            video_processor=SmolVLMVideoProcessor(**sizes),
            tokenizer=tokenizer,
            image_seq_len=image_tokens(size, vision.patch_size, architecture.scale_factor),
            chat_template=self.chat_template,
        )

    # ------------------------------------------------------------------------------------------------- images
    def input_size(self, model_config, architecture: SmolVLMConfig) -> int:
        """S: ``model.image_size``, else the vision config's ``image_size``; the two must agree [D] (the
        processor's fixed ``image_seq_len`` is the token count of that size)."""
        vision = architecture.vision_config
        size = model_config.image_size or vision.image_size
        if size != vision.image_size:
            tokens = image_tokens(vision.image_size, vision.patch_size, architecture.scale_factor)
            raise ValueError(
                f"model.image_size={size}: SmolVLM takes pictures at its vision image_size "
                f"({vision.image_size}); its processor writes {tokens} <image> tokens per picture "
                f"for that size. Leave model.image_size unset or set it to {vision.image_size}"
            )
        _check_grid(size, vision.patch_size, architecture.scale_factor)
        return size

    def patch_grid(self, size: int, architecture: SmolVLMConfig) -> tuple[int, int]:
        """(S // p, S // p): the patch convolution drops the last S mod p rows and columns (384 px, patch 14:
        27×27 patches cover 378 px, as in SmolVLM2)."""
        side = size // architecture.vision_config.patch_size
        return side, side

    def process_images(self, processor, images: Sequence[Image.Image], size: int) -> dict[str, torch.Tensor]:
        """The processor's outputs for S×S copies of ``images``: one global S×S image each (no splitting, no
        resampling of the S×S picture), ``pixel_values`` (1, N, 3, S, S), ``pixel_attention_mask``
        (1, N, S, S) and ``rows``/``cols`` (0: not split) for ``replace_image_token``."""
        resized = [image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC) for image in images]
        kwargs = {
            **getattr(processor, "images_kwargs", {}),
            **self.image_kwargs,
            "size": {"longest_edge": size},
            "max_image_size": {"longest_edge": size},
        }
        return processor.image_processor(images=resized, return_tensors="pt", **kwargs)

    def per_image_pixels(self, processed: dict[str, torch.Tensor], count: int) -> torch.Tensor:
        pixels = processed["pixel_values"]  # (1, count, 3, S, S): the list of pictures is one sample's images
        if pixels.shape[:2] != (1, count):
            raise ValueError(
                f"{self.name}: the processor gave pixel values of shape {tuple(pixels.shape)} for "
                f"{count} images (expected one S×S image per picture: was it split into tiles?)"
            )
        return pixels[0]

    def pixel_inputs(self, pixels: torch.Tensor, one_image: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``pixel_values`` (B, K, 3, S, S) in text order, and the processor's ``pixel_attention_mask``
        (B, K, S, S): all ones, every picture fills its S×S frame. (The model skips an all-zero pixel tensor as
        a padding image; after SmolVLM's 0.5/0.5 normalisation of 8-bit pixels no picture is all zero.)"""
        mask = one_image["pixel_attention_mask"].reshape(1, 1, *pixels.shape[-2:])
        return {"pixel_values": pixels, "pixel_attention_mask": mask.expand(*pixels.shape[:2], -1, -1).clone()}

    # -------------------------------------------------------------------------------------------------- FAC
    def attention_hook(self, core: nn.Module) -> QueryKeyHook:
        attention = core.model.vision_model.encoder.layers[-1].self_attn
        return QueryKeyHook(attention, heads=attention.num_heads, scale=attention.scale)

    def attention_maps(self, captured: torch.Tensor, images: int, grid: tuple[int, int]) -> torch.Tensor:
        if captured.shape[0] != images:
            raise ValueError(f"the FAC hook saw {captured.shape[0]} images, expected {images}")
        if captured.shape[1] != grid[0] * grid[1]:
            raise ValueError(f"the FAC hook saw {captured.shape[1]} patches per image, expected {grid[0]}×{grid[1]}")
        return captured.reshape(images, *grid)  # the patches are in raster order (the patch conv, flattened)

    def encode_images(self, core: nn.Module, pixels: dict[str, torch.Tensor]) -> Any:
        return core.model.get_image_features(
            pixel_values=pixels["pixel_values"], pixel_attention_mask=pixels.get("pixel_attention_mask")
        )

    def vision_tower(self, core: nn.Module) -> nn.Module:
        return core.model.vision_model

    # ------------------------------------------------------------------------------------------------- parts
    def part_of(self, name: str) -> str:
        if name.startswith("model.connector"):
            return "projector"
        if name.startswith("model.vision_model"):
            return "vision"
        if name.startswith("model.text_model"):
            return "language_model"
        return name.split(".", 1)[0]


FAMILY = FAMILIES.register("smolvlm", SmolVLMFamily())
