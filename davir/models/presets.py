"""Registry of InstructBLIP architectures built from code (random weights).

``preset_registry[name](vocab_size=..., pad_token_id=..., bos_token_id=..., eos_token_id=..., **overrides)``
returns an ``InstructBlipConfig``, in the spirit of segment-anything's ``sam_model_registry``.

* ``tiny``: the InstructBLIP classes at toy size; learns on a CPU in minutes
  (``docs/experiments/demo_calibration.md``).
* ``vicuna7b``: the full InstructBLIP-Vicuna-7B architecture (EVA ViT-g/14, 32-query Q-Former,
  LLaMA-7B) for random-weight speed/memory benchmarks. Real weights come from a local folder
  (``DavirModelConfig.pretrained``), never from this preset.

Both take the token ids of the tokenizer the model will be used with: presets are built with the
offline word-level tokenizer (``davir.models.tokenizer``), whose ids are small and fit any vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import InstructBlipConfig, InstructBlipQFormerConfig, InstructBlipVisionConfig, LlamaConfig

# Vicuna-7B / InstructBLIP-Vicuna-7B numbers (HF Salesforce/instructblip-vicuna-7b, LAVIS blip2_vicuna_instruct).
VICUNA7B_TEXT_VOCAB = 32001  # LLaMA's 32000 + the [PAD] LAVIS adds
VICUNA7B_QFORMER_VOCAB = 30523  # BERT-base uncased + the [DEC] token


def _check_grid(image_size: int, patch_size: int) -> None:
    if image_size <= 0 or patch_size <= 0 or image_size % patch_size:
        raise ValueError(f"image_size ({image_size}) must be a positive multiple of patch_size ({patch_size})")


def tiny_config(
    *,
    vocab_size: int,
    pad_token_id: int,
    bos_token_id: int,
    eos_token_id: int,
    image_size: int | None = None,
    patch_size: int | None = None,
    vision_hidden: int = 128,
    vision_layers: int = 3,
    vision_heads: int = 4,
    vision_mlp: int = 512,
    qformer_hidden: int = 128,
    qformer_layers: int = 2,
    qformer_heads: int = 4,
    qformer_mlp: int = 512,
    cross_attention_frequency: int = 1,
    num_query_tokens: int = 16,
    text_hidden: int = 128,
    text_layers: int = 2,
    text_heads: int = 4,
    text_mlp: int = 512,
    max_positions: int = 512,
) -> InstructBlipConfig:
    """Toy InstructBLIP: ViT 128/3 layers/4 heads/patch 8 at 64 px, Q-Former 128/2 layers (cross-attention in
    every layer), 16 queries, LLaMA 128/2 layers/4 heads. About 2 M parameters with a ~30-word vocabulary.

    ``initializer_range=0.02`` for the ViT: the InstructBLIP vision default (1e-10) makes every weight ~0 and
    the attention exactly uniform, so FAC would have nothing to move.
    """
    image_size = 64 if image_size is None else image_size
    patch_size = 8 if patch_size is None else patch_size
    _check_grid(image_size, patch_size)
    vision = InstructBlipVisionConfig(
        hidden_size=vision_hidden,
        intermediate_size=vision_mlp,
        num_hidden_layers=vision_layers,
        num_attention_heads=vision_heads,
        image_size=image_size,
        patch_size=patch_size,
        initializer_range=0.02,
        qkv_bias=True,
    )
    qformer = InstructBlipQFormerConfig(
        vocab_size=vocab_size,
        hidden_size=qformer_hidden,
        num_hidden_layers=qformer_layers,
        num_attention_heads=qformer_heads,
        intermediate_size=qformer_mlp,
        cross_attention_frequency=cross_attention_frequency,
        encoder_hidden_size=vision_hidden,
        max_position_embeddings=max_positions,
        pad_token_id=pad_token_id,
    )
    text = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=text_hidden,
        intermediate_size=text_mlp,
        num_hidden_layers=text_layers,
        num_attention_heads=text_heads,
        max_position_embeddings=max_positions,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        tie_word_embeddings=False,
    )
    return InstructBlipConfig(
        vision_config=vision, qformer_config=qformer, text_config=text, num_query_tokens=num_query_tokens
    )


def vicuna7b_config(
    *,
    vocab_size: int,
    pad_token_id: int,
    bos_token_id: int,
    eos_token_id: int,
    image_size: int | None = None,
    patch_size: int | None = None,
) -> InstructBlipConfig:
    """InstructBLIP-Vicuna-7B: EVA ViT-g/14 (1408 wide, 39 layers, 16 heads, MLP 6144, 224 px → 16×16 patches),
    Q-Former (768 wide, 12 layers, cross-attention every 2nd layer, 32 queries), Vicuna-7B (LLaMA 4096 wide,
    32 layers, 32 heads, MLP 11008, vocab 32001). ``vocab_size`` only raises the vocabularies if the tokenizer
    is larger than Vicuna's.
    """
    image_size = 224 if image_size is None else image_size
    patch_size = 14 if patch_size is None else patch_size
    _check_grid(image_size, patch_size)
    vision = InstructBlipVisionConfig(
        hidden_size=1408,
        intermediate_size=6144,
        num_hidden_layers=39,
        num_attention_heads=16,
        image_size=image_size,
        patch_size=patch_size,
        layer_norm_eps=1e-6,
        initializer_range=0.02,
        qkv_bias=True,
    )
    qformer = InstructBlipQFormerConfig(
        vocab_size=max(VICUNA7B_QFORMER_VOCAB, vocab_size),
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        cross_attention_frequency=2,
        encoder_hidden_size=1408,
        max_position_embeddings=512,
        pad_token_id=pad_token_id,
    )
    text = LlamaConfig(
        vocab_size=max(VICUNA7B_TEXT_VOCAB, vocab_size),
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        tie_word_embeddings=False,
    )
    return InstructBlipConfig(vision_config=vision, qformer_config=qformer, text_config=text, num_query_tokens=32)


preset_registry: dict[str, Callable[..., InstructBlipConfig]] = {"tiny": tiny_config, "vicuna7b": vicuna7b_config}


def build_preset_config(name: str, **kwargs) -> InstructBlipConfig:
    """``preset_registry[name](**kwargs)`` with a clear error for an unknown name or override."""
    from davir.models.families.base import build_from_preset

    return build_from_preset(preset_registry, name, family="instructblip", **kwargs)
