"""The InternVL family (``davir.models.families.internvl``): its presets' grids and published sizes. What every
family does (the processor's own inputs, FAC against the eager attention of the patch queries with [CLS] left out, in
the layer the projector reads, LoRA, save and load) is tests/test_family_contract.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_cases import CAPTIONS  # noqa: E402

from davir.models.families import get_family  # noqa: E402
from davir.models.families.internvl import image_tokens  # noqa: E402


def test_the_presets_grids():
    """Image tokens per picture: tiny 8×8 patches → 16; 2b/8b (InternViT-300M) 448 px, patch 14 → 32×32 → 256, the
    processor's image_seq_length; S must be the vision image_size; the grid must be an even number of patches."""
    family = get_family("internvl")
    tokenizer = family.preset_tokenizer(CAPTIONS)
    shapes = {"2b": (1536, 28, 12, 2), "8b": (3584, 28, 28, 4)}
    for preset, size, grid, tokens in (
        ("tiny", 64, (8, 8), 16),
        ("2b", 448, (32, 32), 256),
        ("8b", 448, (32, 32), 256),
    ):
        architecture, processor = family.build_preset(preset, tokenizer, image_size=None, patch_size=None, overrides={})
        vision, text = architecture.vision_config, architecture.text_config
        assert family.input_size(SimpleNamespace(image_size=None), architecture) == size
        assert family.patch_grid(size, architecture) == grid
        assert (
            processor.image_seq_length
            == architecture.image_seq_length
            == tokens
            == image_tokens(size, vision.patch_size[0])
        )
        if preset in shapes:
            assert (
                vision.hidden_size,
                vision.num_hidden_layers,
                vision.num_attention_heads,
                vision.intermediate_size,
            ) == (1024, 24, 16, 4096)
            assert (
                text.hidden_size,
                text.num_hidden_layers,
                text.num_attention_heads,
                text.num_key_value_heads,
            ) == shapes[preset] and text.vocab_size == 151674
    with pytest.raises(ValueError, match="vision image_size"):
        family.input_size(SimpleNamespace(image_size=224), architecture)
    with pytest.raises(ValueError, match="2×2 patches"):
        family.build_preset("tiny", tokenizer, image_size=56, patch_size=None, overrides={})  # 7×7 patches
