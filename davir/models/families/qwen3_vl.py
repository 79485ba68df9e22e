"""Qwen3-VL: a full-attention ViT with DeepStack mergers (2×2 patch merger) + Qwen3 LLM with interleaved M-RoPE.

* **Images.** The processor's ``Qwen2VLImageProcessor`` (Qwen3-VL's: patch 16, merge 2, mean/std 0.5) on each
  picture resized to S×S (S a multiple of patch × merge = 32, 448 by default: 28×28 patches → 196 image
  tokens) [D]: Qwen3-VL's dynamic resolution would give every pair its own grid and sequence length; one grid
  per run keeps FAC's map and the change masks on one grid and the batches rectangular. The image processor
  runs with ``size`` = 256 … 4096² pixels (``image_kwargs``), so an S×S picture is never rescaled (the
  released folders' minimum, 256² pixels, would upscale a picture below 256 px to another grid).
  ``image_grid_thw`` is then (1, S/p, S/p) for every image. Both images sit in one user turn,
  ``<|vision_start|><|image_pad|>…<|vision_end|>`` each, before first (the released template's layout).
* **FAC** [D]: the ViT has no [CLS] token. Every block attends over the whole picture (no windows, unlike
  Qwen2.5-VL). Besides the merger on the last block, DeepStack mergers read blocks 5/11/17 (2B) or 8/16/24
  (8B) and add their tokens to the first LLM layers' hidden states. FAC supervises the *mean attention each
  patch receives* — over all heads and all query patches of the same image — in the **last block**: the one
  the main merger reads (the LLM's image tokens), the deepest and the one the DeepStack layers lead into; a
  DeepStack block would supervise a mid-level feature only the residual stream of the first LLM layers sees.
  The hook recomputes it from the block's ``qkv`` output and its rotary embeddings, so SDPA/flash stay in place
  (tests: equal to eager attention). The tokens reach the ViT by 2×2 merge unit (the processor's order, no
  further permutation); the map is put back in raster order.
* **LoRA**: the ViT's fused ``qkv`` (``vision_rank``), the merger and DeepStack merger MLPs (``qformer_rank``),
  the LLM attention projections (``llm_rank``). ``extra_trainable``: ``projector`` (the merger),
  ``deepstack_projectors`` (the DeepStack mergers).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers import (
    Qwen2VLImageProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)
from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

from davir.config import ConfigError
from davir.models.families import FAMILIES
from davir.models.families.base import ChatFamily
from davir.models.families.qwen_patches import PackedPatchImages
from davir.models.vlm.received_attention import PackedQkvHook

# The layout of the released Qwen3-VL template (no default system turn): <|im_start|>user\n<|vision_start|>
# <|image_pad|><|vision_end|>…text<|im_end|>\n<|im_start|>assistant\n
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Pixels of a picture the image processor keeps as it is: 16² … 4096² (the released maximum).
MIN_PIXELS, MAX_PIXELS = 16 * 16, 4096 * 4096


def _check_grid(image_size: int, patch_size: int, merge: int) -> None:
    # A ConfigError (a ValueError): train.py says it in one line, exit 2, instead of a traceback.
    if image_size <= 0 or patch_size <= 0 or image_size % (patch_size * merge):
        raise ConfigError(
            f"model.image_size={image_size}: qwen3_vl takes a positive multiple of patch_size × merge "
            f"({patch_size} × {merge} = {patch_size * merge} px)"
        )
    if not MIN_PIXELS <= image_size * image_size <= MAX_PIXELS:
        raise ConfigError(
            f"model.image_size={image_size}: qwen3_vl takes {int(MIN_PIXELS**0.5)} to {int(MAX_PIXELS**0.5)} px"
        )


def _mrope_section(head_dim: int) -> list[int]:
    """(temporal, height, width) frequencies of the interleaved M-RoPE: the released [24, 20, 20] of 64, scaled."""
    half = head_dim // 2
    spatial = half * 20 // 64
    return [half - 2 * spatial, spatial, spatial]


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
) -> Qwen3VLConfig:
    """Toy Qwen3-VL: ViT 128/3 blocks/patch 8 at 64 px (8×8 patches → 16 tokens after the 2×2 merger; DeepStack
    mergers on the blocks before the last, at most 3), Qwen3 LLM 128/2 layers/4 heads (2 KV)."""
    image_size = 64 if image_size is None else image_size
    patch_size = 8 if patch_size is None else patch_size
    _check_grid(image_size, patch_size, 2)
    head_dim = text_hidden // text_heads
    return _config(
        tokenizer,
        tie=False,
        vision=dict(
            depth=vision_layers,
            hidden_size=vision_hidden,
            intermediate_size=vision_mlp,
            num_heads=vision_heads,
            patch_size=patch_size,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=text_hidden,
            num_position_embeddings=(image_size // patch_size) ** 2,
            deepstack_visual_indexes=list(range(min(3, vision_layers - 1))),
        ),
        text=dict(
            hidden_size=text_hidden,
            intermediate_size=text_mlp,
            num_hidden_layers=text_layers,
            num_attention_heads=text_heads,
            num_key_value_heads=text_kv_heads,
            head_dim=head_dim,
            max_position_embeddings=max_positions,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": _mrope_section(head_dim),
                "mrope_interleaved": True,
            },
        ),
    )


# The published config.json of Qwen/Qwen3-VL-2B-Instruct and Qwen/Qwen3-VL-8B-Instruct (both: patch 16, merge 2,
# temporal patch 2, 2304 position embeddings = a 48×48 grid, vocab 151936, LLM head_dim 128, 8 KV heads,
# RMSNorm eps 1e-6, rope_theta 5e6, interleaved M-RoPE [24, 20, 20], 262144 positions).
RELEASED = {
    "2b": dict(
        vision=dict(
            depth=24,
            hidden_size=1024,
            intermediate_size=4096,
            num_heads=16,
            out_hidden_size=2048,
            deepstack_visual_indexes=[5, 11, 17],
        ),
        text=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16),
        tie=True,
    ),
    "8b": dict(
        vision=dict(
            depth=27,
            hidden_size=1152,
            intermediate_size=4304,
            num_heads=16,
            out_hidden_size=4096,
            deepstack_visual_indexes=[8, 16, 24],
        ),
        text=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32),
        tie=False,
    ),
}


def _released_config(size: str, *, tokenizer, image_size: int | None, patch_size: int | None) -> Qwen3VLConfig:
    patch_size = 16 if patch_size is None else patch_size
    _check_grid(448 if image_size is None else image_size, patch_size, 2)
    released = RELEASED[size]
    return _config(
        tokenizer,
        vocab=151936,
        tie=released["tie"],
        vision=dict(
            patch_size=patch_size,
            spatial_merge_size=2,
            temporal_patch_size=2,
            num_position_embeddings=2304,
            hidden_act="gelu_pytorch_tanh",
            **released["vision"],
        ),
        text=dict(
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=262144,
            rms_norm_eps=1e-6,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
            **released["text"],
        ),
    )


def qwen3_2b_config(*, tokenizer, image_size: int | None = None, patch_size: int | None = None) -> Qwen3VLConfig:
    """Qwen3-VL-2B-Instruct: ViT 1024 wide, 24 blocks, 16 heads, MLP 4096, DeepStack 5/11/17; Qwen3-1.7B-class
    LLM 2048 wide, 28 layers, 16 heads / 8 KV, MLP 6144, tied embeddings."""
    return _released_config("2b", tokenizer=tokenizer, image_size=image_size, patch_size=patch_size)


def qwen3_8b_config(*, tokenizer, image_size: int | None = None, patch_size: int | None = None) -> Qwen3VLConfig:
    """Qwen3-VL-8B-Instruct: ViT 1152 wide, 27 blocks, 16 heads, MLP 4304, DeepStack 8/16/24; LLM 4096 wide,
    36 layers, 32 heads / 8 KV, MLP 12288."""
    return _released_config("8b", tokenizer=tokenizer, image_size=image_size, patch_size=patch_size)


def _config(tokenizer, *, vision: dict, text: dict, tie: bool, vocab: int = 0) -> Qwen3VLConfig:
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
    return Qwen3VLConfig(
        vision_config=vision,
        text_config=dict(
            vocab_size=max(vocab, len(tokenizer)),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=end,
            tie_word_embeddings=tie,
            **text,
        ),
        tie_word_embeddings=tie,
        **ids,
    )


@functools.lru_cache(maxsize=16)
def raster_order(grid: tuple[int, int], merge: int) -> torch.Tensor:
    """For each raster patch (row-major), its position in the ViT's token order: the processor lists the patches
    by merge × merge unit (units row by row, the patches of a unit row by row), and the ViT keeps that order."""
    height, width = grid
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    return (
        ((rows // merge) * (width // merge) + cols // merge) * merge * merge + (rows % merge) * merge + cols % merge
    ).reshape(-1)


class Qwen3VLFamily(PackedPatchImages, ChatFamily):
    name = "qwen3_vl"
    model_type = "qwen3_vl"
    model_class = Qwen3VLForConditionalGeneration
    processor_class = Qwen3VLProcessor
    config_class = Qwen3VLConfig
    presets = {"tiny": tiny_config, "2b": qwen3_2b_config, "8b": qwen3_8b_config}
    preset_image_sizes = {"tiny": 64, "2b": 448, "8b": 448}
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
    chat_template = QWEN3_CHAT_TEMPLATE
    end_of_turn = "<|im_end|>"
    vision_lora_pattern = r"model\.visual\.blocks\.\d+\.attn\.qkv"
    projector_lora_pattern = r"model\.visual\.(?:merger|deepstack_merger_list\.\d+)\.linear_fc[12]"
    llm_lora_pattern = r"model\.language_model\.layers\.\d+\.self_attn\.(?:{targets})"
    trainable_parts = {"projector": "model.visual.merger", "deepstack_projectors": "model.visual.deepstack_merger_list"}
    # S×S stays S×S (a released folder's 256² minimum would upscale smaller pictures to another grid) [D].
    image_kwargs = {"size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}}
    fac_reads = (
        "mean attention each patch receives in the last ViT block [D] (no [CLS]; the block the merger "
        "reads, after the DeepStack blocks)"
    )

    def preset_processor(self, tokenizer, architecture: Qwen3VLConfig) -> Qwen3VLProcessor:
        vision = architecture.vision_config
        sizes = dict(
            patch_size=vision.patch_size,
            merge_size=vision.spatial_merge_size,
            temporal_patch_size=vision.temporal_patch_size,
        )
        half = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])  # the released processor's
        return Qwen3VLProcessor(
            image_processor=Qwen2VLImageProcessor(**sizes, **half, size=dict(self.image_kwargs["size"])),
            tokenizer=tokenizer,
            video_processor=Qwen3VLVideoProcessor(**sizes, **half),
            chat_template=self.chat_template,
        )

    def attention_hook(self, core: nn.Module) -> PackedQkvHook:
        visual = core.model.visual
        return PackedQkvHook(visual.blocks[-1].attn, apply_rotary_pos_emb_vision, visual.spatial_merge_size)

    def attention_maps(self, captured: tuple[torch.Tensor, int], images: int, grid: tuple[int, int]) -> torch.Tensor:
        received, merge = captured
        if received.shape[0] != images:
            raise ValueError(f"the FAC hook saw {received.shape[0]} images, expected {images}")
        if received.shape[1] != grid[0] * grid[1]:
            raise ValueError(f"the FAC hook saw {received.shape[1]} patches per image, expected {grid[0]}×{grid[1]}")
        return received[:, raster_order(grid, merge).to(received.device)].reshape(images, *grid)

    def part_of(self, name: str) -> str:
        if name.startswith(("model.visual.merger", "model.visual.deepstack_merger_list")):
            return "projector"
        if name.startswith("model.visual"):
            return "vision"
        if name.startswith("model.language_model"):
            return "language_model"
        return name.split(".", 1)[0]


FAMILY = FAMILIES.register("qwen3_vl", Qwen3VLFamily())
