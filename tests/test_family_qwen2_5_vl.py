"""model.family=qwen2_5_vl: the real Qwen2.5-VL classes at toy size, from a folder written by save_pretrained with a
byte-level BPE Qwen2Tokenizer trained offline — the processor's own tokens and pixels, FAC's hook against eager
attention, the window-order map put back in raster order, the LoRA targets. The command path of every family:
tests/test_family_commands.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.errors import DataError  # noqa: E402
from davir.models.vlm.build import build_davir_model  # noqa: E402
from davir.models.vlm.config import DavirModelConfig  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TEXTS = [
    "the small red metal cube moved",
    "there is no change",
    "the large blue rubber sphere changed to green",
    "the scene is the same as before",
    EpcConfig().prompt,
    EpcConfig().entity_prefix,
]


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory, synthetic_set):
    from davir.data.formats import read_dataset

    root = synthetic_set(24, 0)
    texts = [
        c
        for split in ("train", "val", "test")
        for p in read_dataset("clevr_change", root, split).pairs
        for c in p.captions
    ]
    return write_chat_folder("qwen2_5_vl", tmp_path_factory.mktemp("qwen") / "Qwen2.5-VL-toy", [*TEXTS, *texts])


def _pictures(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (48, 60, 3), dtype=np.uint8)) for _ in range(count)]


def test_tokens_and_pixels_are_the_processors_own(user_folder):
    model = build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(user_folder), image_size=64))
    assert type(model.tokenizer).__name__ == "Qwen2Tokenizer" and model.image_size == 64 and model.patch_grid == (8, 8)
    pictures = _pictures(2)
    prompt = model.build_prompts([["small red metal cube"]])[0]
    assert prompt == "Describe the difference between the two images. Entity: small red metal cube."
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": prompt}]}]
    text = model.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    reference = model.processor(
        text=[text], images=[p.resize((64, 64), Image.Resampling.BICUBIC) for p in pictures], return_tensors="pt"
    )
    pixels = model.image_processor(pictures)
    assert model._prompt_ids([prompt])[0] == reference["input_ids"][0].tolist()
    assert torch.equal(model._pixel_inputs(pixels[:1], pixels[1:])["pixel_values"], reference["pixel_values"])
    assert torch.equal(model._pixel_inputs(pixels[:1], pixels[1:])["image_grid_thw"], reference["image_grid_thw"])
    # The one-picture turn of the description stage (davir.pretrain_tiny): the processor's own tokens and pixels too.
    describe = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
    text = model.processor.apply_chat_template(describe, add_generation_prompt=True, tokenize=False)
    single = model.processor(
        text=[text], images=[pictures[1].resize((64, 64), Image.Resampling.BICUBIC)], return_tensors="pt"
    )
    assert model._prompt_ids(["Describe the image."], images=1)[0] == single["input_ids"][0].tolist()
    assert torch.equal(model._pixel_inputs(pixels[1:])["pixel_values"], single["pixel_values"])
    assert single["input_ids"][0].tolist().count(model.processor.image_token_id) == 16
    # 16 image tokens (8×8 patches, 2×2 merger) per picture, before then after, then the prompt
    image_id = model.processor.image_token_id
    ids = reference["input_ids"][0].tolist()
    assert ids.count(image_id) == 32 and ids.index(image_id) < len(ids) - 20


def test_raster_order_undoes_the_window_permutation():
    """Each patch of a 16×16 grid is painted with its raster number; the processor lists the patches by merge unit,
    the ViT permutes merge units into windows (HF's own get_vision_window_index): raster_order finds each back."""
    from transformers import Qwen2VLImageProcessor
    from transformers.vision_utils import get_vision_window_index

    from davir.models.families.qwen2_5_vl import raster_order

    side, patch, merge, window = 16, 4, 2, 16  # 4 × 4 windows of 2 × 2 merge units
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
    window_index, _ = get_vision_window_index(
        torch.tensor([[1, side, side]]), spatial_merge_size=merge, window_size=window * patch // 4 * 2, patch_size=patch
    )
    block_order = processor_order.reshape(-1, merge * merge)[window_index].reshape(-1)
    assert sorted(block_order.tolist()) == list(range(side * side))
    assert block_order.tolist() != sorted(block_order.tolist())  # the permutation is not the identity
    order = raster_order((side, side), merge, window * patch // 4 * 2, patch)
    assert block_order[order].tolist() == list(range(side * side))


def _hooked_and_eager_maps(attn_implementation: str):
    """The FAC maps of the hook, and the eager attention's probabilities of the same block (recorded by wrapping
    the eager attention function the block calls), on the same seeded weights."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

    model = build_davir_model(
        DavirModelConfig(
            family="qwen2_5_vl", preset="tiny", train_mode="lora", attn_implementation=attn_implementation, seed=3
        ),
        captions_for_tokenizer=TEXTS,
    )
    visual = model.core.model.visual
    target = visual.blocks[max(visual.fullatt_block_indexes)].attn
    recorded: list[torch.Tensor] = []
    original = qwen.eager_attention_forward

    def recording(module, *args, **kwargs):
        output, weights = original(module, *args, **kwargs)
        if module is target:
            recorded.append(weights.detach())
        return output, weights

    pixels = model.image_processor(_pictures(4, seed=1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(qwen, "eager_attention_forward", recording)
        output = model(pixels[0::2], pixels[1::2], model.build_prompts(None, batch_size=2))
    maps = torch.stack([output.attention_before, output.attention_after], dim=1).reshape(4, 8, 8)
    return model, maps, recorded


def test_fac_hook_equals_eager_attention_and_keeps_sdpa():
    model, hooked, recorded = _hooked_and_eager_maps("eager")
    assert len(recorded) == 4 and recorded[0].shape == (1, 4, 64, 64)  # one chunk per image, 4 heads
    received = torch.stack([w[0].float().mean(dim=(0, 1)) for w in recorded])  # mean over heads and queries
    family = model.family
    geometry = (2, model.core.config.vision_config.window_size, 8)
    eager_maps = family.attention_maps((received, geometry), 4, (8, 8))
    assert torch.allclose(hooked, eager_maps, atol=1e-6, rtol=0)
    assert torch.allclose(hooked.sum(dim=(1, 2)), torch.ones(4), atol=1e-5)
    _, fast, not_called = _hooked_and_eager_maps("sdpa")  # same seed: same weights, SDPA kernel in place
    assert not not_called and torch.allclose(fast, hooked, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("size", "vision_calls"),
    [
        (64, (36, 3)),  # 8×8 patches: 4 windows of 4×4 an image, all alike; split: 2 window blocks × 4 × 4 images + 4
        (80, (76, 7)),  # 10×10: 9 windows of 16, 8 or 4 patches (edge windows are smaller): packed 2 × 3 lengths + 1
    ],
)
def test_packed_window_attention_equals_transformers_per_window_sdpa(size, vision_calls):
    """The ViT's windows through a few batched SDPA calls (davir.models.vlm.window_attention) give the losses, FAC
    maps and LoRA gradients of transformers' SDPA call per window."""
    from davir.models.vlm.window_attention import PACKED_ATTENTION

    model = build_davir_model(
        DavirModelConfig(family="qwen2_5_vl", preset="tiny", train_mode="lora", image_size=size, seed=3),
        captions_for_tokenizer=TEXTS,
    )
    visual = model.core.model.visual
    assert {block.attn.config._attn_implementation for block in visual.blocks} == {PACKED_ATTENTION}
    assert model.core.config.text_config._attn_implementation == "sdpa"  # the LLM keeps transformers' SDPA
    pixels = model.image_processor(_pictures(4, seed=2))
    masks = torch.zeros(2, size, size)
    masks[:, : size // 2, : size // 3] = 1.0
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls: list[tuple[int, ...]] = []

    def counted(*args, **kwargs):
        calls.append(tuple(args[0].shape))
        return sdpa(*args, **kwargs)

    def step():
        calls.clear()
        model.zero_grad()
        torch.manual_seed(0)  # the LoRA dropout masks
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
            output = model(
                pixels[0::2],
                pixels[1::2],
                model.build_prompts(None, batch_size=2),
                captions=TEXTS[:2],
                masks_before=masks,
                masks_after=masks,
            )
        output.loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
        return output, grads, len(calls) - 2  # the 2 LLM layers call SDPA once each

    packed, packed_grads, packed_calls = step()
    visual.config._attn_implementation = "sdpa"  # transformers' own path
    split, split_grads, split_calls = step()
    assert (split_calls, packed_calls) == vision_calls
    for name in ("loss", "caption_loss", "attn_loss", "attention_before", "attention_after"):
        torch.testing.assert_close(getattr(packed, name), getattr(split, name), atol=1e-6, rtol=1e-5)
    assert packed_grads.keys() == split_grads.keys() and any("visual" in name for name in packed_grads)
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, split_grads[name], atol=1e-6, rtol=1e-4, msg=name)


def test_lora_targets_exist_and_only_they_train(user_folder):
    model = build_davir_model(DavirModelConfig(family="qwen2_5_vl", pretrained=str(user_folder), image_size=64))
    adapted = {name.split(".lora_A")[0] for name, _ in model.named_parameters() if ".lora_A." in name}
    assert any(".visual.blocks.1.attn.qkv" in n for n in adapted)
    assert any(".visual.merger.mlp.0" in n for n in adapted) and any(".visual.merger.mlp.2" in n for n in adapted)
    assert {
        p
        for p in ("q_proj", "k_proj", "v_proj", "o_proj")
        if any(f"language_model.layers.0.self_attn.{p}" in n for n in adapted)
    } == {"q_proj", "k_proj", "v_proj", "o_proj"}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    summary = model.trainable_parameter_summary()
    assert {"vision", "projector", "language_model"} <= set(summary) and summary["all"][0] == sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )
    with pytest.raises(ValueError, match="extra_trainable.*qwen2_5_vl.*projector"):
        DavirModelConfig(family="qwen2_5_vl", extra_trainable=("query_tokens",))
    with pytest.raises(ValueError, match="segment_embeddings"):
        DavirModelConfig(family="qwen2_5_vl", segment_embeddings=True)
    with pytest.raises(DataError, match="holds a 'qwen2_5_vl' model.*model.family=instructblip"):
        build_davir_model(DavirModelConfig(pretrained=str(user_folder)))
