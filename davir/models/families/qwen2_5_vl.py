"""Qwen2.5-VL: a window-attention ViT (2×2 patch merger) + Qwen2.5 LLM with multimodal RoPE.

* **Images.** The processor's own ``Qwen2VLImageProcessor`` on each picture resized to S×S (S a multiple of
  patch × merge, 448 by default: 32×32 patches → 256 image tokens) [D]: Qwen2.5-VL's dynamic resolution
  would give every pair its own grid and sequence length; one grid per run keeps FAC's map and the change
  masks on one grid and the batches rectangular. ``image_grid_thw`` is then the same (1, S/p, S/p) for every
  image. Both images sit in one user turn, ``<|vision_start|><|image_pad|>…<|vision_end|>`` each, before first.
* **FAC** [D]: the ViT has no [CLS] token, and its blocks mix window attention with a few full-attention
  blocks (7, 15, 23, 31 of 32 in the 7B). FAC supervises the *mean attention each patch receives* — over all
  heads and all query patches of the same image — in the **last full-attention block** (the last block in
  the released models): with no [CLS] row, this is the ViT's own summary of where it looks, and only a
  full-attention block relates every patch of the picture to every other. The hook recomputes it from that
  block's qkv output and rotary embeddings, so SDPA/flash stay in place (tests: equal to eager attention).
  The tokens reach the block in window order; the map is put back in raster order.
* **Speed.** With ``attn_implementation: sdpa`` the ViT's windows go through SDPA a few at a time
  (``davir.models.vlm.window_attention``) instead of transformers' one call per window.
* **LoRA**: the ViT's fused ``qkv`` (``vision_rank``), the merger MLP (``qformer_rank``), the LLM attention
  projections (``llm_rank``).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessor,
    Qwen2VLVideoProcessor,
)
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision
from transformers.vision_utils import get_vision_window_index

from davir.models.families import FAMILIES
from davir.models.families.base import ChatFamily
from davir.models.families.qwen_patches import PackedPatchImages
from davir.models.vlm.received_attention import PackedQkvHook
from davir.models.vlm.window_attention import use_packed_window_attention

QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _check_grid(image_size: int, patch_size: int, merge: int) -> None:
    if image_size <= 0 or patch_size <= 0 or image_size % (patch_size * merge):
        raise ValueError(
            f"image_size ({image_size}) must be a positive multiple of patch_size × merge ({patch_size} × {merge})"
        )


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
    max_positions: int = 512,
) -> Qwen2_5_VLConfig:
    """Toy Qwen2.5-VL: ViT 128/3 blocks/patch 8 at 64 px (8×8 patches → 16 tokens after the 2×2 merger;
    windows of 4×4 patches, the last block full attention), Qwen2 LLM 128/2 layers/4 heads (2 KV)."""
    image_size = 64 if image_size is None else image_size
    patch_size = 8 if patch_size is None else patch_size
    _check_grid(image_size, patch_size, 2)
    head_dim = text_hidden // text_heads
    quarter = head_dim // 2 // 4  # M-RoPE sections (temporal, height, width) over head_dim / 2 frequencies
    return _config(
        tokenizer,
        vision=dict(
            depth=vision_layers,
            hidden_size=vision_hidden,
            intermediate_size=vision_mlp,
            num_heads=vision_heads,
            patch_size=patch_size,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=patch_size * 2 * 2,
            out_hidden_size=text_hidden,
            fullatt_block_indexes=[vision_layers - 1],
        ),
        text=dict(
            hidden_size=text_hidden,
            intermediate_size=text_mlp,
            num_hidden_layers=text_layers,
            num_attention_heads=text_heads,
            num_key_value_heads=text_kv_heads,
            max_position_embeddings=max_positions,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [
                    head_dim // 2 - 2 * (quarter + quarter // 2),
                    quarter + quarter // 2,
                    quarter + quarter // 2,
                ],
            },
        ),
    )


def qwen7b_config(*, tokenizer, image_size: int | None = None, patch_size: int | None = None) -> Qwen2_5_VLConfig:
    """Qwen2.5-VL-7B-Instruct: ViT 1280 wide, 32 blocks (full attention in 7/15/23/31), 16 heads, patch 14,
    window 112; Qwen2.5-7B LLM (3584 wide, 28 layers, 28 heads / 4 KV, MLP 18944, vocab 152064)."""
    patch_size = 14 if patch_size is None else patch_size
    _check_grid(448 if image_size is None else image_size, patch_size, 2)
    return _config(
        tokenizer,
        vocab=152064,
        vision=dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            patch_size=patch_size,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            out_hidden_size=3584,
            fullatt_block_indexes=[7, 15, 23, 31],
        ),
        text=dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        ),
    )


def _config(tokenizer, *, vision: dict, text: dict, vocab: int = 0) -> Qwen2_5_VLConfig:
    ids = {
        name: tokenizer.convert_tokens_to_ids(token)
        for name, token in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return Qwen2_5_VLConfig(
        vision_config=vision,
        text_config=dict(
            vocab_size=max(vocab, len(tokenizer)),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=end,
            tie_word_embeddings=False,
            **text,
        ),
        tie_word_embeddings=False,
        **ids,
    )


@functools.lru_cache(maxsize=16)
def raster_order(grid: tuple[int, int], merge: int, window: int, patch: int) -> torch.Tensor:
    """For each raster patch (row-major), its position in a ViT block's token order: the processor lists the
    patches by 2×2 merge unit, and Qwen2.5-VL's ViT permutes the merge units into window order."""
    height, width = grid
    window_index, _ = get_vision_window_index(
        torch.tensor([[1, height, width]]), spatial_merge_size=merge, window_size=window, patch_size=patch
    )
    unit = merge * merge
    # processor order: merge unit u = (row // m) · (W / m) + col // m, then (row % m) · m + col % m
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    processor_index = (
        ((rows // merge) * (width // merge) + cols // merge) * unit + (rows % merge) * merge + cols % merge
    ).reshape(-1)
    # block order position of processor token t: where its merge unit sits in window_index
    unit_position = torch.argsort(window_index)
    return unit_position[processor_index // unit] * unit + processor_index % unit


class Qwen25VLFamily(PackedPatchImages, ChatFamily):
    name = "qwen2_5_vl"
    model_type = "qwen2_5_vl"
    model_class = Qwen2_5_VLForConditionalGeneration
    processor_class = Qwen2_5_VLProcessor
    config_class = Qwen2_5_VLConfig
    presets = {"tiny": tiny_config, "7b": qwen7b_config}
    preset_image_sizes = {"tiny": 64, "7b": 448}
    pretrained_image_size = 448
    check_grid = staticmethod(_check_grid)
    special_tokens = (
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    )
    chat_template = QWEN_CHAT_TEMPLATE
    end_of_turn = "<|im_end|>"
    vision_lora_pattern = r"model\.visual\.blocks\.\d+\.attn\.qkv"
    projector_lora_pattern = r"model\.visual\.merger\.mlp\.[02]"
    llm_lora_pattern = r"model\.language_model\.layers\.\d+\.self_attn\.(?:{targets})"
    trainable_parts = {"projector": "model.visual.merger"}
    fac_reads = (
        "mean attention each patch receives in the last full-attention ViT block [D] "
        "(no [CLS]; window blocks see only their window)"
    )

    def prepare_core(self, core: nn.Module, config) -> nn.Module:
        if config.attn_implementation == "sdpa":  # eager stays eager: the tests' reference
            use_packed_window_attention(core.model.visual)
        return core

    def preset_processor(self, tokenizer, architecture: Qwen2_5_VLConfig) -> Qwen2_5_VLProcessor:
        vision = architecture.vision_config
        sizes = dict(
            patch_size=vision.patch_size,
            merge_size=vision.spatial_merge_size,
            temporal_patch_size=vision.temporal_patch_size,
        )
        return Qwen2_5_VLProcessor(
            image_processor=Qwen2VLImageProcessor(**sizes),
            tokenizer=tokenizer,
            video_processor=Qwen2VLVideoProcessor(**sizes),
            chat_template=self.chat_template,
        )

    def attention_hook(self, core: nn.Module) -> PackedQkvHook:
        visual = core.model.visual
        block = max(visual.fullatt_block_indexes) if visual.fullatt_block_indexes else len(visual.blocks) - 1
        vision = core.config.vision_config
        geometry = (vision.spatial_merge_size, vision.window_size, vision.patch_size)
        return PackedQkvHook(visual.blocks[block].attn, apply_rotary_pos_emb_vision, geometry)

    def attention_maps(
        self, captured: tuple[torch.Tensor, tuple[int, int, int]], images: int, grid: tuple[int, int]
    ) -> torch.Tensor:
        received, geometry = captured
        if received.shape[0] != images:
            raise ValueError(f"the FAC hook saw {received.shape[0]} images, expected {images}")
        order = raster_order(grid, *geometry).to(received.device)
        return received[:, order].reshape(images, *grid)

    def part_of(self, name: str) -> str:
        if name.startswith("model.visual.merger"):
            return "projector"
        if name.startswith("model.visual"):
            return "vision"
        if name.startswith("model.language_model"):
            return "language_model"
        return name.split(".", 1)[0]


FAMILY = FAMILIES.register("qwen2_5_vl", Qwen25VLFamily())
