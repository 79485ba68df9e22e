"""The Qwen3-VL family (``davir.models.families.qwen3_vl``): its presets' grids and published sizes, a released
processor's pixel minimum, the map put back in raster order, the DeepStack mergers as a trainable part. What every
family does (the processor's own inputs, FAC against eager attention, LoRA, save and load) is
tests/test_family_contract.py; the command path: test_family_commands."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_cases import CAPTIONS, S, build, painted_patches  # noqa: E402

from davir.config import ConfigError  # noqa: E402
from davir.models.families import get_family  # noqa: E402
from davir.models.families.qwen3_vl import raster_order  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_presets_grids_and_a_released_processors_minimum():
    """Tiny 8×8 patches → 16 tokens; 2b/8b (the published configs) at 448 px, patch 16 → 28×28 → 196. A released
    processor's 256²-pixel minimum would upscale a 64-px picture to 256 px (16×16 tokens): the family's
    image settings keep it S×S."""
    from transformers import Qwen2VLImageProcessor

    family = get_family("qwen3_vl")
    tokenizer = family.preset_tokenizer(CAPTIONS)
    published = {
        "2b": (1024, 24, 4096, [5, 11, 17], 2048, 28, 16, 6144, True),
        "8b": (1152, 27, 4304, [8, 16, 24], 4096, 36, 32, 12288, False),
    }
    for preset, size, grid, tokens in (
        ("tiny", 64, (8, 8), 16),
        ("2b", 448, (28, 28), 196),
        ("8b", 448, (28, 28), 196),
    ):
        architecture, processor = family.build_preset(preset, tokenizer, image_size=None, patch_size=None, overrides={})
        assert family.input_size(SimpleNamespace(image_size=None, pretrained=None, preset=preset), architecture) == size
        assert family.patch_grid(size, architecture) == grid
        one = family.process_images(processor, [Image.new("RGB", (30, 50))], size)
        assert processor.replace_image_token(one, 0).count("<|image_pad|>") == tokens
        if preset in published:
            vision, text = architecture.vision_config, architecture.text_config
            assert (
                vision.hidden_size,
                vision.depth,
                vision.intermediate_size,
                list(vision.deepstack_visual_indexes),
                text.hidden_size,
                text.num_hidden_layers,
                text.num_attention_heads,
                text.intermediate_size,
                architecture.tie_word_embeddings,
            ) == published[preset]
            assert (
                vision.patch_size,
                vision.num_position_embeddings,
                text.vocab_size,
                text.num_key_value_heads,
                text.head_dim,
                text.rope_parameters["mrope_section"],
            ) == (16, 2304, 151936, 8, 128, [24, 20, 20])
    # A ConfigError naming the option: train.py prints it in one line and exits 2 (it was a traceback, exit 1).
    with pytest.raises(ConfigError, match=r"^model\.image_size=440: .*multiple of .*\(16 × 2 = 32 px\)$"):
        family.input_size(SimpleNamespace(image_size=440, pretrained=None, preset="2b"), architecture)
    with pytest.raises(ConfigError, match=r"^model\.image_size=40: "):
        build("qwen3_vl", image_size=40)
    with pytest.raises(ConfigError, match=r"^model\.image_size=8192: qwen3_vl takes 16 to 4096 px$"):
        family.input_size(SimpleNamespace(image_size=8192, pretrained=None, preset="2b"), architecture)
    released = Qwen2VLImageProcessor(
        patch_size=8, merge_size=2, temporal_patch_size=2, size={"shortest_edge": 65536, "longest_edge": 16777216}
    )
    picture = [Image.new("RGB", (S, S))]
    assert released(images=picture, return_tensors="pt")["image_grid_thw"].tolist() == [[1, 32, 32]]
    held = family.process_images(SimpleNamespace(image_processor=released), picture, S)
    assert held["image_grid_thw"].tolist() == [[1, 8, 8]]


def test_raster_order_undoes_the_processors_merge_unit_order():
    """Each patch of a 16×16 grid is painted with its raster number; the processor lists the patches by 2×2 merge
    unit, and the ViT's own rotary positions (HF's get_vision_position_ids) place token t where raster_order says."""
    from transformers.vision_utils import get_vision_position_ids

    side, merge = 16, 2
    processor_order = painted_patches(side, 4, merge)  # the raster number of each patch, in the processor's order
    assert processor_order.tolist() != list(range(side * side))  # merge-unit order is not raster order
    order = raster_order((side, side), merge)
    assert processor_order[order].tolist() == list(range(side * side))
    positions = get_vision_position_ids(torch.tensor([[1, side, side]]), merge)  # (tokens, 2): row, column
    rows, cols = torch.arange(side * side) // side, torch.arange(side * side) % side
    assert torch.equal(positions[order], torch.stack([rows, cols], dim=1).to(positions.dtype))


def test_the_deepstack_projectors_train_in_full():
    """extra_trainable=("deepstack_projectors",): the DeepStack mergers' every weight trains, beside LoRA."""
    deep = build("qwen3_vl", extra_trainable=("deepstack_projectors",))
    trainable = {name for name, parameter in deep.named_parameters() if parameter.requires_grad}
    assert all("lora_" in name or ".deepstack_merger_list." in name for name in trainable)
    assert "vlm.base_model.model.model.visual.deepstack_merger_list.1.norm.weight" in trainable
