"""The Gemma 3 family (``davir.models.families.gemma3``) on its tiny random-weight preset: the chat turn and the
pixels equal the processor's own, the FAC hook equals the eager attention on the unpooled SigLIP grid, LoRA sits
where the family says, FAC trains the vision LoRA, and a saved model (preset or a user's folder) comes back with the
same logits."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.errors import DataError  # noqa: E402
from davir.models.families import get_family  # noqa: E402
from davir.models.vlm.build import build_davir_model, load_davir_model  # noqa: E402
from davir.models.vlm.config import DavirModelConfig  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CAPTIONS = ["the small red metal cube moved", "there is no change", "the large blue sphere changed to green"]
ENTITIES = [["small red metal cube"], ["large blue sphere"]]
S = 64  # the tiny preset: 16×16 patches of 4 px, pooled 4×4 by the projector → 16 soft tokens a picture


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
    config = DavirModelConfig(family="gemma3", preset="tiny", **overrides)
    return build_davir_model(config, captions_for_tokenizer=CAPTIONS)


def perturb(model, seed: int = 1, *, projector: bool = True) -> None:
    """Non-zero LoRA B matrices (PEFT starts them at zero) and, with ``projector``, projector (Gemma 3 starts it at
    zero), so the adapters and the pictures change what the model computes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name or (projector and "mm_input_projection_weight" in name):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


@pytest.fixture(scope="module")
def model():
    return build()


@pytest.fixture(scope="module")
def batch(model):
    pixels = model.image_processor(pictures(4))
    return pixels[0::2], pixels[1::2], model.build_prompts(ENTITIES)


# ------------------------------------------------------------------------------------------- images and chat turn
def _reference(processor, prompts):
    """The processor's own inputs for the S×S pictures: what ``apply_chat_template(tokenize=True)`` gives (the
    template writes the <bos>, so no second one is added)."""
    messages = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": p}]}]
        for p in prompts
    ]
    texts = [processor.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    resized = [p.convert("RGB").resize((S, S), Image.Resampling.BICUBIC) for p in pictures(4)]
    return processor(
        text=texts, images=[resized[0:2], resized[2:4]], return_tensors="pt", padding=True, add_special_tokens=False
    )


def _check_equal_to_processor(model, batch):
    before, after, prompts = batch
    reference = _reference(model.processor, prompts)
    ours = model._prompt_ids(prompts)
    for row, ids in enumerate(ours):
        keep = reference["attention_mask"][row].bool()
        assert ids == reference["input_ids"][row][keep].tolist()
        types = model._token_types(torch.tensor([ids]))["token_type_ids"][0]
        assert types.tolist() == reference["token_type_ids"][row][keep].tolist()
        assert int(types.sum()) == 2 * 16 and ids.count(model.tokenizer.bos_token_id) == 1
    inputs = model._pixel_inputs(before, after)
    assert set(inputs) == {"pixel_values"} and inputs["pixel_values"].shape == (4, 3, S, S)
    assert torch.equal(inputs["pixel_values"], reference["pixel_values"])


def test_chat_text_and_pixels_equal_the_processor(model, batch):
    """Our token ids, token types and image tensors for a batch of pairs are exactly the processor's own on the
    S×S pictures, one <bos> (the template's)."""
    _check_equal_to_processor(model, batch)
    prompts = batch[2]
    one = "\n\n<start_of_image>" + "<image_soft_token>" * 16 + "<end_of_image>\n\n"
    assert model.chat_text(prompts[0]) == (
        f"<s><start_of_turn>user\n{one}{one}{prompts[0]}<end_of_turn>\n<start_of_turn>model\n"
    )
    assert model.patch_grid == (16, 16) and model.image_size == S


def test_a_users_folder_with_gemmas_tokenizer_class_equals_the_processor(tmp_path, batch):
    """The same with Gemma's own tokenizer class (which puts <bos> in front of every text it encodes): one <bos>."""
    folder = write_chat_folder("gemma3", tmp_path / "gemma", [*CAPTIONS, EpcConfig().prompt, EpcConfig().entity_prefix])
    model = build_davir_model(DavirModelConfig(family="gemma3", pretrained=str(folder), image_size=S))
    assert type(model.tokenizer).__name__ == "GemmaTokenizer" and model.tokenizer.bos_token == "<bos>"
    pixels = model.image_processor(pictures(4))
    _check_equal_to_processor(model, (pixels[0::2], pixels[1::2], batch[2]))
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


# ------------------------------------------------------------------------------------------------------- FAC
def test_fac_hook_equals_the_eager_attention(batch):
    """The hook's map (LoRA included) is the eager attention's probabilities in the last SigLIP layer, averaged
    over heads and queries, on the unpooled 16×16 grid (≤ 1e-6); with SDPA and the same weights the same map."""
    before, after, prompts = batch
    eager = build(attn_implementation="eager").eval()  # no LoRA dropout: both passes see the same projections
    perturb(eager)
    output = eager(before, after, prompts)
    pixels = eager._pixel_inputs(before, after)["pixel_values"]
    with torch.no_grad():
        probabilities = eager.family.vision_tower(eager.core)(pixel_values=pixels, output_attentions=True).attentions
    eager.attention_hook.pop(missing_ok=True)
    assert len(probabilities) == 3 and probabilities[-1].shape == (4, 4, 256, 256)
    expected = probabilities[-1].mean(dim=(1, 2)).reshape(2, 2, 16, 16)  # (pair, before/after, Hp, Wp)
    assert torch.allclose(output.attention_before, expected[:, 0], atol=1e-6, rtol=0)
    assert torch.allclose(output.attention_after, expected[:, 1], atol=1e-6, rtol=0)
    assert not torch.allclose(probabilities[0].mean(dim=(1, 2)), probabilities[-1].mean(dim=(1, 2)), atol=1e-4)

    sdpa = build(attn_implementation="sdpa").eval()
    sdpa.load_state_dict(eager.state_dict())
    again = sdpa(before, after, prompts)
    assert torch.allclose(again.attention_before, output.attention_before, atol=1e-6, rtol=0)
    assert torch.allclose(again.attention_after, output.attention_after, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------------ LoRA
def test_lora_sits_on_vision_attention_and_llm_attention(model):
    names = [name.removeprefix("base_model.model.") for name, _ in model.vlm.named_modules() if name.endswith("lora_A")]
    layers = len(model.core.model.vision_tower.encoder.layers)
    for index in range(layers):
        for projection in ("q_proj", "k_proj", "v_proj"):
            assert f"model.vision_tower.encoder.layers.{index}.self_attn.{projection}.lora_A" in names
    text_layers = len(model.core.model.language_model.layers)
    for index in range(text_layers):
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert f"model.language_model.layers.{index}.self_attn.{projection}.lora_A" in names
    assert len(names) == 3 * layers + 4 * text_layers  # the projector has no linear layer [D]
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    summary = model.trainable_parameter_summary()
    assert set(summary) == {"vision", "projector", "language_model", "all"}  # lm_head is the tied embedding
    assert summary["projector"] == (0, 128 * 128 + 128) and all(
        summary[part][0] > 0 for part in ("vision", "language_model")
    )

    extra = build(extra_trainable=("projector",))
    trainable = {name for name, parameter in extra.named_parameters() if parameter.requires_grad}
    assert {
        "vlm.base_model.model.model.multi_modal_projector.mm_input_projection_weight",
        "vlm.base_model.model.model.multi_modal_projector.mm_soft_emb_norm.weight",
    } <= trainable
    assert all("lora_" in name or ".multi_modal_projector." in name for name in trainable)
    assert extra.trainable_parameter_summary()["projector"] == (128 * 128 + 128,) * 2


# ---------------------------------------------------------------------------------------- forward and generate
def test_forward_with_masks_trains_the_vision_lora_and_generate_returns_maps(model, batch):
    before, after, prompts = batch
    masks = torch.zeros(2, S, S)
    masks[:, :32, :32] = 1.0
    model.zero_grad()
    output = model(before, after, prompts, captions=CAPTIONS[:2], masks_before=masks, masks_after=masks)
    assert torch.isfinite(output.caption_loss) and torch.isfinite(output.attn_loss) and output.fac_pairs == 2
    assert output.attention_before.shape == (2, 16, 16)
    assert torch.allclose(output.attention_before.sum(dim=(1, 2)), torch.ones(2), atol=1e-5)
    output.attn_loss.backward()  # FAC alone reaches the vision LoRA of the layer it reads
    last = len(model.core.model.vision_tower.encoder.layers) - 1
    grads = {
        name: parameter.grad
        for name, parameter in model.named_parameters()
        if f"vision_tower.encoder.layers.{last}.self_attn.q_proj.lora_B" in name
    }
    assert grads and all(grad is not None and grad.abs().sum() > 0 for grad in grads.values())
    model.zero_grad()

    captions = model.generate(before, after, prompts, max_new_tokens=4)
    assert isinstance(captions, list) and len(captions) == 2 and all(isinstance(c, str) for c in captions)
    assert model.generate(before, after, prompts, max_new_tokens=4, num_beams=2)  # beams expand the token types
    captions, maps_before, maps_after = model.generate(before, after, prompts, max_new_tokens=4, return_attention=True)
    assert maps_before.shape == maps_after.shape == (2, 16, 16)
    model.eval()
    with torch.no_grad():
        reference = model(before, after, prompts)
    model.train()
    assert torch.allclose(maps_before, reference.attention_before, atol=1e-6)
    assert torch.allclose(maps_after, reference.attention_after, atol=1e-6)


def test_the_image_tokens_attend_to_each_other(batch):
    """The processor's token types reach the model: with them a picture's soft tokens see each other (Gemma 3's
    bidirectional image attention), so the logits of the first soft token differ from a causal pass."""
    before, after, prompts = batch
    model = build(train_mode="full").eval()
    perturb(model)
    pixels = model._pixel_inputs(before, after)
    ids = torch.tensor(model._prompt_ids(prompts[:1]))
    first = ids[0].tolist().index(model.tokenizer.convert_tokens_to_ids("<image_soft_token>"))
    with torch.no_grad():
        pixels = {"pixel_values": pixels["pixel_values"][:2]}
        typed = model.core(input_ids=ids, **pixels, **model._token_types(ids)).logits
        causal = model.core(input_ids=ids, **pixels).logits
    assert torch.equal(typed[0, :first], causal[0, :first])
    assert not torch.allclose(typed[0, first], causal[0, first], atol=1e-4)


# --------------------------------------------------------------------------------------------- save and load
def logits(model, batch) -> torch.Tensor:
    before, after, prompts = batch
    model.eval()
    with torch.no_grad():
        return model(before, after, prompts, captions=CAPTIONS[:2]).logits


def test_preset_round_trip(model, batch, tmp_path):
    perturb(model, seed=3, projector=False)
    model.save_pretrained(tmp_path / "saved")
    again = load_davir_model(tmp_path / "saved")
    assert type(again).__name__ == "ChatDavirModel" and again.config.family == "gemma3"
    assert torch.equal(logits(again, batch), logits(model, batch))


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory) -> Path:
    """A user's Gemma 3 folder: a model's ``save_pretrained`` and its processor's, side by side."""
    folder = tmp_path_factory.mktemp("gemma3_user")
    source = build(train_mode="full")
    source.core.save_pretrained(str(folder))
    source.processor.save_pretrained(str(folder))
    return folder


def test_pretrained_folder_round_trip_saves_only_the_adapter(user_folder, batch, tmp_path):
    config = DavirModelConfig(family="gemma3", pretrained=str(user_folder), image_size=S)
    model = build_davir_model(config)
    perturb(model, seed=5, projector=False)
    expected = logits(model, batch)
    model.save_pretrained(tmp_path / "saved")
    assert sorted(path.name for path in (tmp_path / "saved").iterdir()) == ["adapter", "davir_config.json", "processor"]
    adapter = tmp_path / "saved" / "adapter"
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    assert saved and all("lora_" in name for name in saved)  # no frozen base weight
    again = load_davir_model(tmp_path / "saved")
    assert again.config.pretrained == str(user_folder)
    assert torch.equal(logits(again, batch), expected)


def test_a_gemma3_folder_is_not_another_family(user_folder):
    with pytest.raises(DataError, match=r"'gemma3' model.*model\.family=smolvlm"):
        build_davir_model(DavirModelConfig(family="smolvlm", pretrained=str(user_folder)))
