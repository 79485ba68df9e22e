"""The SmolVLM family (``davir.models.families.smolvlm``) on its tiny random-weight preset: the chat turn and the
pixels equal the processor's own, the FAC hook equals the eager attention, LoRA sits where the family says,
FAC trains the vision LoRA, and a saved model (preset or a user's folder) comes back with the same logits."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from davir.errors import DataError
from davir.models.families import get_family
from davir.models.families.smolvlm import image_tokens
from davir.models.vlm.build import build_davir_model, load_davir_model
from davir.models.vlm.config import DavirModelConfig

CAPTIONS = ["the small red metal cube moved", "there is no change", "the large blue sphere changed to green"]
ENTITIES = [["small red metal cube"], ["large blue sphere"]]
S = 64  # the tiny preset's picture size: 8×8 patches of 8 px, 16 image tokens after the 2×2 pixel shuffle


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
    config = DavirModelConfig(family="smolvlm", preset="tiny", **overrides)
    return build_davir_model(config, captions_for_tokenizer=CAPTIONS)


def perturb_lora(model, seed: int = 1) -> None:
    """Non-zero LoRA B matrices (PEFT starts them at zero), so the adapters change what the model computes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


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
    ``processor(text=…, images=[[before, after], …], do_image_splitting=False)`` on the S×S pictures."""
    before, after, prompts = batch
    processor = model.processor
    messages = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": p}]}]
        for p in prompts
    ]
    texts = [processor.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    resized = [p.convert("RGB").resize((S, S), Image.Resampling.BICUBIC) for p in pictures(4)]
    reference = processor(
        text=texts, images=[resized[0:2], resized[2:4]], do_image_splitting=False, return_tensors="pt", padding=True
    )
    ours = model._prompt_ids(prompts)
    for row, ids in enumerate(ours):
        expected = reference["input_ids"][row][reference["attention_mask"][row].bool()].tolist()
        assert ids == expected
    inputs = model._pixel_inputs(before, after)
    assert inputs["pixel_values"].shape == (2, 2, 3, S, S)
    assert torch.equal(inputs["pixel_values"], reference["pixel_values"])
    assert torch.equal(inputs["pixel_attention_mask"], reference["pixel_attention_mask"])
    # SmolVLM's layout: both pictures, one global S×S image each, then the prompt, in one user turn.
    text = model.chat_text(prompts[0])
    one = "<fake_token_around_image><global-img>" + "<image>" * 16 + "<fake_token_around_image>"
    assert text == f"<|im_start|>User:{one}{one}{prompts[0]}<end_of_utterance>\nAssistant:"
    assert model.patch_grid == (8, 8) and model.image_size == S


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


# ------------------------------------------------------------------------------------------------------- FAC
def test_fac_hook_equals_the_eager_attention(batch):
    """The hook's map (LoRA included) is the eager attention's probabilities in the last encoder layer, averaged
    over heads and queries (≤ 1e-6); with SDPA and the same weights the hook gives the same map."""
    before, after, prompts = batch
    eager = build(attn_implementation="eager").eval()  # no LoRA dropout: both passes see the same projections
    perturb_lora(eager)
    output = eager(before, after, prompts)
    pixels = eager._pixel_inputs(before, after)["pixel_values"].flatten(0, 1)
    with torch.no_grad():
        probabilities = eager.family.vision_tower(eager.core)(pixel_values=pixels, output_attentions=True).attentions
    eager.attention_hook.pop(missing_ok=True)
    assert len(probabilities) == 3  # the tiny encoder's layers; FAC reads the last
    expected = probabilities[-1].mean(dim=(1, 2)).reshape(2, 2, 8, 8)  # (pair, before/after, Hp, Wp)
    assert torch.allclose(output.attention_before, expected[:, 0], atol=1e-6, rtol=0)
    assert torch.allclose(output.attention_after, expected[:, 1], atol=1e-6, rtol=0)
    assert not torch.allclose(probabilities[0].mean(dim=(1, 2)), probabilities[-1].mean(dim=(1, 2)), atol=1e-4)

    sdpa = build(attn_implementation="sdpa").eval()
    sdpa.load_state_dict(eager.state_dict())
    again = sdpa(before, after, prompts)
    assert torch.allclose(again.attention_before, output.attention_before, atol=1e-6, rtol=0)
    assert torch.allclose(again.attention_after, output.attention_after, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------------ LoRA
def test_lora_sits_on_vision_attention_connector_and_llm_attention(model):
    names = [name.removeprefix("base_model.model.") for name, _ in model.vlm.named_modules() if name.endswith("lora_A")]
    layers = len(model.core.model.vision_model.encoder.layers)
    for index in range(layers):
        for projection in ("q_proj", "k_proj", "v_proj"):
            assert f"model.vision_model.encoder.layers.{index}.self_attn.{projection}.lora_A" in names
    assert "model.connector.modality_projection.proj.lora_A" in names
    for index in range(len(model.core.model.text_model.layers)):
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert f"model.text_model.layers.{index}.self_attn.{projection}.lora_A" in names
    assert len(names) == 3 * layers + 1 + 4 * len(model.core.model.text_model.layers)
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    summary = model.trainable_parameter_summary()
    assert set(summary) == {"vision", "projector", "language_model", "lm_head", "all"}
    assert summary["lm_head"][0] == 0 and all(
        summary[part][0] > 0 for part in ("vision", "projector", "language_model")
    )

    extra = build(extra_trainable=("projector",))
    trainable = {name for name, parameter in extra.named_parameters() if parameter.requires_grad}
    assert "vlm.base_model.model.model.connector.modality_projection.proj.base_layer.weight" in trainable
    assert all("lora_" in name or ".connector." in name for name in trainable)


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
    last = len(model.core.model.vision_model.encoder.layers) - 1
    grads = {
        name: parameter.grad
        for name, parameter in model.named_parameters()
        if f"vision_model.encoder.layers.{last}.self_attn.q_proj.lora_B" in name
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
    assert type(again).__name__ == "ChatDavirModel" and again.config.family == "smolvlm"
    assert torch.equal(logits(again, batch), logits(model, batch))


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory) -> Path:
    """A user's SmolVLM folder: a model's ``save_pretrained`` and its processor's, side by side."""
    folder = tmp_path_factory.mktemp("smolvlm_user")
    source = build(train_mode="full")
    source.core.save_pretrained(str(folder))
    source.processor.save_pretrained(str(folder))
    return folder


def test_pretrained_folder_round_trip_saves_only_the_adapter(user_folder, batch, tmp_path):
    config = DavirModelConfig(family="smolvlm", pretrained=str(user_folder), image_size=S)
    model = build_davir_model(config)
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


def test_a_smolvlm_folder_is_not_another_family(user_folder):
    with pytest.raises(DataError, match=r"'smolvlm' model.*model\.family=qwen2_5_vl"):
        build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(user_folder)))
