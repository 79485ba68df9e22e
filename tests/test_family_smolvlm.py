"""The SmolVLM family (``davir.models.families.smolvlm``): its presets' grids and published sizes. What every family
does (the processor's own inputs, FAC against eager attention, LoRA, save and load) is tests/test_family_contract.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_cases import CAPTIONS  # noqa: E402

from davir.models.families import get_family  # noqa: E402
from davir.models.families.smolvlm import image_tokens  # noqa: E402


def test_the_presets_grids():
    """Image tokens per picture: tiny 8×8 patches → 16; 2b (SmolVLM2-2.2B) 384 px, patch 14 → 27×27 → 81, the
    processor's image_seq_len; S must be the vision image_size (the processor's token count is for it)."""
    family = get_family("smolvlm")
    tokenizer = family.preset_tokenizer(CAPTIONS)
    for preset, size, grid, tokens in (("tiny", 64, (8, 8), 16), ("2b", 384, (27, 27), 81)):
        architecture, processor = family.build_preset(preset, tokenizer, image_size=None, patch_size=None, overrides={})
        vision = architecture.vision_config
        assert family.input_size(SimpleNamespace(image_size=None), architecture) == size
        assert family.patch_grid(size, architecture) == grid
        assert processor.image_seq_len == tokens == image_tokens(size, vision.patch_size, architecture.scale_factor)
    assert (
        vision.hidden_size,
        vision.num_hidden_layers,
        architecture.text_config.hidden_size,
        architecture.text_config.num_hidden_layers,
        architecture.text_config.vocab_size,
    ) == (1152, 27, 2048, 24, 49280)
    with pytest.raises(ValueError, match="vision image_size"):
        family.input_size(SimpleNamespace(image_size=378), architecture)
    with pytest.raises(ValueError, match="scale_factor"):
        family.build_preset("tiny", tokenizer, image_size=40, patch_size=None, overrides={})
