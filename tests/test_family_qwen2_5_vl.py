"""model.family=qwen2_5_vl: the real Qwen2.5-VL classes at toy size — the window-order map put back in raster order,
and the ViT's windows through packed SDPA calls. What every family does (the processor's own tokens and pixels, FAC's
hook against eager attention, LoRA, save and load) is tests/test_family_contract.py; the command path of every
family: tests/test_family_commands.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_cases import painted_patches, pictures  # noqa: E402

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


def test_raster_order_undoes_the_window_permutation():
    """Each patch of a 16×16 grid is painted with its raster number; the processor lists the patches by merge unit,
    the ViT permutes merge units into windows (HF's own get_vision_window_index): raster_order finds each back."""
    from transformers.vision_utils import get_vision_window_index

    from davir.models.families.qwen2_5_vl import raster_order

    side, patch, merge, window = 16, 4, 2, 16  # 4 × 4 windows of 2 × 2 merge units
    processor_order = painted_patches(side, patch, merge)  # the raster number of each patch, in the processor's order
    window_index, _ = get_vision_window_index(
        torch.tensor([[1, side, side]]), spatial_merge_size=merge, window_size=window * patch // 4 * 2, patch_size=patch
    )
    block_order = processor_order.reshape(-1, merge * merge)[window_index].reshape(-1)
    assert sorted(block_order.tolist()) == list(range(side * side))
    assert block_order.tolist() != sorted(block_order.tolist())  # the permutation is not the identity
    order = raster_order((side, side), merge, window * patch // 4 * 2, patch)
    assert block_order[order].tolist() == list(range(side * side))


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
    pixels = model.image_processor(pictures(4, seed=2))
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
