"""The LLaVA-OneVision family (``davir.models.families.llava_onevision``) on its tiny random-weight preset: the chat
turn and the pixels equal the processor's own (multi-image mode), the FAC hook equals the eager attention of the
layer the projector reads, LoRA sits where the family says, FAC trains the vision LoRA, and a saved model (preset
or a user's folder) comes back with the same logits."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from davir.errors import DataError
from davir.models.families import get_family
from davir.models.families.base import fac_layer_index
from davir.models.vlm.build import build_davir_model, load_davir_model
from davir.models.vlm.config import DavirModelConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CAPTIONS = ["the small red metal cube moved", "there is no change", "the large blue sphere changed to green"]
ENTITIES = [["small red metal cube"], ["large blue sphere"]]
S = 64  # the tiny preset's picture size: 8×8 patches of 8 px → 64 + 1 (image_newline) image tokens per image
TOKENS = 65


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
    config = DavirModelConfig(family="llava_onevision", preset="tiny", **overrides)
    return build_davir_model(config, captions_for_tokenizer=CAPTIONS)


def perturb_lora(model, seed: int = 1) -> None:
    """Non-zero LoRA B matrices (PEFT starts them at zero), so the adapters change what the model computes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


def vision_layers(model):
    tower = model.core.model.vision_tower
    return getattr(tower, "vision_model", tower).encoder.layers


@pytest.fixture(scope="module")
def model():
    return build()


@pytest.fixture(scope="module")
def batch(model):
    pixels = model.image_processor(pictures(4))
    return pixels[0::2], pixels[1::2], model.build_prompts(ENTITIES)


# ------------------------------------------------------------------------------------------- images and chat turn
def test_chat_text_and_pixels_equal_the_processor(model, batch):
    """Our token ids and image inputs for a batch of pairs are exactly the processor's own
    ``processor(text=…, images=[[before, after], …])`` (both pictures of a turn as one sample) on S×S pictures."""
    before, after, prompts = batch
    processor = model.processor
    messages = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": p}]}]
        for p in prompts
    ]
    texts = [processor.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    resized = [p.convert("RGB").resize((S, S), Image.Resampling.BICUBIC) for p in pictures(4)]
    reference = processor(text=texts, images=[resized[0:2], resized[2:4]], return_tensors="pt", padding=True)
    ours = model._prompt_ids(prompts)
    for row, ids in enumerate(ours):
        expected = reference["input_ids"][row][reference["attention_mask"][row].bool()].tolist()
        assert ids == expected
        assert ids.count(model.core.config.image_token_id) == 2 * TOKENS
    inputs = model._pixel_inputs(before, after)
    assert set(inputs) == {"pixel_values", "image_sizes", "batch_num_images"}
    assert inputs["pixel_values"].shape == (4, 1, 3, S, S)  # images in text order, one crop each
    for key in ("pixel_values", "image_sizes", "batch_num_images"):
        assert torch.equal(inputs[key], reference[key]), key
    # The processor's chat path with the pictures in the message does the same: one sample of two images.
    content = [
        {"type": "image", "image": resized[0]},
        {"type": "image", "image": resized[1]},
        {"type": "text", "text": prompts[0]},
    ]
    message = [{"role": "user", "content": content}]
    own = processor.apply_chat_template(
        [message], add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    assert own["batch_num_images"].tolist() == [2]
    assert torch.equal(own["pixel_values"], inputs["pixel_values"][:2])
    assert int((own["input_ids"] == model.core.config.image_token_id).sum()) == 2 * TOKENS
    # The real LLaVA-OneVision layout: both pictures, then the prompt, in one user turn.
    image = "<image>" * TOKENS
    assert model.chat_text(prompts[0]) == (
        f"<|im_start|>user\n{image}\n{image}\n{prompts[0]}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert model.patch_grid == (8, 8) and model.image_size == S


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


# ------------------------------------------------------------------------------------------------------- FAC
@pytest.mark.parametrize("feature_layer", [-1, -2])
def test_fac_hook_equals_the_eager_attention(batch, feature_layer):
    """The hook's map (LoRA included) is the eager attention's probabilities in the layer the projector reads,
    averaged over heads and queries (≤ 1e-6); with SDPA and the same weights the hook gives the same map."""
    before, after, prompts = batch
    overrides = {"preset_overrides": {"vision_feature_layer": feature_layer}}
    eager = build(attn_implementation="eager", **overrides).eval()  # eval: no LoRA dropout between the passes
    perturb_lora(eager)
    output = eager(before, after, prompts)
    pixels = eager._pixel_inputs(before, after)["pixel_values"].flatten(0, 1)
    with torch.no_grad():
        probabilities = eager.family.vision_tower(eager.core)(pixel_values=pixels, output_attentions=True).attentions
    eager.attention_hook.pop(missing_ok=True)
    assert len(probabilities) == 3  # the tiny encoder's layers
    expected = probabilities[feature_layer].mean(dim=(1, 2)).reshape(2, 2, 8, 8)  # (pair, before/after, Hp, Wp)
    assert torch.allclose(output.attention_before, expected[:, 0], atol=1e-6, rtol=0)
    assert torch.allclose(output.attention_after, expected[:, 1], atol=1e-6, rtol=0)
    other = probabilities[feature_layer - 1].mean(dim=(1, 2)).reshape(2, 2, 8, 8)
    assert not torch.allclose(other[:, 0], expected[:, 0], atol=1e-4)

    sdpa = build(attn_implementation="sdpa", **overrides).eval()
    sdpa.load_state_dict(eager.state_dict())
    again = sdpa(before, after, prompts)
    assert torch.allclose(again.attention_before, output.attention_before, atol=1e-6, rtol=0)
    assert torch.allclose(again.attention_after, output.attention_after, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------------ LoRA
def test_lora_sits_on_vision_attention_projector_and_llm_attention(model):
    names = [name.removeprefix("base_model.model.") for name, _ in model.vlm.named_modules() if name.endswith("lora_A")]
    layers = len(vision_layers(model))
    prefix = "model.vision_tower." + ("vision_model." if hasattr(model.core.model.vision_tower, "vision_model") else "")
    for index in range(layers):
        for projection in ("q_proj", "k_proj", "v_proj"):
            assert f"{prefix}encoder.layers.{index}.self_attn.{projection}.lora_A" in names
    assert {"model.multi_modal_projector.linear_1.lora_A", "model.multi_modal_projector.linear_2.lora_A"} <= set(names)
    text_layers = len(model.core.model.language_model.layers)
    for index in range(text_layers):
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert f"model.language_model.layers.{index}.self_attn.{projection}.lora_A" in names
    assert len(names) == 3 * layers + 2 + 4 * text_layers
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    summary = model.trainable_parameter_summary()
    assert set(summary) == {"vision", "projector", "language_model", "lm_head", "all"}
    assert summary["lm_head"][0] == 0 and all(
        summary[part][0] > 0 for part in ("vision", "projector", "language_model")
    )

    extra = build(extra_trainable=("projector",))
    trainable = {name for name, parameter in extra.named_parameters() if parameter.requires_grad}
    assert "vlm.base_model.model.model.multi_modal_projector.linear_1.base_layer.weight" in trainable
    assert all("lora_" in name or ".multi_modal_projector." in name for name in trainable)


# ---------------------------------------------------------------------------------------- forward and generate
def test_forward_with_masks_trains_the_vision_lora_and_generate_returns_maps(model, batch):
    before, after, prompts = batch
    masks = torch.zeros(2, S, S)
    masks[:, :32, :32] = 1.0
    model.zero_grad()
    output = model(before, after, prompts, captions=CAPTIONS[:2], masks_before=masks, masks_after=masks)
    assert torch.isfinite(output.loss) and torch.isfinite(output.caption_loss)
    assert torch.isfinite(output.attn_loss) and output.fac_pairs == 2
    assert output.attention_before.shape == (2, 8, 8)
    assert torch.allclose(output.attention_before.sum(dim=(1, 2)), torch.ones(2), atol=1e-5)
    # FAC alone reaches the query LoRA of the layer it reads
    last = len(vision_layers(model)) - 1
    lora = {
        name: parameter
        for name, parameter in model.named_parameters()
        if f"encoder.layers.{last}.self_attn.q_proj.lora_B" in name
    }
    grads = torch.autograd.grad(output.attn_loss, list(lora.values()), retain_graph=True)
    assert lora and all(grad.abs().sum() > 0 for grad in grads)
    output.loss.backward()
    vision = [
        parameter.grad for name, parameter in model.named_parameters() if "vision_tower" in name and "lora_B" in name
    ]
    assert vision and all(grad is not None and grad.abs().sum() > 0 for grad in vision)
    model.zero_grad()

    captions = model.generate(before, after, prompts, max_new_tokens=4)
    assert isinstance(captions, list) and len(captions) == 2 and all(isinstance(c, str) for c in captions)
    assert len(model.generate(before, after, prompts, max_new_tokens=3, num_beams=2)) == 2
    captions, maps_before, maps_after = model.generate(before, after, prompts, max_new_tokens=4, return_attention=True)
    assert maps_before.shape == maps_after.shape == (2, 8, 8)
    with torch.no_grad():
        reference = model(before, after, prompts)
    assert torch.allclose(maps_before, reference.attention_before, atol=1e-6)
    assert torch.allclose(maps_after, reference.attention_after, atol=1e-6)


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
    assert type(again).__name__ == "ChatDavirModel" and again.config.family == "llava_onevision"
    assert torch.equal(logits(again, batch), logits(model, batch))


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory) -> Path:
    """A user's LLaVA-OneVision folder: a model's ``save_pretrained`` and its processor's, side by side."""
    folder = tmp_path_factory.mktemp("llava_onevision_user")
    source = build(train_mode="full")
    source.core.save_pretrained(str(folder))
    source.processor.save_pretrained(str(folder))
    return folder


def test_pretrained_folder_round_trip_saves_only_the_adapter(user_folder, batch, tmp_path):
    config = DavirModelConfig(family="llava_onevision", pretrained=str(user_folder), image_size=S)
    model = build_davir_model(config)
    perturb_lora(model, seed=5)
    expected = logits(model, batch)
    model.save_pretrained(tmp_path / "saved")
    assert sorted(path.name for path in (tmp_path / "saved").iterdir()) == ["adapter", "davir_config.json", "processor"]
    adapter = {path.name for path in (tmp_path / "saved" / "adapter").iterdir()}
    assert adapter - {"README.md"} == {"adapter_config.json", "adapter_model.safetensors"}
    again = load_davir_model(tmp_path / "saved")
    assert again.config.pretrained == str(user_folder)
    assert again.image_text == model.image_text  # the processor's settings came back
    assert torch.equal(logits(again, batch), expected)


def test_a_llava_onevision_folder_is_not_another_family(user_folder):
    with pytest.raises(DataError, match=r"'llava_onevision' model.*model\.family=qwen2_5_vl"):
        build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(user_folder)))
