"""What every model family must do, on its tiny random-weight preset: InstructBLIP and the six chat families
through the same tests, one row each of tests/family_cases.py saying where the family differs.

1. the token ids and pixels the model builds are the family processor's own;
2. the FAC hook's map is the eager attention's probabilities of the layer FAC reads (≤ 1e-6), and the SDPA model
   with the same weights gives the same map;
3. LoRA sits where the family says, only LoRA trains by default, and ``extra_trainable`` trains its part in full;
4. a forward with masks gives finite losses and maps that sum to 1, FAC alone reaches the vision LoRA of the layer
   it reads, and generate returns captions and the maps of an eval forward;
5. a saved preset model comes back with identical logits; 6. a model on a user's folder saves only its adapter
   and comes back with identical logits; 7. a folder of the family is refused as another family.

What only one family does (preset sizes, the Qwen ViTs' patch orders, Gemma's token types, …) stays in
tests/test_family_<name>.py; the command path of every chat family is tests/test_family_commands.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))

from family_cases import CAPTIONS, CASES, LLM_LAYERS, S, build, eager_attention, logits, pair_batch, perturb  # noqa: E402
from family_fixtures import TOKENIZER_CLASSES  # noqa: E402

from davir.errors import DataError  # noqa: E402
from davir.models.families import get_family  # noqa: E402
from davir.models.vlm.build import build_davir_model, load_davir_model  # noqa: E402
from davir.models.vlm.config import DavirModelConfig  # noqa: E402
from davir.models.vlm.epc import EpcConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
VISION_LAYERS = 3  # every tiny preset's


def lora_layout(names) -> set[str]:
    """LoRA module names with the layer numbers left out."""
    return {re.sub(r"\.\d+\.", ".N.", name) for name in names}


def lora_modules(model) -> list[str]:
    return [
        name.removeprefix("base_model.model.") for name, _ in model.wrapped().named_modules() if name.endswith("lora_A")
    ]


@pytest.fixture(scope="module", params=list(CASES), ids=str)
def case(request):
    return CASES[request.param]


@pytest.fixture(scope="module")
def model(case):
    return build(case.name)


@pytest.fixture(scope="module")
def batch(model):
    return pair_batch(model)


@pytest.fixture(scope="module")
def user_folder(case, tmp_path_factory, request) -> Path:
    """A user's folder of the family: its model's and its processor's ``save_pretrained``, side by side."""
    return case.user_folder(case.name, tmp_path_factory.mktemp(f"{case.name}_user"), request)


@pytest.fixture(scope="module")
def user_model(case, user_folder):
    """The family's DAVIR model on that folder."""
    return build_davir_model(DavirModelConfig(family=case.name, pretrained=str(user_folder), image_size=S))


# ------------------------------------------------------------------------------------------- images and prompt
def test_ids_and_pixels_equal_the_processor(case, model, batch, request):
    """Our token ids (and token types) and image inputs for a batch of two pairs are exactly the family
    processor's own on the S×S pictures; the chat turn has the family's layout."""
    if case.inputs_from_user_folder:  # the family's real tokenizer class
        model = request.getfixturevalue("user_model")
        assert type(model.tokenizer).__name__ == TOKENIZER_CLASSES[case.name]
        batch = pair_batch(model)
    prompts = batch[2]
    assert prompts[0] == f"{EpcConfig().prompt} Entity: small red metal cube."
    case.check_inputs(case, model, batch)
    if case.chat_text is not None:
        assert model.chat_text(prompts[0]) == case.chat_text.format(image=case.image_text, prompt=prompts[0])
    assert model.patch_grid == case.grid and model.image_size == S


# ------------------------------------------------------------------------------------------------------- FAC
def check_fac_hook(case, variant, sdpa) -> None:
    """The hook's map (LoRA included) is the eager attention's probabilities in the vision layer FAC reads, as the
    family turns them into a patch map (≤ 1e-6), and no other layer's; without the adapters the map differs; the
    SDPA model ``sdpa`` (of the same preset and overrides) with the same weights runs no eager vision attention
    and gives the same map."""
    overrides = {"preset_overrides": dict(variant.overrides)} if variant.overrides else {}
    eager = build(case.name, attn_implementation="eager", **overrides).eval()  # eval: no LoRA dropout
    perturb(eager, pattern=case.fac_perturb)
    if case.prepare_fac is not None:
        case.prepare_fac(eager, variant.layer)
    batch = pair_batch(eager)
    with eager_attention(case, eager) as calls:
        output = eager(*batch)
    assert sorted(calls) == list(range(VISION_LAYERS)) == list(range(len(case.attentions(eager.core))))
    assert [tuple(weights.shape) for weights in calls[variant.layer]] == list(case.eager_shapes)
    maps = {layer: case.eager_map(eager, weights) for layer, weights in calls.items()}
    expected = maps[variant.layer]
    assert expected.shape == (2, 2, *case.grid)  # (pair, before/after, Hp, Wp)
    assert torch.allclose(output.attention_before, expected[:, 0], atol=1e-6, rtol=0)
    assert torch.allclose(output.attention_after, expected[:, 1], atol=1e-6, rtol=0)
    if case.map_sums_to_one:
        assert torch.allclose(output.attention_before.sum(dim=(1, 2)), torch.ones(2), atol=1e-5)
    for layer, other in maps.items():  # it reads that layer, not another (window blocks give no map)
        assert layer == variant.layer or other is None or not torch.allclose(other, expected, atol=1e-4), layer
    if case.fac_extra is not None:
        case.fac_extra(eager, calls, variant.layer)
    with torch.no_grad(), eager.wrapped().disable_adapter():
        plain = eager(*batch)
    assert (plain.attention_before - output.attention_before).abs().max() > 1e-4  # the hook sees the adapters

    own = {name: value.clone() for name, value in sdpa.state_dict().items()}
    training = sdpa.training
    sdpa.load_state_dict(eager.state_dict())
    try:
        with eager_attention(case, sdpa) as none, torch.no_grad():
            again = sdpa.eval()(*batch)
    finally:
        sdpa.load_state_dict(own)
        sdpa.train(training)
    assert none == {} and sdpa.config.attn_implementation == "sdpa"
    assert torch.allclose(again.attention_before, output.attention_before, atol=1e-6, rtol=0)
    assert torch.allclose(again.attention_after, output.attention_after, atol=1e-6, rtol=0)


def test_fac_hook_equals_the_eager_attention(case, model):
    """(check_fac_hook) The layer FAC reads by default; the SDPA model is the module's, its weights lent."""
    check_fac_hook(case, case.fac_variants[0], model)


@pytest.mark.parametrize(
    ("name", "variant"),
    [(name, variant) for name, case in CASES.items() for variant in case.fac_variants[1:]],
    ids=lambda value: str(value),
)
def test_fac_reads_the_layer_the_projector_reads(name, variant):
    """(check_fac_hook) Another vision_feature_layer moves the hook to that layer."""
    case = CASES[name]
    check_fac_hook(case, variant, build(name, preset_overrides=dict(variant.overrides)))


# ------------------------------------------------------------------------------------------------------ LoRA
def test_lora_sits_where_the_family_says_and_only_it_trains(case, model):
    names = lora_modules(model)
    assert sorted(names) == sorted(case.lora_modules(VISION_LAYERS)) and len(names) == case.lora_count
    assert len(case.attentions(model.core)) == VISION_LAYERS
    trainable = {name: parameter.numel() for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    summary = model.trainable_parameter_summary()
    assert set(summary) == set(case.summary_parts) and summary["all"][0] == sum(trainable.values())
    for part in case.summary_parts:
        assert (summary[part][0] == 0) == (part in case.frozen_parts), part
    for part, counts in case.exact_summary:
        assert summary[part] == counts, part

    extra = build(case.name, extra_trainable=(case.extra_part,))
    trainable = {name for name, parameter in extra.named_parameters() if parameter.requires_grad}
    assert set(case.extra_weights) <= trainable
    assert all("lora_" in name or case.extra_fragment in name for name in trainable)
    part = [name for name, _ in extra.named_parameters() if case.extra_fragment in name]
    assert part and set(part) <= trainable  # in full
    if case.extra_summary is not None:
        assert extra.trainable_parameter_summary()[case.extra_part] == case.extra_summary
    part, message = case.extra_refusal()
    with pytest.raises(ValueError, match=message):
        DavirModelConfig(family=case.name, extra_trainable=(part,))
    if not case.segment_embeddings:
        with pytest.raises(ValueError, match=rf"segment_embeddings are InstructBLIP's; model\.family={case.name} "):
            DavirModelConfig(family=case.name, segment_embeddings=True)


# ---------------------------------------------------------------------------------------- forward and generate
def test_forward_with_masks_trains_the_vision_lora_and_generate_returns_maps(case, model, batch):
    before, after, prompts = batch
    masks = torch.zeros(2, S, S)
    masks[:, :32, :32] = 1.0
    model.zero_grad()
    output = model(before, after, prompts, captions=CAPTIONS[:2], masks_before=masks, masks_after=masks)
    assert torch.isfinite(output.loss) and torch.isfinite(output.caption_loss)
    assert torch.isfinite(output.attn_loss) and output.fac_pairs == 2
    assert output.attention_before.shape == output.attention_after.shape == (2, *case.grid)
    if case.map_sums_to_one:
        assert torch.allclose(output.attention_before.sum(dim=(1, 2)), torch.ones(2), atol=1e-5)
    # FAC alone reaches the query LoRA of the layer it reads, and nothing of the LLM
    read = f"{case.vision_layers}.{case.fac_variants[0].layer}.{case.attention}.{case.query_projection}.lora_B"
    lora = {name: p for name, p in model.named_parameters() if read in name}
    llm = {name: p for name, p in model.named_parameters() if f"{case.llm_layers}." in name and "lora_" in name}
    assert len(lora) == 1 and len(llm) == 2 * 4 * LLM_LAYERS
    grads = torch.autograd.grad(output.attn_loss, [*lora.values(), *llm.values()], retain_graph=True, allow_unused=True)
    assert grads[0] is not None and grads[0].abs().sum() > 0
    assert all(grad is None or grad.abs().sum() == 0 for grad in grads[1:])
    output.loss.backward()
    vision = [p.grad for name, p in model.named_parameters() if f"{case.vision_layers}." in name and "lora_B" in name]
    assert len(vision) == VISION_LAYERS * len(case.vision_projections)
    if case.caption_reaches_vision:  # the total loss reaches every vision LoRA
        assert all(grad is not None and grad.abs().sum() > 0 for grad in vision)
    model.zero_grad()

    captions = model.generate(before, after, prompts, max_new_tokens=4)
    assert isinstance(captions, list) and len(captions) == 2 and all(isinstance(c, str) for c in captions)
    assert len(model.generate(before, after, prompts, max_new_tokens=3, num_beams=2)) == 2
    captions, maps_before, maps_after = model.generate(before, after, prompts, max_new_tokens=4, return_attention=True)
    assert maps_before.shape == maps_after.shape == (2, *case.grid)
    model.eval()
    with torch.no_grad():
        reference = model(before, after, prompts)
    model.train()
    assert torch.allclose(maps_before, reference.attention_before, atol=1e-6)
    assert torch.allclose(maps_after, reference.attention_after, atol=1e-6)


# --------------------------------------------------------------------------------------------- save and load
def test_preset_round_trip(case, model, batch, tmp_path):
    perturb(model, seed=3)
    model.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "adapter" / "adapter_model.safetensors").is_file()
    assert sorted(path.name for path in (tmp_path / "saved").iterdir()) == [
        "adapter",
        "architecture",
        "davir_config.json",
        "model.safetensors",  # the random base cannot be re-created otherwise
        "processor",
    ]
    again = load_davir_model(tmp_path / "saved")
    assert type(again).__name__ == case.davir_class and again.config.family == case.name
    assert again.config == model.config
    assert torch.equal(logits(again, batch), logits(model, batch))


def test_a_users_folder_round_trip_saves_only_the_adapter(case, user_folder, user_model, batch, tmp_path):
    model = user_model
    assert lora_layout(lora_modules(model)) == lora_layout(case.lora_modules(VISION_LAYERS))  # fewer layers maybe
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    perturb(model, seed=5)
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
    if case.user_model_check is not None:
        case.user_model_check(model, again)


def test_a_folder_of_the_family_is_refused_as_another(case, user_folder):
    mine = get_family(case.name).model_type
    for other in case.refused_as:
        message = rf"{re.escape(str(user_folder))} holds a '{mine}' model, not '{get_family(other).model_type}': "
        with pytest.raises(DataError, match=message + rf"model\.family={other} needs a {other} folder"):
            build_davir_model(DavirModelConfig(family=other, pretrained=str(user_folder)))
