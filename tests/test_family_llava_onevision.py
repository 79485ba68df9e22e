"""The LLaVA-OneVision family (``davir.models.families.llava_onevision``): its presets' grids (multi-image mode, not
anyres), the layer FAC reads, and no FAC map in generation unless asked. What every family does (the processor's own
inputs, FAC against eager attention for vision_feature_layer -1 and -2, LoRA, save and load) is
tests/test_family_contract.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_cases import CAPTIONS, build, pair_batch  # noqa: E402

from davir.models.families import get_family  # noqa: E402
from davir.models.families.base import fac_layer_index  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    return build("llava_onevision")


@pytest.fixture(scope="module")
def batch(model):
    return pair_batch(model)


def test_the_presets_grids_and_why_not_anyres():
    """Image tokens per picture in multi-image mode: tiny 8×8 + 1 = 65, 7b (27×27 patches of SigLIP-so400m at
    384 px) 729 + 1 = 730. A flat ``images=[before, after]`` would run anyres on each S×S picture: base crop +
    one tile of the same pixels, 2·(S/p)² + S/p tokens (136 tiny, 1485 7b), which the family does not use."""
    family = get_family("llava_onevision")
    tokenizer = family.preset_tokenizer(CAPTIONS)
    for preset, size, grid, tokens, anyres in (("tiny", 64, (8, 8), 65, 136), ("7b", 384, (27, 27), 730, 1485)):
        architecture, processor = family.build_preset(preset, tokenizer, image_size=None, patch_size=None, overrides={})
        assert family.input_size(SimpleNamespace(image_size=None), architecture) == size
        assert family.patch_grid(size, architecture) == grid
        one = family.process_images(processor, [Image.new("RGB", (30, 20))], size)
        assert family.per_image_pixels(one, 1).shape == (1, 3, size, size)
        assert processor.replace_image_token(one, 0) == "<image>" * tokens
        flat = processor.image_processor(images=[Image.new("RGB", (size, size))], return_tensors="pt")
        assert flat["pixel_values"].shape[:2] == (1, 2)  # base + one tile
        assert torch.equal(flat["pixel_values"][0, 0], flat["pixel_values"][0, 1])
        assert processor.replace_image_token(flat, 0) == "<image>" * anyres
    vision, text = architecture.vision_config, architecture.text_config
    assert (
        vision.hidden_size,
        vision.num_hidden_layers,
        vision.num_attention_heads,
        vision.intermediate_size,
        vision.patch_size,
    ) == (1152, 26, 16, 4304, 14)
    assert (
        text.hidden_size,
        text.num_hidden_layers,
        text.num_attention_heads,
        text.num_key_value_heads,
        text.intermediate_size,
        text.vocab_size,
    ) == (3584, 28, 28, 4, 18944, 152128)
    assert (
        architecture.vision_feature_layer,
        architecture.vision_feature_select_strategy,
        architecture.vision_aspect_ratio,
    ) == (-1, "full", "anyres_max_9")
    assert len(architecture.image_grid_pinpoints) == 36 and architecture.image_grid_pinpoints[-1] == [2304, 2304]
    with pytest.raises(ValueError, match="position embeddings are fixed"):
        family.input_size(SimpleNamespace(image_size=448), architecture)
    with pytest.raises(ValueError, match="at least one patch"):
        family.build_preset("tiny", tokenizer, image_size=64, patch_size=96, overrides={})


def test_the_layer_fac_reads_is_the_one_the_projector_reads():
    """``vision_feature_layer`` indexes hidden states (0: embeddings, k ≥ 1: layer k - 1's output, -1: the last)."""

    def config(layer):
        return SimpleNamespace(vision_feature_layer=layer, vision_config=SimpleNamespace(num_hidden_layers=4))

    assert [fac_layer_index(config(layer)) for layer in (-1, -2, 1, 4, [-1, -3])] == [3, 2, 0, 3, 3]
    for layer in (0, 5, -5):
        with pytest.raises(ValueError, match="names no attention layer"):
            fac_layer_index(config(layer))


def test_generation_computes_no_fac_map_unless_asked(model, batch, monkeypatch):
    """The prefill's images need no map (a T×T matrix per head and image): the hook is off during generate."""
    import davir.models.vlm.received_attention as received

    calls = []
    real = received.received_attention
    monkeypatch.setattr(received, "received_attention", lambda *args: calls.append(args[0].shape) or real(*args))
    before, after, prompts = batch
    model.generate(before, after, prompts, max_new_tokens=3, num_beams=2)
    assert calls == []
    _, maps_before, _ = model.generate(before, after, prompts, max_new_tokens=3, return_attention=True)
    assert len(calls) == 1 and calls[0][0] == 4 and maps_before.shape == (2, 8, 8)  # one pass of the 4 images
    model(before, after, prompts)  # the forward keeps its maps
    assert len(calls) == 2
