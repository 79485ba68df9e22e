"""The Qwen3-VL family (``davir.models.families.qwen3_vl``): the real Qwen3-VL classes at toy size — the chat turn,
pixels and grids equal the processor's own, the FAC hook equals the eager attention of the last ViT block, the map is
in raster order, LoRA sits where the family says (DeepStack mergers included), FAC trains the vision LoRA, and a
saved model (preset or a user's folder) comes back with the same logits. The command path: test_family_commands."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.config import ConfigError  # noqa: E402
from davir.errors import DataError  # noqa: E402
from davir.models.families import get_family  # noqa: E402
from davir.models.families.qwen3_vl import raster_order  # noqa: E402
from davir.models.vlm.build import build_davir_model, load_davir_model  # noqa: E402
from davir.models.vlm.config import DavirModelConfig  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CAPTIONS = ["the small red metal cube moved", "there is no change", "the large blue sphere changed to green"]
ENTITIES = [["small red metal cube"], ["large blue sphere"]]
S = 64  # the tiny preset's picture size: 8×8 patches of 8 px, 16 image tokens after the 2×2 merger


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
    config = DavirModelConfig(family="qwen3_vl", preset="tiny", **overrides)
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


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory) -> Path:
    """A user's Qwen3-VL folder: the real classes' save_pretrained with a byte-level BPE Qwen2Tokenizer."""
    texts = [*CAPTIONS, "the scene is the same as before", EpcConfig().prompt, EpcConfig().entity_prefix]
    return write_chat_folder("qwen3_vl", tmp_path_factory.mktemp("qwen3") / "Qwen3-VL-toy", texts)


# ------------------------------------------------------------------------------------------- images and chat turn
def test_tokens_pixels_and_token_types_are_the_processors_own(user_folder):
    """Our token ids, multimodal token types and image tensors for a batch of pairs are exactly the processor's own
    ``processor(text=…, images=…)`` on the S×S pictures (the user's folder: the real tokenizer class)."""
    model = build_davir_model(DavirModelConfig(family="qwen3_vl", pretrained=str(user_folder), image_size=S))
    assert type(model.tokenizer).__name__ == "Qwen2Tokenizer" and model.patch_grid == (8, 8)
    processor = model.processor
    prompts = model.build_prompts(ENTITIES)
    messages = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": p}]}]
        for p in prompts
    ]
    texts = [processor.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    resized = [p.convert("RGB").resize((S, S), Image.Resampling.BICUBIC) for p in pictures(4)]
    reference = processor(text=texts, images=resized, return_tensors="pt", padding=True)
    ours = model._prompt_ids(prompts)
    for row, ids in enumerate(ours):
        kept = reference["attention_mask"][row].bool()
        assert ids == reference["input_ids"][row][kept].tolist()
        types = model._token_types(torch.tensor([ids]))["mm_token_type_ids"][0]
        assert types.tolist() == reference["mm_token_type_ids"][row][kept].tolist()
        assert ids.count(processor.image_token_id) == 32  # 16 per picture
    pixels = model.image_processor(pictures(4))
    inputs = model._pixel_inputs(pixels[0::2], pixels[1::2])
    assert inputs["pixel_values"].shape == (4 * 64, 3 * 2 * 8 * 8)
    assert torch.equal(inputs["pixel_values"], reference["pixel_values"])
    assert torch.equal(inputs["image_grid_thw"], reference["image_grid_thw"])
    assert reference["image_grid_thw"].tolist() == [[1, 8, 8]] * 4
    # Qwen3-VL's layout: both pictures, then the prompt, in one user turn; no system turn.
    one = "<|vision_start|>" + "<|image_pad|>" * 16 + "<|vision_end|>"
    assert model.chat_text(prompts[0]) == f"<|im_start|>user\n{one}{one}{prompts[0]}<|im_end|>\n<|im_start|>assistant\n"


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
        build(image_size=40)
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
    from transformers import Qwen2VLImageProcessor
    from transformers.vision_utils import get_vision_position_ids

    side, patch, merge = 16, 4, 2
    image = np.zeros((side * patch, side * patch, 3), dtype=np.uint8)
    for r in range(side * side):
        row, col = divmod(r, side)
        image[row * patch : (row + 1) * patch, col * patch : (col + 1) * patch] = r
    processor = Qwen2VLImageProcessor(
        patch_size=patch,
        merge_size=merge,
        temporal_patch_size=2,
        do_normalize=False,
        do_rescale=False,
        size={"shortest_edge": 16, "longest_edge": 10**6},
    )
    pixels = processor(images=[Image.fromarray(image)], return_tensors="pt")["pixel_values"]
    processor_order = pixels[:, 0].round().long()  # the raster number of each patch, in the processor's order
    assert processor_order.tolist() != list(range(side * side))  # merge-unit order is not raster order
    order = raster_order((side, side), merge)
    assert processor_order[order].tolist() == list(range(side * side))
    positions = get_vision_position_ids(torch.tensor([[1, side, side]]), merge)  # (tokens, 2): row, column
    rows, cols = torch.arange(side * side) // side, torch.arange(side * side) % side
    assert torch.equal(positions[order], torch.stack([rows, cols], dim=1).to(positions.dtype))


# ------------------------------------------------------------------------------------------------------- FAC
def _hooked_and_eager_maps(attn_implementation: str):
    """The FAC maps of the hook, and the eager attention's probabilities of every ViT block (recorded by wrapping
    the eager attention function the blocks call), on the same seeded weights with non-zero LoRA."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3

    model = build(attn_implementation=attn_implementation, seed=3).eval()  # eval: no LoRA dropout
    perturb_lora(model)
    blocks = {id(block.attn): index for index, block in enumerate(model.core.model.visual.blocks)}
    recorded: dict[int, list[torch.Tensor]] = {}
    original = qwen3.eager_attention_forward

    def recording(module, *args, **kwargs):
        output, weights = original(module, *args, **kwargs)
        if id(module) in blocks:
            recorded.setdefault(blocks[id(module)], []).append(weights.detach())
        return output, weights

    pixels = model.image_processor(pictures(4, seed=1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(qwen3, "eager_attention_forward", recording)
        output = model(pixels[0::2], pixels[1::2], model.build_prompts(None, batch_size=2))
    maps = torch.stack([output.attention_before, output.attention_after], dim=1).reshape(4, 8, 8)
    return model, maps, recorded


def test_fac_hook_equals_eager_attention_of_the_last_block_and_keeps_sdpa():
    model, hooked, recorded = _hooked_and_eager_maps("eager")
    visual = model.core.model.visual
    last = len(visual.blocks) - 1
    assert last == 2 and last not in visual.deepstack_visual_indexes  # DeepStack reads blocks 0 and 1
    assert len(recorded[last]) == 4 and recorded[last][0].shape == (1, 4, 64, 64)  # one call per image, 4 heads
    received = {
        index: torch.stack([w[0].float().mean(dim=(0, 1)) for w in weights]) for index, weights in recorded.items()
    }  # mean over heads and queries, in the ViT's order
    eager_maps = model.family.attention_maps((received[last], 2), 4, (8, 8))
    assert torch.allclose(hooked, eager_maps, atol=1e-6, rtol=0)
    assert torch.allclose(hooked.sum(dim=(1, 2)), torch.ones(4), atol=1e-5)
    assert not torch.allclose(received[0], received[last], atol=1e-4)  # it reads the last block, not another
    _, fast, not_called = _hooked_and_eager_maps("sdpa")  # same seed: same weights, SDPA kernel in place
    assert not not_called and torch.allclose(fast, hooked, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------------ LoRA
def test_lora_sits_on_vision_qkv_mergers_and_llm_attention(model):
    names = [name.removeprefix("base_model.model.") for name, _ in model.vlm.named_modules() if name.endswith("lora_A")]
    visual = model.core.model.visual
    layers, text_layers = len(visual.blocks), len(model.core.model.language_model.layers)
    for index in range(layers):
        assert f"model.visual.blocks.{index}.attn.qkv.lora_A" in names
    mergers = ["merger", *(f"deepstack_merger_list.{i}" for i in range(len(visual.deepstack_merger_list)))]
    for merger in mergers:
        for linear in ("linear_fc1", "linear_fc2"):
            assert f"model.visual.{merger}.{linear}.lora_A" in names
    for index in range(text_layers):
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert f"model.language_model.layers.{index}.self_attn.{projection}.lora_A" in names
    assert len(names) == layers + 2 * len(mergers) + 4 * text_layers == 3 + 6 + 8
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    summary = model.trainable_parameter_summary()
    assert set(summary) == {"vision", "projector", "language_model", "lm_head", "all"}
    assert summary["lm_head"][0] == 0 and all(
        summary[part][0] > 0 for part in ("vision", "projector", "language_model")
    )

    extra = build(extra_trainable=("projector",))
    trainable = {name for name, parameter in extra.named_parameters() if parameter.requires_grad}
    assert "vlm.base_model.model.model.visual.merger.linear_fc1.base_layer.weight" in trainable
    assert all("lora_" in name or ".visual.merger." in name for name in trainable)
    deep = build(extra_trainable=("deepstack_projectors",))
    trainable = {name for name, parameter in deep.named_parameters() if parameter.requires_grad}
    assert all("lora_" in name or ".deepstack_merger_list." in name for name in trainable)
    assert "vlm.base_model.model.model.visual.deepstack_merger_list.1.norm.weight" in trainable
    with pytest.raises(ValueError, match=r"extra_trainable.*qwen3_vl.*deepstack_projectors.*projector"):
        DavirModelConfig(family="qwen3_vl", extra_trainable=("query_tokens",))


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
    output.attn_loss.backward()  # FAC alone reaches the vision LoRA of the block it reads
    last = len(model.core.model.visual.blocks) - 1
    grads = {
        name: parameter.grad
        for name, parameter in model.named_parameters()
        if f"visual.blocks.{last}.attn.qkv.lora_B" in name
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
    assert type(again).__name__ == "ChatDavirModel" and again.config.family == "qwen3_vl"
    assert torch.equal(logits(again, batch), logits(model, batch))


def test_pretrained_folder_round_trip_saves_only_the_adapter(user_folder, tmp_path):
    model = build_davir_model(DavirModelConfig(family="qwen3_vl", pretrained=str(user_folder), image_size=S))
    perturb_lora(model, seed=5)
    pixels = model.image_processor(pictures(4))
    batch = (pixels[0::2], pixels[1::2], model.build_prompts(ENTITIES))
    expected = logits(model, batch)
    model.save_pretrained(tmp_path / "saved")
    assert sorted(path.name for path in (tmp_path / "saved").iterdir()) == ["adapter", "davir_config.json", "processor"]
    saved = load_file(str(tmp_path / "saved" / "adapter" / "adapter_model.safetensors"))
    assert saved and all("lora_" in name for name in saved)  # no frozen base weight
    again = load_davir_model(tmp_path / "saved")
    assert again.config.pretrained == str(user_folder)
    assert torch.equal(logits(again, batch), expected)


def test_a_qwen3_vl_folder_is_not_another_family(user_folder, tmp_path):
    with pytest.raises(DataError, match=r"'qwen3_vl' model.*model\.family=qwen2_5_vl"):
        build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(user_folder)))
    other = write_chat_folder("qwen2_5_vl", tmp_path / "qwen2_5", [*CAPTIONS, EpcConfig().prompt])
    with pytest.raises(DataError, match=r"'qwen2_5_vl' model, not 'qwen3_vl'.*model\.family=qwen3_vl"):
        build_davir_model(DavirModelConfig(family="qwen3_vl", pretrained=str(other)))
