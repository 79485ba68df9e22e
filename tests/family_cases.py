"""The seven model families as rows of one table: what tests/test_family_contract.py holds every family to, and
the helpers the family files share (pictures, LoRA perturbation, a batch of pairs, logits).

A row says where a family differs: the processor call its inputs must equal, where FAC reads and how the eager
attention probabilities of that layer become the expected map, where LoRA sits, what its parameter summary holds,
what a user's folder of it is and which family must refuse that folder. Numbers are the tiny presets' (S = 64 px,
3 vision layers, 2 LLM layers).

    from family_cases import CASES, build, pair_batch
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_fixtures import write_chat_folder  # noqa: E402

from davir.models.vlm.build import build_davir_model  # noqa: E402
from davir.models.vlm.config import DavirModelConfig  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

CAPTIONS = ["the small red metal cube moved", "there is no change", "the large blue sphere changed to green"]
ENTITIES = [["small red metal cube"], ["large blue sphere"]]
S = 64  # every tiny preset's picture size
LLM_LAYERS = 2  # every tiny preset's
ATTENTION = ("q_proj", "k_proj", "v_proj")


# ---------------------------------------------------------------------------------------------------------- helpers
def pictures(count: int, seed: int = 0) -> list[Image.Image]:
    """Random RGB pictures of different, non-square sizes (the family resizes them to S×S)."""
    generator = torch.Generator().manual_seed(seed)
    result = []
    for index in range(count):
        height, width = 48 + 8 * index, 80 - 4 * index
        values = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
        result.append(Image.fromarray(values.numpy()))
    return result


def resized_pictures(count: int = 4) -> list[Image.Image]:
    """:func:`pictures` at S×S, as the families hand them to their processors."""
    return [p.convert("RGB").resize((S, S), Image.Resampling.BICUBIC) for p in pictures(count)]


def perturb(model, seed: int = 1, pattern: str = "lora_B") -> None:
    """Random values (× 0.05) for the weights whose names match ``pattern``: PEFT starts the LoRA B matrices at
    zero (Gemma 3 its projector), so without this the adapters change nothing the model computes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if re.search(pattern, name):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)


def build(family: str, **overrides):
    """The family's tiny preset, its tokenizer learned from CAPTIONS."""
    config = DavirModelConfig(family=family, preset="tiny", **overrides)
    return build_davir_model(config, captions_for_tokenizer=CAPTIONS)


def pair_batch(model) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Two pairs of :func:`pictures` through the model's image processor, with entity prompts."""
    pixels = model.image_processor(pictures(4))
    return pixels[0::2], pixels[1::2], model.build_prompts(ENTITIES)


def logits(model, batch) -> torch.Tensor:
    before, after, prompts = batch
    model.eval()
    with torch.no_grad():
        return model(before, after, prompts, captions=CAPTIONS[:2]).logits


def names(pattern: str, layers: int, projections: tuple[str, ...] = ("",)) -> list[str]:
    """``pattern`` with {i} over the layers and {p} over the projections."""
    return [pattern.format(i=i, p=p) for i in range(layers) for p in projections]


def painted_patches(side: int, patch: int, merge: int) -> torch.Tensor:
    """A side×side grid of patch×patch squares, each painted with its raster number, through a Qwen-VL image
    processor: the raster number of each patch in the processor's order (merge unit by merge unit)."""
    import numpy as np
    from transformers import Qwen2VLImageProcessor

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
    return pixels[:, 0].round().long()


@contextmanager
def eager_attention(case: FamilyCase, model) -> Iterator[dict[int, list[torch.Tensor]]]:
    """The attention probabilities of every eager call of the family's vision attention layers while in the
    block, by layer index (the function the layers call, wrapped; the LLM's and Q-Former's calls are left out)."""
    module = importlib.import_module(case.attention_module)
    layers = {id(attention): index for index, attention in enumerate(case.attentions(model.core))}
    calls: dict[int, list[torch.Tensor]] = {}
    original = module.eager_attention_forward

    def recording(attention, *args, **kwargs):
        output, weights = original(attention, *args, **kwargs)
        if id(attention) in layers:
            calls.setdefault(layers[id(attention)], []).append(weights.detach())
        return output, weights

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "eager_attention_forward", recording)
        yield calls


# ------------------------------------------------------------------------------------ inputs equal the processor's
def chat_reference(case: FamilyCase, model, prompts: list[str]):
    """The processor's own ``processor(text=…, images=…)`` for the chat turns of ``prompts`` and the S×S pictures."""
    processor = model.processor
    messages = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": p}]}]
        for p in prompts
    ]
    texts = [processor.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
    resized = resized_pictures()
    images = [resized[0:2], resized[2:4]] if case.nested_images else resized
    return processor(text=texts, images=images, return_tensors="pt", padding=True, **dict(case.processor_kwargs))


def check_chat_inputs(case: FamilyCase, model, batch) -> None:
    """Our token ids, token types and image inputs for a batch of pairs are exactly the processor's own."""
    before, after, prompts = batch
    reference = chat_reference(case, model, prompts)
    type_keys = {key for key in ("token_type_ids", "mm_token_type_ids") if key in reference}
    for row, ids in enumerate(model._prompt_ids(prompts)):
        kept = reference["attention_mask"][row].bool()
        assert ids == reference["input_ids"][row][kept].tolist()
        assert ids.count(model.core.config.image_token_id) == 2 * case.image_tokens
        types = model._token_types(torch.tensor([ids]))
        assert set(types) == type_keys
        for key, value in types.items():
            assert value[0].tolist() == reference[key][row][kept].tolist(), key
            assert int(value.sum()) == 2 * case.image_tokens, key
    inputs = model._pixel_inputs(before, after)
    assert set(inputs) == set(case.pixel_keys) and tuple(inputs["pixel_values"].shape) == case.pixel_shape
    for key in case.pixel_keys:
        assert torch.equal(inputs[key], reference[key]), key
    if case.inputs_extra is not None:
        case.inputs_extra(model, batch, reference)


def check_instructblip_inputs(case: FamilyCase, model, batch) -> None:
    """What the model hands InstructBLIP is ``InstructBlipProcessor``'s own for the before pictures, then the after
    pictures, each with its pair's prompt: the pixels and Q-Former ids the ViT and Q-Former see, and the LLM's
    prompt ids after the processor's Q image placeholders (DAVIR puts the 2Q visual tokens there itself)."""
    before, after, prompts = batch
    shown = pictures(4)
    reference = model.processor(
        images=shown[0::2] + shown[1::2], text=prompts + prompts, return_tensors="pt", padding=True
    )
    seen: dict[str, Any] = {}
    real = model.core.get_image_features

    def spying(pixels, **kwargs):
        seen.update(kwargs, pixels=pixels)
        return real(pixels, **kwargs)

    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(model.core, "get_image_features", spying)
        model(before, after, prompts)
    assert seen["pixels"].shape == (4, 3, S, S) and torch.equal(seen["pixels"], reference["pixel_values"])
    assert torch.equal(seen["qformer_input_ids"], reference["qformer_input_ids"])
    assert torch.equal(seen["qformer_attention_mask"], reference["qformer_attention_mask"])
    placeholders = [model.tokenizer.convert_tokens_to_ids(str(model.processor.image_token))] * model.num_query_tokens
    for row, ids in enumerate(model._prompt_ids(prompts)):
        expected = reference["input_ids"][row][reference["attention_mask"][row].bool()].tolist()
        assert expected[: model.num_query_tokens] == placeholders and ids == expected[model.num_query_tokens :]


def llava_chat_path(model, batch, reference) -> None:
    """The processor's chat path with the pictures in the message does the same: one sample of two images."""
    resized = resized_pictures()
    content = [
        {"type": "image", "image": resized[0]},
        {"type": "image", "image": resized[1]},
        {"type": "text", "text": batch[2][0]},
    ]
    own = model.processor.apply_chat_template(
        [[{"role": "user", "content": content}]],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )
    assert own["batch_num_images"].tolist() == [2]
    assert torch.equal(own["pixel_values"], reference["pixel_values"][:2])
    assert int((own["input_ids"] == model.core.config.image_token_id).sum()) == 2 * 65


def internvl_tiler(model, batch, reference) -> None:
    """The tiler (crop_to_patches, the processor's default) makes one tile of an S×S picture too: nothing lost."""
    tiled = model.processor.image_processor(images=resized_pictures(1), crop_to_patches=True, return_tensors="pt")
    assert tiled["num_patches"].tolist() == [1] and torch.equal(tiled["pixel_values"], reference["pixel_values"][:1])


def gemma_one_bos(model, batch, reference) -> None:
    """One <bos> a turn: the template's (the processor is called with add_special_tokens=False)."""
    assert [ids.count(model.tokenizer.bos_token_id) for ids in model._prompt_ids(batch[2])] == [1, 1]


def qwen_grids(model, batch, reference) -> None:
    """One 8×8 grid a picture (the S×S picture stays S×S)."""
    assert reference["image_grid_thw"].tolist() == [[1, 8, 8]] * 4


def qwen_one_picture_turn(model, batch, reference) -> None:
    """The one-picture turn of the description stage (davir.pretrain_tiny): the processor's tokens and pixels."""
    qwen_grids(model, batch, reference)
    processor = model.processor
    describe = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the image."}]}]
    text = processor.apply_chat_template(describe, add_generation_prompt=True, tokenize=False)
    single = processor(text=[text], images=resized_pictures(2)[1:], return_tensors="pt")
    assert model._prompt_ids(["Describe the image."], images=1)[0] == single["input_ids"][0].tolist()
    assert torch.equal(model._pixel_inputs(batch[1][:1])["pixel_values"], single["pixel_values"])
    assert single["input_ids"][0].tolist().count(processor.image_token_id) == 16


# -------------------------------------------------------------------------------------- eager attention → FAC map
def patch_received(model, weights: list[torch.Tensor]) -> torch.Tensor:
    """(pair, before/after, Hp, Wp): one call over the images in text order, no [CLS]: the mean over heads and
    queries of what each patch receives."""
    [probabilities] = weights
    return probabilities.mean(dim=(1, 2)).reshape(-1, 2, *model.patch_grid)


def patch_queries_received(model, weights: list[torch.Tensor]) -> torch.Tensor:
    """InternViT: patch queries to patch keys ([CLS] row and column dropped), renormalised over the patches."""
    [probabilities] = weights
    received = probabilities[:, :, 1:, 1:].mean(dim=(1, 2))
    return (received / received.sum(dim=-1, keepdim=True)).reshape(-1, 2, *model.patch_grid)


def cls_row(model, weights: list[torch.Tensor]) -> torch.Tensor:
    """InstructBLIP's Eq. 5: the [CLS] query's attention to the patches, mean over heads; the ViT's batch is
    every before picture, then every after picture."""
    [probabilities] = weights
    rows = probabilities[:, :, 0, 1:].mean(dim=1)
    return rows.reshape(2, -1, *model.patch_grid).transpose(0, 1)


def per_image_received(model, weights: list[torch.Tensor]) -> torch.Tensor | None:
    """Qwen's packed ViT: one call per image (a full-attention block; window blocks give more, and no map), in the
    ViT's patch order, put back in raster order by the family."""
    if weights[0].shape[-1] != model.patch_grid[0] * model.patch_grid[1]:
        return None
    received = torch.stack([w[0].float().mean(dim=(0, 1)) for w in weights])
    vision = model.core.config.vision_config
    geometry = (2, vision.window_size, vision.patch_size) if hasattr(vision, "window_size") else 2
    return model.family.attention_maps((received, geometry), 4, model.patch_grid).reshape(-1, 2, *model.patch_grid)


def sharpen(model, layer: int) -> None:
    """Peaked attention in InternViT layer ``layer`` and a random [CLS] token (zero at initialisation): at random
    weights every query gives the [CLS] key about 1/(1 + T) of its attention, and maps that treat that share
    differently would agree to 1e-7."""
    generator = torch.Generator().manual_seed(2)
    tower = model.core.model.vision_tower
    attention = tower.encoder.layer[layer].attention
    with torch.no_grad():
        tower.embeddings.cls_token.copy_(torch.randn(tower.embeddings.cls_token.shape, generator=generator))
        for projection in (attention.q_proj, attention.k_proj):
            weight = getattr(projection, "base_layer", projection).weight
            weight.copy_(torch.randn(weight.shape, generator=generator) * 0.5)


def internvl_patch_queries(model, calls, layer: int) -> None:
    """The hook sits on the layer the projector reads; the [CLS] share is far from constant, and the [CLS] row [D]
    (what InstructBLIP supervises) is another map: the choice matters."""
    assert model.family.fac_attention(model.core) is model.core.model.vision_tower.encoder.layer[layer].attention
    [probabilities] = calls[layer]
    share = probabilities[:, :, 1:, 0]  # what each patch query gives the [CLS] key
    assert share.max() > 0.2 and share.min() < 0.01
    row = probabilities[:, :, 0, 1:].mean(dim=1)
    row = (row / row.sum(dim=-1, keepdim=True)).reshape(-1, 2, *model.patch_grid)
    assert (row - patch_queries_received(model, calls[layer])).abs().max() > 1e-3


def qwen3_not_deepstack(model, calls, layer: int) -> None:
    assert layer not in model.core.model.visual.deepstack_visual_indexes  # DeepStack reads blocks 0 and 1


# ------------------------------------------------------------------------------------------------- users' folders
def saved_preset_folder(name: str, folder: Path, request) -> Path:
    """A user's folder: a model's ``save_pretrained`` and its processor's, side by side."""
    source = build(name, train_mode="full")
    source.core.save_pretrained(str(folder))
    source.processor.save_pretrained(str(folder))
    return folder


def written_chat_folder(name: str, folder: Path, request) -> Path:
    """The real classes' save_pretrained with the family's real tokenizer class (tests/family_fixtures.py)."""
    texts = [*CAPTIONS, "the scene is the same as before", EpcConfig().prompt, EpcConfig().entity_prefix]
    return write_chat_folder(name, folder / "toy", texts)


def written_from_the_synthetic_set(name: str, folder: Path, request) -> Path:
    """As :func:`written_chat_folder`, the tokenizer trained on a synthetic set's captions too."""
    from davir.data.formats import read_dataset

    root = request.getfixturevalue("synthetic_set")(24, 0)
    texts = [
        c
        for split in ("train", "val", "test")
        for p in read_dataset("clevr_change", root, split).pairs
        for c in p.captions
    ]
    return write_chat_folder(name, folder / "toy", [*CAPTIONS, EpcConfig().prompt, EpcConfig().entity_prefix, *texts])


def llava_image_text(model, again) -> None:
    assert again.image_text == model.image_text  # the processor's settings came back


def internvl_image_tokens(model, again) -> None:
    assert model.processor.image_token == "<IMG_CONTEXT>" and model.processor.image_seq_length == 16


# ----------------------------------------------------------------------------------------------------------- table
@dataclass(frozen=True)
class FacVariant:
    """Preset overrides, and the index of the vision attention layer whose eager map the hook's must equal."""

    overrides: tuple[tuple[str, Any], ...]
    layer: int

    def __str__(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.overrides) or "default"


@dataclass(frozen=True)
class FamilyCase:
    """One family's row; the defaults are a chat family's on a SigLIP-style ViT (3 layers of q/k/v projections)."""

    name: str
    davir_class: str = "ChatDavirModel"
    grid: tuple[int, int] = (8, 8)  # the patch grid FAC supervises
    # inputs: the processor's own
    check_inputs: Callable[[FamilyCase, Any, Any], None] = check_chat_inputs
    chat_text: str | None = None  # the user turn, {image} for a picture's tokens; None: no chat turn
    image_text: str = ""  # one picture's tokens in the chat turn
    image_tokens: int = 16  # per picture
    pixel_keys: tuple[str, ...] = ("pixel_values",)  # the model's image inputs, each equal to the processor's
    pixel_shape: tuple[int, ...] = (4, 3, S, S)
    nested_images: bool = True  # processor(images=[[before, after], …]) rather than a flat list
    processor_kwargs: tuple[tuple[str, Any], ...] = ()
    inputs_extra: Callable[[Any, Any, Any], None] | None = None
    inputs_from_user_folder: bool = False  # the check runs on a user's folder (the family's real tokenizer class)
    # FAC
    attention_module: str = "transformers.models.siglip.modeling_siglip"  # its eager_attention_forward
    vision_layers: str = "model.vision_tower.encoder.layers"  # attribute path of the vision layers in the core
    attention: str = "self_attn"  # the attention module inside a layer
    eager_map: Callable[[Any, list[torch.Tensor]], torch.Tensor | None] = patch_received
    map_sums_to_one: bool = True  # False: a [CLS] row, its share of the [CLS] key left out
    eager_shapes: tuple[tuple[int, ...], ...] = ((4, 4, 64, 64),)  # the eager calls of the layer FAC reads
    fac_variants: tuple[FacVariant, ...] = (FacVariant((), 2),)
    fac_perturb: str = "lora_B"
    prepare_fac: Callable[[Any, int], None] | None = None
    fac_extra: Callable[[Any, dict, int], None] | None = None
    query_projection: str = "q_proj"  # FAC's gradient reaches this projection's LoRA in the layer it reads
    caption_reaches_vision: bool = True  # the caption loss's gradient reaches every vision LoRA at initialisation
    # LoRA and the trainable parts
    vision_projections: tuple[str, ...] = ATTENTION
    llm_layers: str = "model.language_model.layers"
    projector_lora: tuple[str, ...] = ()
    lora_count: int = 0
    summary_parts: tuple[str, ...] = ("vision", "projector", "language_model", "lm_head", "all")
    frozen_parts: tuple[str, ...] = ("lm_head",)  # nothing trains there by default
    exact_summary: tuple[tuple[str, tuple[int, int]], ...] = ()
    extra_part: str = "projector"  # extra_trainable trains it in full
    extra_weights: tuple[str, ...] = ()  # full weights it makes trainable
    extra_fragment: str = ""  # the names of that part's weights: all of them train, and nothing else but LoRA
    extra_summary: tuple[int, int] | None = None  # the summary's (trainable, total) of that part then
    extra_parts: tuple[str, ...] = ("projector",)  # every extra_trainable name the family has
    refused_extra: tuple[str, str] | None = None  # a part it has not and the ValueError; None: a chat family's
    segment_embeddings: bool = False  # model.segment_embeddings is the family's (else refused)
    # saved folders
    user_folder: Callable[[str, Path, Any], Path] = saved_preset_folder
    user_model_check: Callable[[Any, Any], None] | None = None
    refused_as: tuple[str, ...] = ("qwen2_5_vl",)

    def __str__(self) -> str:
        return self.name

    def attentions(self, core) -> list[torch.nn.Module]:
        """The vision attention modules of ``core``, layer by layer."""
        return [getattr(layer, self.attention) for layer in attrgetter(self.vision_layers)(core)]

    def lora_modules(self, vision_count: int) -> list[str]:
        """The LoRA A matrices' module names inside the core, as the family places them."""
        vision = names(
            f"{self.vision_layers}.{{i}}.{self.attention}.{{p}}.lora_A", vision_count, self.vision_projections
        )
        llm = names(f"{self.llm_layers}.{{i}}.self_attn.{{p}}_proj.lora_A", LLM_LAYERS, ("q", "k", "v", "o"))
        return [*vision, *(f"{name}.lora_A" for name in self.projector_lora), *llm]

    def extra_refusal(self) -> tuple[str, str]:
        """A part the family has not, for extra_trainable, and the ValueError's text."""
        if self.refused_extra is not None:
            return self.refused_extra
        choices = re.escape(str(list(self.extra_parts)))
        return (
            "query_tokens",
            rf"^extra_trainable \['query_tokens'\] unknown for model\.family={self.name}; choose from {choices}$",
        )


QWEN_TURN = "<|im_start|>user\n{image}{image}{prompt}<|im_end|>\n<|im_start|>assistant\n"
CHAT_ML_NEWLINES = "<|im_start|>user\n{image}\n{image}\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
TWO_LINEARS = {  # a multi_modal_projector of two linear layers (LLaVA-OneVision, InternVL)
    "projector_lora": ("model.multi_modal_projector.linear_1", "model.multi_modal_projector.linear_2"),
    "lora_count": 9 + 2 + 8,
    "extra_fragment": ".multi_modal_projector.",
}
QWEN = {  # the Qwen ViTs: packed images, one qkv projection, the processor's flat image list
    "chat_text": QWEN_TURN,
    "image_text": "<|vision_start|>" + "<|image_pad|>" * 16 + "<|vision_end|>",
    "pixel_keys": ("pixel_values", "image_grid_thw"),
    "pixel_shape": (4 * 64, 3 * 2 * 8 * 8),  # 8×8 patches of 3 × 2 frames × 8 × 8 values a picture
    "nested_images": False,
    "inputs_from_user_folder": True,
    "vision_layers": "model.visual.blocks",
    "attention": "attn",
    "eager_map": per_image_received,
    "eager_shapes": ((1, 4, 64, 64),) * 4,  # one call per image (a full-attention block), 4 heads
    "query_projection": "qkv",
    "vision_projections": ("qkv",),
    "extra_fragment": ".visual.merger.",
}
QFORMER_ATTENTION = tuple(
    f"{a}.attention.{p}" for a in ("attention", "crossattention") for p in ("query", "key", "value")
)

CASES: dict[str, FamilyCase] = {
    case.name: case
    for case in (
        FamilyCase(
            name="instructblip",
            davir_class="DavirModel",
            check_inputs=check_instructblip_inputs,
            attention_module="transformers.models.instructblip.modeling_instructblip",
            vision_layers="vision_model.encoder.layers",
            eager_map=cls_row,
            map_sums_to_one=False,
            eager_shapes=((4, 4, 65, 65),),  # (images, heads, [CLS] + 8×8, [CLS] + 8×8)
            query_projection="qkv",
            vision_projections=("qkv",),
            llm_layers="language_model.model.layers",
            projector_lora=tuple(names("qformer.encoder.layer.{i}.{p}", 2, QFORMER_ATTENTION)),  # the Q-Former's
            lora_count=3 + 12 + 8,
            summary_parts=("query_tokens", "vision", "qformer", "language_projection", "language_model", "all"),
            frozen_parts=("query_tokens", "language_projection"),
            extra_part="language_projection",
            extra_weights=tuple(f"blip.base_model.model.language_projection.{w}" for w in ("weight", "bias")),
            extra_fragment=".language_projection.",
            refused_extra=(
                "projector",
                r"^extra_trainable \['projector'\] unknown; choose from \('language_projection', 'query_tokens'\)$",
            ),
            segment_embeddings=True,
        ),
        FamilyCase(
            name="qwen2_5_vl",
            inputs_extra=qwen_one_picture_turn,
            attention_module="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
            projector_lora=("model.visual.merger.mlp.0", "model.visual.merger.mlp.2"),
            lora_count=3 + 2 + 8,
            extra_weights=("vlm.base_model.model.model.visual.merger.mlp.0.base_layer.weight",),
            user_folder=written_from_the_synthetic_set,
            refused_as=("instructblip", "qwen3_vl"),
            **QWEN,
        ),
        FamilyCase(
            name="llava_onevision",
            chat_text=CHAT_ML_NEWLINES,
            image_text="<image>" * 65,  # 8×8 patches + image_newline
            image_tokens=65,
            pixel_keys=("pixel_values", "image_sizes", "batch_num_images"),
            pixel_shape=(4, 1, 3, S, S),  # images in text order, one crop each
            inputs_extra=llava_chat_path,
            # the layer the projector reads: vision_feature_layer -1 (the last) and -2
            fac_variants=(FacVariant((), 2), FacVariant((("vision_feature_layer", -2),), 1)),
            extra_weights=("vlm.base_model.model.model.multi_modal_projector.linear_1.base_layer.weight",),
            user_model_check=llava_image_text,
            **TWO_LINEARS,
        ),
        FamilyCase(
            name="smolvlm",
            chat_text="<|im_start|>User:{image}{image}{prompt}<end_of_utterance>\nAssistant:",
            image_text="<fake_token_around_image><global-img>" + "<image>" * 16 + "<fake_token_around_image>",
            pixel_keys=("pixel_values", "pixel_attention_mask"),  # 16 tokens: 8×8 patches, 2×2 pixel shuffle
            pixel_shape=(2, 2, 3, S, S),
            processor_kwargs=(("do_image_splitting", False),),
            attention_module="transformers.models.smolvlm.modeling_smolvlm",
            vision_layers="model.vision_model.encoder.layers",
            llm_layers="model.text_model.layers",
            projector_lora=("model.connector.modality_projection.proj",),
            lora_count=9 + 1 + 8,
            extra_weights=("vlm.base_model.model.model.connector.modality_projection.proj.base_layer.weight",),
            extra_fragment=".connector.",
        ),
        FamilyCase(
            name="qwen3_vl",
            inputs_extra=qwen_grids,
            attention_module="transformers.models.qwen3_vl.modeling_qwen3_vl",
            fac_extra=qwen3_not_deepstack,
            projector_lora=tuple(
                f"model.visual.{merger}.{linear}"
                for merger in ("merger", "deepstack_merger_list.0", "deepstack_merger_list.1")
                for linear in ("linear_fc1", "linear_fc2")
            ),
            lora_count=3 + 6 + 8,
            extra_weights=("vlm.base_model.model.model.visual.merger.linear_fc1.base_layer.weight",),
            extra_parts=("deepstack_projectors", "projector"),
            user_folder=written_chat_folder,
            **QWEN,
        ),
        FamilyCase(
            name="internvl",
            chat_text=CHAT_ML_NEWLINES,
            image_text="<img>" + "<IMG_CONTEXT>" * 16 + "</img>",
            processor_kwargs=(("crop_to_patches", False),),  # one tile per picture, row by row, before first
            inputs_extra=internvl_tiler,
            attention_module="transformers.models.internvl.modeling_internvl",
            vision_layers="model.vision_tower.encoder.layer",
            attention="attention",
            eager_map=patch_queries_received,
            eager_shapes=((4, 4, 65, 65),),  # [CLS] + 8×8 patches
            # vision_feature_layer -1 (the last) and 2 (hidden state 2: the output of layer 1 of 3)
            fac_variants=(FacVariant((), 2), FacVariant((("vision_feature_layer", 2),), 1)),
            prepare_fac=sharpen,
            fac_extra=internvl_patch_queries,
            extra_weights=("vlm.base_model.model.model.multi_modal_projector.layer_norm.weight",),
            user_model_check=internvl_image_tokens,
            **TWO_LINEARS,
        ),
        FamilyCase(
            name="gemma3",
            grid=(16, 16),  # the unpooled SigLIP grid: 16×16 patches of 4 px, pooled 4×4 → 16 soft tokens
            chat_text="<s><start_of_turn>user\n{image}{image}{prompt}<end_of_turn>\n<start_of_turn>model\n",
            image_text="\n\n<start_of_image>" + "<image_soft_token>" * 16 + "<end_of_image>\n\n",
            processor_kwargs=(("add_special_tokens", False),),  # the template writes the <bos>
            inputs_extra=gemma_one_bos,
            eager_shapes=((4, 4, 256, 256),),
            fac_perturb="lora_B|mm_input_projection_weight",  # Gemma 3 starts its projector at zero:
            caption_reaches_vision=False,  # no gradient reaches the vision tower through it
            lora_count=9 + 8,  # the projector has no linear layer [D]
            summary_parts=("vision", "projector", "language_model", "all"),  # lm_head is the tied embedding
            frozen_parts=("projector",),
            exact_summary=(("projector", (0, 128 * 128 + 128)),),
            extra_weights=tuple(
                f"vlm.base_model.model.model.multi_modal_projector.{w}"
                for w in ("mm_input_projection_weight", "mm_soft_emb_norm.weight")
            ),
            extra_fragment=".multi_modal_projector.",
            extra_summary=(128 * 128 + 128,) * 2,
            refused_as=("smolvlm",),
        ),
    )
}
