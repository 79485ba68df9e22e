"""The Gemma 3 family (``davir.models.families.gemma3``): a user's folder with Gemma's own tokenizer class, its
presets' grids and published sizes, the image tokens' bidirectional attention. What every family does (the
processor's own inputs, FAC against the eager attention on the unpooled SigLIP grid, LoRA, save and load) is
tests/test_family_contract.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_cases import CAPTIONS, CASES, S, build, check_chat_inputs, pair_batch, perturb  # noqa: E402
from family_fixtures import write_chat_folder  # noqa: E402

from davir.models.families import get_family  # noqa: E402
from davir.models.vlm.build import build_davir_model  # noqa: E402
from davir.models.vlm.config import DavirModelConfig  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def batch():
    return pair_batch(build("gemma3"))


def test_a_users_folder_with_gemmas_tokenizer_class_equals_the_processor(tmp_path, batch):
    """The processor's own inputs (tests/test_family_contract.py) with Gemma's own tokenizer class, which puts <bos>
    in front of every text it encodes: one <bos>, the template's."""
    folder = write_chat_folder("gemma3", tmp_path / "gemma", [*CAPTIONS, EpcConfig().prompt, EpcConfig().entity_prefix])
    model = build_davir_model(DavirModelConfig(family="gemma3", pretrained=str(folder), image_size=S))
    assert type(model.tokenizer).__name__ == "GemmaTokenizer" and model.tokenizer.bos_token == "<bos>"
    check_chat_inputs(CASES["gemma3"], model, pair_batch(model))
    assert model._prompt_ids(batch[2][:1])[0][:2] == [
        model.tokenizer.bos_token_id,
        model.tokenizer.convert_tokens_to_ids("<start_of_turn>"),
    ]


def test_the_presets_grids():
    """tiny: 64 px, patch 4 → 16×16 patches, pooled 4×4 → 16 soft tokens; 4b (gemma-3-4b-it): 896 px, patch 14 →
    64×64 patches, pooled 4×4 → 256; S must be the SigLIP input size."""
    family = get_family("gemma3")
    tokenizer = family.preset_tokenizer(CAPTIONS)
    for preset, size, grid, tokens in (("tiny", 64, (16, 16), 16), ("4b", 896, (64, 64), 256)):
        architecture, processor = family.build_preset(preset, tokenizer, image_size=None, patch_size=None, overrides={})
        assert family.input_size(SimpleNamespace(image_size=None), architecture) == size
        assert family.patch_grid(size, architecture) == grid
        assert processor.image_seq_length == architecture.mm_tokens_per_image == tokens
        assert grid[0] // int(tokens**0.5) == 4  # the projector's pooling kernel
    vision, text = architecture.vision_config, architecture.text_config
    assert (vision.hidden_size, vision.num_hidden_layers, vision.num_attention_heads, vision.intermediate_size) == (
        1152,
        27,
        16,
        4304,
    )
    assert (
        text.hidden_size,
        text.num_hidden_layers,
        text.num_attention_heads,
        text.num_key_value_heads,
        text.head_dim,
        text.intermediate_size,
        text.sliding_window,
        text.vocab_size,
    ) == (2560, 34, 8, 4, 256, 10240, 1024, 262208)
    assert text.layer_types.count("full_attention") == 5  # every 6th of 34
    with pytest.raises(ValueError, match="SigLIP input size|896"):
        family.input_size(SimpleNamespace(image_size=448), architecture)
    with pytest.raises(ValueError, match="mm_tokens_per_image"):
        family.build_preset("tiny", tokenizer, image_size=40, patch_size=None, overrides={})


def test_the_image_tokens_attend_to_each_other(batch):
    """The processor's token types reach the model: with them a picture's soft tokens see each other (Gemma 3's
    bidirectional image attention), so the logits of the first soft token differ from a causal pass."""
    before, after, prompts = batch
    model = build("gemma3", train_mode="full").eval()
    perturb(model, pattern="mm_input_projection_weight")  # Gemma 3 starts its projector at zero
    pixels = model._pixel_inputs(before, after)
    ids = torch.tensor(model._prompt_ids(prompts[:1]))
    first = ids[0].tolist().index(model.tokenizer.convert_tokens_to_ids("<image_soft_token>"))
    with torch.no_grad():
        pixels = {"pixel_values": pixels["pixel_values"][:2]}
        typed = model.core(input_ids=ids, **pixels, **model._token_types(ids)).logits
        causal = model.core(input_ids=ids, **pixels).logits
    assert torch.equal(typed[0, :first], causal[0, :first])
    assert not torch.allclose(typed[0, first], causal[0, first], atol=1e-4)
