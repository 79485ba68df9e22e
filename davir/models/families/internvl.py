"""InternVL3 (the HF-native format): an InternViT vision tower, a 2×2 pixel shuffle + MLP projector, Qwen2 LLM.

* **Images.** InternVL's processor (``GotOcr2ImageProcessor``) tiles a picture dynamically
  (``crop_to_patches``: up to 12 S×S tiles chosen by aspect ratio, plus a thumbnail), so the number of tiles,
  and of ``<IMG_CONTEXT>`` tokens, follows each picture's shape. One grid per run [D]: every picture is resized
  to S×S, S the vision config's ``image_size`` (64 ``tiny``, 448 in the released models), and the processor runs
  with ``crop_to_patches=False`` — one tile per picture (for an S×S picture the tiler would add nothing new
  either: one tile is the whole picture). Each tile is (S / p)² patches; the projector's pixel shuffle
  (``downsample_ratio`` 0.5) folds 2×2 patches into one token → (S / p)² / 4 tokens (``tiny``: 8×8 → 16;
  released: 32×32 → 256, the processor's ``image_seq_length``), written ``<img><IMG_CONTEXT>…</img>``. S must be
  the vision ``image_size``: the processor writes a fixed ``image_seq_length`` per tile. Both pictures sit in
  one user turn, before first: ``<|im_start|>user\\n<img>…</img>\\n<img>…</img>\\nprompt<|im_end|>\\n
  <|im_start|>assistant\\n`` (the released chat template).
* **FAC** [D]: InternViT has a [CLS] token, but the projector drops it (``vision_feature_select_strategy``
  ``"default"``: features ``[:, 1:]``), so in the layer the projector reads the [CLS] row shapes nothing the LLM
  sees. FAC therefore supervises, as for the chat families without [CLS], the *mean attention each patch
  receives* from the **patch queries** — over all heads, in the layer the projector reads
  (``vision_feature_layer``, -1 = the last) — renormalised over the patches (the share the patches give the
  [CLS] key is left out): ``a_k ∝ 1/(H·T) Σ_h Σ_q softmax(q_q·k·scale)_k`` for patches q, k. The hook
  recomputes it from the layer's ``q_norm``/``k_norm`` outputs (after ``q_proj``/``k_proj``, LoRA included;
  identities unless ``use_qk_norm``), so SDPA/flash stay in place (tests: equal to eager attention).
* **LoRA**: InternViT attention ``q_proj``/``k_proj``/``v_proj`` (``vision_rank``), the projector's two linears
  (``qformer_rank``), the LLM attention projections (``llm_rank``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from torch import nn
from transformers import (
    GotOcr2ImageProcessor,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    InternVLVideoProcessor,
)

from davir.models.families import FAMILIES
from davir.models.families.base import ChatFamily, fac_layer_index
from davir.models.vlm.received_attention import QueryKeyHook, received_attention

# The released InternVL3-*-hf chat template (transformers' convert_internvl_weights_to_hf.py): one <IMG_CONTEXT>
# per image, which the processor expands to <img><IMG_CONTEXT>×N</img>.
INTERNVL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)
# The named tokens InternVLProcessor reads from its tokenizer (the released tokenizer_config.json's).
IMAGE_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # the released image processor's
REAL_IMAGE_TOKEN_ID, REAL_VOCAB = 151667, 151674  # <IMG_CONTEXT> and the LLM vocabulary of InternVL3-2B/8B


def _side(size) -> int:
    return size[0] if isinstance(size, (list, tuple)) else size


def _check_grid(image_size: int, patch_size: int) -> None:
    side = image_size // patch_size if patch_size > 0 else 0
    if side <= 0 or image_size % patch_size or side % 2:
        raise ValueError(
            f"image_size ({image_size}) must be an even number of patch_size ({patch_size}) patches: "
            "the projector's pixel shuffle folds 2×2 patches into one token"
        )


def image_tokens(image_size: int, patch_size: int, downsample_ratio: float = 0.5) -> int:
    """``<IMG_CONTEXT>`` tokens of one S×S tile: (S / p)² patches, (1 / ratio)² of them per token."""
    return (image_size // patch_size) ** 2 // round(1 / downsample_ratio) ** 2


def tiny_config(
    *,
    tokenizer,
    image_size: int | None = None,
    patch_size: int | None = None,
    vision_hidden: int = 128,
    vision_layers: int = 3,
    vision_heads: int = 4,
    vision_mlp: int = 512,
    text_hidden: int = 128,
    text_layers: int = 2,
    text_heads: int = 4,
    text_kv_heads: int = 2,
    text_mlp: int = 512,
    max_positions: int = 512,
    vision_feature_layer: int = -1,
) -> InternVLConfig:
    """Toy InternVL3: InternViT 128 wide, 3 layers, 4 heads, patch 8 at 64 px (8×8 patches → 16 tokens after the
    2×2 pixel shuffle), Qwen2 LLM 128 wide, 2 layers, 4 heads (2 KV), MLP 512."""
    image_size = 64 if image_size is None else image_size
    patch_size = 8 if patch_size is None else patch_size
    _check_grid(image_size, patch_size)
    return _config(
        tokenizer,
        vision_feature_layer=vision_feature_layer,
        vision=dict(
            hidden_size=vision_hidden,
            intermediate_size=vision_mlp,
            num_hidden_layers=vision_layers,
            num_attention_heads=vision_heads,
            image_size=image_size,
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


# InternViT-300M-448px-V2.5, the vision tower of InternVL3-2B and -8B (config.json vision_config): 1024 wide,
# 24 layers, 16 heads, MLP 4096, patch 14 at 448 px, qkv bias, no qk-norm, LayerNorm eps 1e-6, layer scale 0.1;
# downsample_ratio 0.5, vision_select_layer -1, projector GELU, image token 151667, image_seq_length 256.
def _internvit_300m(image_size: int | None, patch_size: int | None) -> dict:
    image_size = 448 if image_size is None else image_size
    patch_size = 14 if patch_size is None else patch_size
    _check_grid(image_size, patch_size)
    return dict(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        image_size=image_size,
        patch_size=patch_size,
        attention_bias=True,
        use_qk_norm=False,
        norm_type="layer_norm",
        layer_norm_eps=1e-6,
        layer_scale_init_value=0.1,
    )


def internvl3_2b_config(*, tokenizer, image_size: int | None = None, patch_size: int | None = None) -> InternVLConfig:
    """InternVL3-2B (OpenGVLab/InternVL3-2B-hf): InternViT-300M + Qwen2.5-1.5B (1536 wide, 28 layers, 12 heads /
    2 KV, MLP 8960, RoPE θ 1e6, RMSNorm eps 1e-6, 32768 positions, vocab 151674). Untied LM head as every preset
    here (not confirmed for the release; a real folder brings its own config.json, which overrides every number)."""
    return _config(
        tokenizer,
        vocab=REAL_VOCAB,
        vision_feature_layer=-1,
        vision=_internvit_300m(image_size, patch_size),
        text=dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    )


def internvl3_8b_config(*, tokenizer, image_size: int | None = None, patch_size: int | None = None) -> InternVLConfig:
    """InternVL3-8B (OpenGVLab/InternVL3-8B-hf): InternViT-300M + Qwen2.5-7B (3584 wide, 28 layers, 28 heads /
    4 KV, MLP 18944, RoPE θ 1e6, RMSNorm eps 1e-6, 32768 positions, vocab 151674)."""
    return _config(
        tokenizer,
        vocab=REAL_VOCAB,
        vision_feature_layer=-1,
        vision=_internvit_300m(image_size, patch_size),
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


def _config(tokenizer, *, vision: dict, text: dict, vision_feature_layer: int, vocab: int = 0) -> InternVLConfig:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    side = vision["image_size"] // vision["patch_size"]
    return InternVLConfig(
        vision_config=vision,
        text_config=dict(
            model_type="qwen2",
            vocab_size=max(vocab, len(tokenizer)),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=end,
            tie_word_embeddings=False,
            **text,
        ),
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=side * side // 4,
        downsample_ratio=0.5,
        vision_feature_layer=vision_feature_layer,
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
    )


class PatchQueryHook(QueryKeyHook):
    """Received attention of the patch queries over the patch keys of a ViT with a leading [CLS] token: softmax
    over all keys (as the layer computes it), the [CLS] query and key column dropped, renormalised over the
    patches. Hooks the layer's ``q_norm``/``k_norm`` (identities unless ``use_qk_norm``): their outputs are the
    queries and keys the attention uses."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__(attention, heads=attention.num_heads, scale=attention.scale)
        self.query_projection, self.key_projection = attention.q_norm, attention.k_norm

    def _with_key(self, module, inputs, output: torch.Tensor) -> None:
        if self._query is None:
            raise RuntimeError("the FAC hook saw the key projection run before the query projection")
        received = received_attention(self._split(self._query)[..., 1:, :], self._split(output), self.scale)[..., 1:]
        self._latest = received / received.sum(dim=-1, keepdim=True)
        self._query = None


class InternVLFamily(ChatFamily):
    name = "internvl"
    model_type = "internvl"
    model_class = InternVLForConditionalGeneration
    processor_class = InternVLProcessor
    config_class = InternVLConfig
    presets = {"tiny": tiny_config, "2b": internvl3_2b_config, "8b": internvl3_8b_config}
    special_tokens = ("<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>")
    chat_template = INTERNVL_CHAT_TEMPLATE
    end_of_turn = "<|im_end|>"
    vision_lora_pattern = r"model\.vision_tower\.encoder\.layer\.\d+\.attention\.(?:q_proj|k_proj|v_proj)"
    projector_lora_pattern = r"model\.multi_modal_projector\.linear_[12]"
    llm_lora_pattern = r"model\.language_model\.layers\.\d+\.self_attn\.(?:{targets})"
    trainable_parts = {"projector": "model.multi_modal_projector"}
    image_kwargs = {"crop_to_patches": False}  # one S×S tile per picture [D]
    fac_reads = (
        "mean attention each patch receives from the patch queries in the InternViT layer the projector "
        "reads (vision_feature_layer, the last) [D] (the [CLS] token, which the projector drops, left out)"
    )

    # ------------------------------------------------------------------------------------------------ presets
    def preset_processor(self, tokenizer, architecture: InternVLConfig) -> InternVLProcessor:
        vision = architecture.vision_config
        size = {"height": _side(vision.image_size), "width": _side(vision.image_size)}
        # The processor reads its image tokens from the tokenizer by name, as from the released tokenizer_config.
        tokenizer._set_model_specific_special_tokens(IMAGE_TOKENS)
        normalise = dict(image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)
        return InternVLProcessor(
            image_processor=GotOcr2ImageProcessor(size=size, crop_to_patches=False, **normalise),
            video_processor=InternVLVideoProcessor(size=size, **normalise),
            tokenizer=tokenizer,
            image_seq_length=architecture.image_seq_length,
            chat_template=self.chat_template,
        )

    # ------------------------------------------------------------------------------------------------- images
    def input_size(self, model_config, architecture: InternVLConfig) -> int:
        """S: ``model.image_size``, else the vision ``image_size``; the two must agree [D] (the processor writes
        ``image_seq_length`` tokens per tile, the count of that size)."""
        vision = architecture.vision_config
        native, patch = _side(vision.image_size), _side(vision.patch_size)
        size = model_config.image_size or native
        if size != native:
            raise ValueError(
                f"model.image_size={size}: InternVL takes pictures at its vision image_size ({native}); "
                f"its processor writes {architecture.image_seq_length} <IMG_CONTEXT> tokens per tile for "
                f"that size. Leave model.image_size unset or set it to {native}"
            )
        _check_grid(size, patch)
        return size

    def patch_grid(self, size: int, architecture: InternVLConfig) -> tuple[int, int]:
        side = size // _side(architecture.vision_config.patch_size)
        return side, side

    def process_images(self, processor, images: Sequence[Image.Image], size: int) -> dict[str, torch.Tensor]:
        """One S×S tile per picture: ``pixel_values`` (N, 3, S, S), ``num_patches`` all 1."""
        resized = [image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC) for image in images]
        kwargs = {
            **getattr(processor, "images_kwargs", {}),
            **self.image_kwargs,
            "size": {"height": size, "width": size},
        }
        return processor.image_processor(images=resized, return_tensors="pt", **kwargs)

    def per_image_pixels(self, processed: dict[str, torch.Tensor], count: int) -> torch.Tensor:
        pixels, tiles = processed["pixel_values"], list(processed["num_patches"])
        if pixels.shape[0] != count or any(int(n) != 1 for n in tiles):
            raise ValueError(
                f"{self.name}: the processor gave {pixels.shape[0]} tiles ({tiles} per image) for "
                f"{count} images of one tile each (was crop_to_patches on?)"
            )
        return pixels

    def pixel_inputs(self, pixels: torch.Tensor, one_image: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``pixel_values`` (B·K, 3, S, S): one tile per picture, row by row, in text order."""
        return {"pixel_values": pixels.reshape(-1, *pixels.shape[2:])}

    # -------------------------------------------------------------------------------------------------- FAC
    def fac_attention(self, core: nn.Module) -> nn.Module:
        """The attention module of the InternViT layer the projector reads (``vision_feature_layer``)."""
        return core.model.vision_tower.encoder.layer[fac_layer_index(core.config)].attention

    def attention_hook(self, core: nn.Module) -> PatchQueryHook:
        return PatchQueryHook(self.fac_attention(core))

    def attention_maps(self, captured: torch.Tensor, images: int, grid: tuple[int, int]) -> torch.Tensor:
        if captured.shape[0] != images:
            raise ValueError(f"the FAC hook saw {captured.shape[0]} tiles, expected {images} (one per image)")
        if captured.shape[1] != grid[0] * grid[1]:
            raise ValueError(f"the FAC hook saw {captured.shape[1]} patches per tile, expected {grid[0]}×{grid[1]}")
        return captured.reshape(images, *grid)  # the patch convolution's raster order

    def encode_images(self, core: nn.Module, pixels: dict[str, torch.Tensor]) -> Any:
        return core.model.get_image_features(pixel_values=pixels["pixel_values"])

    def vision_tower(self, core: nn.Module) -> nn.Module:
        return core.model.vision_tower

    # ------------------------------------------------------------------------------------------------- parts
    def part_of(self, name: str) -> str:
        if name.startswith("model.multi_modal_projector"):
            return "projector"
        if name.startswith("model.vision_tower"):
            return "vision"
        if name.startswith("model.language_model"):
            return "language_model"
        return name.split(".", 1)[0]


FAMILY = FAMILIES.register("internvl", InternVLFamily())
