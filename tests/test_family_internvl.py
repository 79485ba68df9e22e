"""The InternVL family (``davir.models.families.internvl``) on its tiny random-weight preset: the chat turn and the
pixels equal the processor's own, the FAC hook equals the eager attention of the patch queries ([CLS] left out),
LoRA sits where the family says, FAC trains the vision LoRA, and a saved model (preset or a user's folder) comes
back with the same logits."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from davir.errors import DataError
from davir.models.families import get_family
from davir.models.families.internvl import image_tokens
from davir.models.vlm.build import build_davir_model, load_davir_model
from davir.models.vlm.config import DavirModelConfig

CAPTIONS = ["the small red metal cube moved", "there is no change", "the large blue sphere changed to green"]
ENTITIES = [["small red metal cube"], ["large blue sphere"]]
S = 64  # the tiny preset's picture size: 8×8 patches of 8 px (+ [CLS]), 16 image tokens after the 2×2 pixel shuffle


def pictures(count: int, seed: int = 0) -> list[Image.Image]:
    """Random RGB pictures of different, non-square sizes (the family resizes them to S×S)."""
    generator = torch.Generator().manual_seed(seed)
    result = []
    for index in range(count):
        height, width = 48 + 8 * index, 80 - 4 * index
        values = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
        result.append(Image.fromarray(values.numpy()))
    return result


def build(**overrides):
    config = DavirModelConfig(family="internvl", preset="tiny", **overrides)
    return build_davir_model(config, captions_for_tokenizer=CAPTIONS)


def perturb_lora(model, seed: int = 1) -> None:
    """Non-zero LoRA B matrices (PEFT starts them at zero), so the adapters change what the model computes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


def sharpen(model) -> None:
    """Peaked attention in the last InternViT layer and a random [CLS] token (zero at initialisation): at random
    weights every query gives the [CLS] key about 1/(1 + T) of its attention, and maps that treat that share
    differently would agree to 1e-7."""
    generator = torch.Generator().manual_seed(2)
    tower = model.core.model.vision_tower
    attention = tower.encoder.layer[-1].attention
    with torch.no_grad():
        tower.embeddings.cls_token.copy_(torch.randn(tower.embeddings.cls_token.shape, generator=generator))
        for projection in (attention.q_proj, attention.k_proj):
            weight = getattr(projection, "base_layer", projection).weight
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.5)


@pytest.fixture(scope="module")
def model():
    return build()


@pytest.fixture(scope="module")
def batch(model):
    pixels = model.image_processor(pictures(4))
    return pixels[0::2], pixels[1::2], model.build_prompts(ENTITIES)


# ------------------------------------------------------------------------------------------- images and chat turn
def test_chat_text_and_pixels_equal_the_processor(model, batch):
    """Our token ids and image tensors for a batch of pairs are exactly the processor's own
    ``processor(text=…, images=[[before, after], …], crop_to_patches=False)`` on the S×S pictures."""
    before, after, prompts = batch
    processor = model.processor
    messages = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": p}]}]
        for p in prompts
    ]
    texts = [processor.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    resized = [p.convert("RGB").resize((S, S), Image.Resampling.BICUBIC) for p in pictures(4)]
    reference = processor(
        text=texts, images=[resized[0:2], resized[2:4]], crop_to_patches=False, return_tensors="pt", padding=True
    )
    ours = model._prompt_ids(prompts)
    for row, ids in enumerate(ours):
        expected = reference["input_ids"][row][reference["attention_mask"][row].bool()].tolist()
        assert ids == expected
    inputs = model._pixel_inputs(before, after)
    assert inputs["pixel_values"].shape == (4, 3, S, S)  # one tile per picture, row by row, before first
    assert torch.equal(inputs["pixel_values"], reference["pixel_values"])
    # The released layout: both pictures, one tile each, then the prompt, in one user turn.
    text = model.chat_text(prompts[0])
    one = "<img>" + "<IMG_CONTEXT>" * 16 + "</img>"
    assert text == f"<|im_start|>user\n{one}\n{one}\n{prompts[0]}<|im_end|>\n<|im_start|>assistant\n"
    assert model.patch_grid == (8, 8) and model.image_size == S
    # The tiler (crop_to_patches, the processor's default) makes one tile of an S×S picture too: nothing is lost.
    tiled = processor.image_processor(images=resized[:1], crop_to_patches=True, return_tensors="pt")
    assert tiled["num_patches"].tolist() == [1] and torch.equal(tiled["pixel_values"], reference["pixel_values"][:1])


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


# ------------------------------------------------------------------------------------------------------- FAC
def test_fac_hook_equals_the_eager_attention_of_the_patch_queries(batch):
    """The hook's map (LoRA included) is the eager attention's probabilities in the last InternViT layer, patch
    queries to patch keys ([CLS] row and column dropped), averaged over heads and queries and renormalised over
    the patches (≤ 1e-6); with SDPA and the same weights the hook gives the same map. The [CLS] row [D] (what
    InstructBLIP supervises) is another map: the choice matters."""
    before, after, prompts = batch
    eager = build(attn_implementation="eager").eval()  # no LoRA dropout: both passes see the same projections
    perturb_lora(eager)
    sharpen(eager)
    output = eager(before, after, prompts)
    pixels = eager._pixel_inputs(before, after)["pixel_values"]
    with torch.no_grad():
        probabilities = eager.family.vision_tower(eager.core)(pixel_values=pixels, output_attentions=True).attentions
    eager.attention_hook.pop(missing_ok=True)
    share = probabilities[-1][:, :, 1:, 0]  # what each patch query gives the [CLS] key: far from constant
    assert share.max() > 0.2 and share.min() < 0.01
    assert len(probabilities) == 3 and probabilities[-1].shape[-1] == 1 + 64  # [CLS] + 8×8 patches
    received = probabilities[-1][:, :, 1:, 1:].mean(dim=(1, 2))
    expected = (received / received.sum(dim=-1, keepdim=True)).reshape(2, 2, 8, 8)  # (pair, before/after, Hp, Wp)
    assert torch.allclose(output.attention_before, expected[:, 0], atol=1e-6, rtol=0)
    assert torch.allclose(output.attention_after, expected[:, 1], atol=1e-6, rtol=0)
    cls_row = probabilities[-1][:, :, 0, 1:].mean(dim=1)
    cls_row = (cls_row / cls_row.sum(dim=-1, keepdim=True)).reshape(2, 2, 8, 8)
    assert (cls_row - expected).abs().max() > 1e-3
    first = probabilities[0][:, :, 1:, 1:].mean(dim=(1, 2))
    assert not torch.allclose(
        first / first.sum(dim=-1, keepdim=True), received / received.sum(-1, keepdim=True), atol=1e-4
    )

    sdpa = build(attn_implementation="sdpa").eval()
    sdpa.load_state_dict(eager.state_dict())
    again = sdpa(before, after, prompts)
    assert torch.allclose(again.attention_before, output.attention_before, atol=1e-6, rtol=0)
    assert torch.allclose(again.attention_after, output.attention_after, atol=1e-6, rtol=0)


def test_fac_reads_the_layer_the_projector_reads(batch):
    """vision_feature_layer = 2 (hidden state 2: the output of layer 1 of 3): the hook sits on layer 1 and its map
    is that layer's eager patch attention."""
    before, after, prompts = batch
    model = build(attn_implementation="eager", preset_overrides={"vision_feature_layer": 2}).eval()
    assert model.family.fac_attention(model.core) is model.core.model.vision_tower.encoder.layer[1].attention
    output = model(before, after, prompts)
    pixels = model._pixel_inputs(before, after)["pixel_values"]
    with torch.no_grad():
        probabilities = model.family.vision_tower(model.core)(pixel_values=pixels, output_attentions=True).attentions
    received = probabilities[1][:, :, 1:, 1:].mean(dim=(1, 2))
    expected = (received / received.sum(dim=-1, keepdim=True)).reshape(2, 2, 8, 8)
    assert torch.allclose(output.attention_before, expected[:, 0], atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------------ LoRA
def test_lora_sits_on_vision_attention_projector_and_llm_attention(model):
    names = [name.removeprefix("base_model.model.") for name, _ in model.vlm.named_modules() if name.endswith("lora_A")]
    layers = len(model.core.model.vision_tower.encoder.layer)
    for index in range(layers):
        for projection in ("q_proj", "k_proj", "v_proj"):
            assert f"model.vision_tower.encoder.layer.{index}.attention.{projection}.lora_A" in names
    assert {"model.multi_modal_projector.linear_1.lora_A", "model.multi_modal_projector.linear_2.lora_A"} <= set(names)
    for index in range(len(model.core.model.language_model.layers)):
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert f"model.language_model.layers.{index}.self_attn.{projection}.lora_A" in names
    assert len(names) == 3 * layers + 2 + 4 * len(model.core.model.language_model.layers)
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    summary = model.trainable_parameter_summary()
    assert set(summary) == {"vision", "projector", "language_model", "lm_head", "all"}
    assert summary["lm_head"][0] == 0 and all(
        summary[part][0] > 0 for part in ("vision", "projector", "language_model")
    )

    extra = build(extra_trainable=("projector",))
    trainable = {name for name, parameter in extra.named_parameters() if parameter.requires_grad}
    assert "vlm.base_model.model.model.multi_modal_projector.layer_norm.weight" in trainable
    assert all("lora_" in name or ".multi_modal_projector." in name for name in trainable)


# ---------------------------------------------------------------------------------------- forward and generate
def test_forward_with_masks_trains_the_vision_lora_and_generate_returns_maps(model, batch):
    before, after, prompts = batch
    masks = torch.zeros(2, S, S)
    masks[:, :32, :32] = 1.0
    model.zero_grad()
    output = model(before, after, prompts, captions=CAPTIONS[:2], masks_before=masks, masks_after=masks)
    assert torch.isfinite(output.caption_loss) and torch.isfinite(output.attn_loss) and output.fac_pairs == 2
    assert output.attention_before.shape == (2, 8, 8)
    assert torch.allclose(output.attention_before.sum(dim=(1, 2)), torch.ones(2), atol=1e-5)
    output.attn_loss.backward()  # FAC alone reaches the vision LoRA of the layer it reads
    last = len(model.core.model.vision_tower.encoder.layer) - 1
    grads = {
        name: parameter.grad
        for name, parameter in model.named_parameters()
        if f"vision_tower.encoder.layer.{last}.attention.q_proj.lora_B" in name
    }
    assert grads and all(grad is not None and grad.abs().sum() > 0 for grad in grads.values())
    model.zero_grad()

    captions = model.generate(before, after, prompts, max_new_tokens=4)
    assert isinstance(captions, list) and len(captions) == 2 and all(isinstance(c, str) for c in captions)
    captions, maps_before, maps_after = model.generate(before, after, prompts, max_new_tokens=4, return_attention=True)
    assert maps_before.shape == maps_after.shape == (2, 8, 8)
    model.eval()
    with torch.no_grad():
        reference = model(before, after, prompts)
    model.train()
    assert torch.allclose(maps_before, reference.attention_before, atol=1e-6)
    assert torch.allclose(maps_after, reference.attention_after, atol=1e-6)


# --------------------------------------------------------------------------------------------- save and load
def logits(model, batch) -> torch.Tensor:
    before, after, prompts = batch
    model.eval()
    with torch.no_grad():
        return model(before, after, prompts, captions=CAPTIONS[:2]).logits


def test_preset_round_trip(model, batch, tmp_path):
    perturb_lora(model, seed=3)
    model.save_pretrained(tmp_path / "saved")
    again = load_davir_model(tmp_path / "saved")
    assert type(again).__name__ == "ChatDavirModel" and again.config.family == "internvl"
    assert torch.equal(logits(again, batch), logits(model, batch))


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory) -> Path:
    """A user's InternVL folder: a model's ``save_pretrained`` and its processor's, side by side."""
    folder = tmp_path_factory.mktemp("internvl_user")
    source = build(train_mode="full")
    source.core.save_pretrained(str(folder))
    source.processor.save_pretrained(str(folder))
    return folder


def test_pretrained_folder_round_trip_saves_only_the_adapter(user_folder, batch, tmp_path):
    config = DavirModelConfig(family="internvl", pretrained=str(user_folder), image_size=S)
    model = build_davir_model(config)
    assert model.processor.image_token == "<IMG_CONTEXT>" and model.processor.image_seq_length == 16
    perturb_lora(model, seed=5)
    expected = logits(model, batch)
    model.save_pretrained(tmp_path / "saved")
    assert sorted(path.name for path in (tmp_path / "saved").iterdir()) == ["adapter", "davir_config.json", "processor"]
    adapter = tmp_path / "saved" / "adapter"
    assert {path.name for path in adapter.iterdir()} - {"README.md"} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    assert saved and all("lora_" in name for name in saved)  # no frozen base weight
    again = load_davir_model(tmp_path / "saved")
    assert again.config.pretrained == str(user_folder)
    assert torch.equal(logits(again, batch), expected)


def test_an_internvl_folder_is_not_another_family(user_folder):
    with pytest.raises(DataError, match=r"'internvl' model.*model\.family=qwen2_5_vl"):
        build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(user_folder)))
